//===- LossPlot.cpp - the loss curve as a PNG -----------------------------===//
//
// A small raster plot (axes, tick labels, legend) encoded as an RGB PNG:
// compressed and checksummed with zlib where the runtime is built with it,
// else stored deflate blocks with the checksums computed here.
//
//===----------------------------------------------------------------------===//

#include "moert/Train.h"

#include "Crc32.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#ifdef MOERT_HAVE_ZLIB
#include <zlib.h>
#endif

namespace moert {
//===----------------------------------------------------------------------===//

namespace {

/// 5x7 glyphs (bit 4 is the leftmost column) for the labels the plot uses.
struct Glyph {
  char c;
  unsigned char rows[7];
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'.', {0, 0, 0, 0, 0, 0x0C, 0x0C}},
    {'-', {0, 0, 0, 0x1F, 0, 0, 0}},
    {'a', {0, 0, 0x0E, 0x01, 0x0F, 0x11, 0x0F}},
    {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0, 0, 0x0E, 0x10, 0x10, 0x11, 0x0E}},
    {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0, 0, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
    {'g', {0, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
    {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0, 0x0C, 0x04, 0x04, 0x04, 0x0E}},
    {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0, 0, 0x1A, 0x15, 0x15, 0x11, 0x11}},
    {'n', {0, 0, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0, 0, 0x0E, 0x11, 0x11, 0x11, 0x0E}},
    {'p', {0, 0, 0x1E, 0x11, 0x1E, 0x10, 0x10}},
    {'r', {0, 0, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0, 0, 0x0E, 0x10, 0x0E, 0x01, 0x1E}},
    {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0, 0, 0x11, 0x11, 0x11, 0x13, 0x0D}},
};

struct Canvas {
  int w, h;
  std::vector<unsigned char> rgb;
  Canvas(int w, int h) : w(w), h(h), rgb(size_t(w) * h * 3, 255) {}
  void set(int x, int y, const unsigned char c[3]) {
    if (x < 0 || y < 0 || x >= w || y >= h)
      return;
    std::memcpy(&rgb[(size_t(y) * w + x) * 3], c, 3);
  }
  void line(double x0, double y0, double x1, double y1,
            const unsigned char c[3], int thick = 1, int dash = 0) {
    int steps = int(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int i = 0; i <= steps; ++i) {
      if (dash && (i / dash) % 2)
        continue;
      double t = double(i) / steps;
      int x = int(std::lround(x0 + t * (x1 - x0)));
      int y = int(std::lround(y0 + t * (y1 - y0)));
      for (int dx = 0; dx < thick; ++dx)
        for (int dy = 0; dy < thick; ++dy)
          set(x + dx - thick / 2, y + dy - thick / 2, c);
    }
  }
  void text(int x, int y, const std::string &s, const unsigned char c[3]) {
    for (char ch : s) {
      for (const Glyph &g : kFont)
        if (g.c == ch)
          for (int r = 0; r < 7; ++r)
            for (int col = 0; col < 5; ++col)
              if (g.rows[r] & (0x10 >> col))
                set(x + col, y + r, c);
      x += 6;
    }
  }
};

/// The CRC-32 of a PNG chunk (ISO 3309, as zlib's crc32).
uint32_t chunkCrc(const unsigned char *p, size_t n) {
  return crc32Update(0, p, n);
}

void put32(std::string &out, uint32_t v) {
  for (int i = 3; i >= 0; --i)
    out += char((v >> (8 * i)) & 0xFF);
}

void chunk(std::string &png, const char type[4], const std::string &data) {
  put32(png, uint32_t(data.size()));
  std::string body = std::string(type, 4) + data;
  png += body;
  put32(png, chunkCrc(reinterpret_cast<const unsigned char *>(body.data()),
                      body.size()));
}

/// The zlib stream of `raw`: compressed with zlib where the runtime was
/// built with it, else stored (uncompressed) deflate blocks.
std::string zlibStream(const std::string &raw) {
#ifdef MOERT_HAVE_ZLIB
  uLongf size = compressBound(uLong(raw.size()));
  std::string packed(size, '\0');
  if (compress2(reinterpret_cast<Bytef *>(&packed[0]), &size,
                reinterpret_cast<const Bytef *>(raw.data()), uLong(raw.size()),
                9) == Z_OK) {
    packed.resize(size);
    return packed;
  }
#endif
  std::string z = "\x78\x01";
  for (size_t off = 0; off < raw.size() || off == 0;) {
    size_t n = std::min<size_t>(65535, raw.size() - off);
    bool last = off + n == raw.size();
    z += char(last ? 1 : 0);
    z += char(n & 0xFF);
    z += char(n >> 8);
    z += char(~n & 0xFF);
    z += char((~n >> 8) & 0xFF);
    z.append(raw, off, n);
    off += n;
    if (last)
      break;
  }
  uint32_t a = 1, b = 0;
  for (unsigned char ch : raw) {
    a = (a + ch) % 65521;
    b = (b + a) % 65521;
  }
  put32(z, (b << 16) | a);
  return z;
}

/// The canvas as a PNG: RGB, 8 bits.
std::string encodePNG(const Canvas &c) {
  std::string raw;
  for (int y = 0; y < c.h; ++y) {
    raw += '\0'; // filter: none
    raw.append(reinterpret_cast<const char *>(&c.rgb[size_t(y) * c.w * 3]),
               size_t(c.w) * 3);
  }
  std::string z = zlibStream(raw);
  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put32(ihdr, uint32_t(c.w));
  put32(ihdr, uint32_t(c.h));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", "");
  return png;
}

std::string label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::abs(v) >= 100 ? "%.0f" : "%.2f", v);
  return buf;
}

} // namespace

bool writeLossPlot(const std::string &path,
                   const std::vector<std::pair<int64_t, double>> &train,
                   const std::vector<std::pair<int64_t, double>> &heldOut,
                   double reference, std::string &error) {
  const int W = 720, H = 440, left = 60, right = 20, top = 20, bottom = 60;
  Canvas c(W, H);
  const unsigned char black[3] = {0, 0, 0}, grey[3] = {150, 150, 150},
                      blue[3] = {31, 119, 180}, orange[3] = {230, 110, 20},
                      light[3] = {225, 225, 225};
  double x0 = 0, x1 = 1, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  auto extend = [&](const std::vector<std::pair<int64_t, double>> &pts) {
    for (auto &[s, v] : pts) {
      if (!std::isfinite(v))
        continue;
      x1 = std::max(x1, double(s));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  };
  extend(train);
  extend(heldOut);
  if (std::isfinite(reference)) {
    lo = std::min(lo, reference);
    hi = std::max(hi, reference);
  }
  if (!(lo <= hi)) {
    lo = 0;
    hi = 1;
  }
  double pad = std::max(1e-6, (hi - lo) * 0.05);
  lo -= pad;
  hi += pad;
  auto px = [&](double s) {
    return left + (s - x0) / (x1 - x0) * (W - left - right);
  };
  auto py = [&](double v) {
    return top + (hi - v) / (hi - lo) * (H - top - bottom);
  };
  // Grid, axes, ticks.
  for (int i = 0; i <= 5; ++i) {
    double v = lo + (hi - lo) * i / 5, s = x0 + (x1 - x0) * i / 5;
    c.line(left, py(v), W - right, py(v), light);
    c.text(4, int(py(v)) - 3, label(v), black);
    c.line(px(s), top, px(s), H - bottom, light);
    std::string sl = std::to_string(int64_t(std::lround(s)));
    c.text(int(px(s)) - 3 * int(sl.size()), H - bottom + 6, sl, black);
  }
  c.line(left, top, left, H - bottom, black);
  c.line(left, H - bottom, W - right, H - bottom, black);
  c.text(W / 2 - 12, H - bottom + 20, "step", black);
  if (std::isfinite(reference))
    c.line(left, py(reference), W - right, py(reference), grey, 1, 6);
  for (size_t i = 1; i < train.size(); ++i)
    c.line(px(double(train[i - 1].first)), py(train[i - 1].second),
           px(double(train[i].first)), py(train[i].second), blue);
  for (size_t i = 0; i < heldOut.size(); ++i) {
    if (i)
      c.line(px(double(heldOut[i - 1].first)), py(heldOut[i - 1].second),
             px(double(heldOut[i].first)), py(heldOut[i].second), orange, 2);
    for (int d = -3; d <= 3; ++d)
      c.line(px(double(heldOut[i].first)) + d, py(heldOut[i].second) - 3,
             px(double(heldOut[i].first)) + d, py(heldOut[i].second) + 3,
             orange);
  }
  // Legend.
  int ly = H - 22;
  c.line(left, ly + 3, left + 20, ly + 3, blue);
  c.text(left + 26, ly, "train loss", black);
  c.line(left + 110, ly + 3, left + 130, ly + 3, orange, 2);
  c.text(left + 136, ly, "held-out loss", black);
  if (std::isfinite(reference)) {
    c.line(left + 236, ly + 3, left + 256, ly + 3, grey, 1, 6);
    c.text(left + 262, ly, "unigram baseline", black);
  }
  return writeFileAtomically(path, encodePNG(c), error);
}

} // namespace moert
