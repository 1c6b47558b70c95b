//===- Train.cpp - optimizer, schedule, checkpoints, loss plot ------------===//

#include "moert/Train.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>
#ifdef MOERT_HAVE_ZLIB
#include <zlib.h>
#endif

namespace moert {

//===----------------------------------------------------------------------===//
// Optimizer and schedule
//===----------------------------------------------------------------------===//

namespace {
/// Runs fn(begin, end) over [0, n) in chunks of `chunk` elements on the
/// machine's cores. The chunks do not depend on the number of threads, so
/// per-chunk results combined in chunk order are the same on every machine.
void parallelChunks(int64_t n, int64_t chunk,
                    const std::function<void(int64_t, int64_t, int64_t)> &fn) {
  int64_t chunks = (n + chunk - 1) / chunk;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  if (chunks <= 1 || threads == 1) {
    for (int64_t c = 0; c < chunks; ++c)
      fn(c, c * chunk, std::min(n, (c + 1) * chunk));
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;)
      fn(c, c * chunk, std::min(n, (c + 1) * chunk));
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < std::min<int64_t>(threads, chunks); ++i)
    pool.emplace_back(work);
  work();
  for (std::thread &th : pool)
    th.join();
}
constexpr int64_t kChunk = 1 << 18;

void adamwRange(float *p, const float *g, float *m, float *v, int64_t begin,
                int64_t end, int64_t t, double lr, bool decay,
                const AdamWOptions &o) {
  const double c1 = 1.0 - std::pow(o.beta1, double(t));
  const double c2 = 1.0 - std::pow(o.beta2, double(t));
  const float b1 = float(o.beta1), b2 = float(o.beta2);
  const float stepSize = float(lr / c1);
  const float c2Sqrt = float(std::sqrt(c2));
  const float eps = float(o.eps);
  const float keep = decay ? float(1.0 - lr * o.weightDecay) : 1.0f;
  for (int64_t i = begin; i < end; ++i) {
    float gi = g[i];
    p[i] *= keep;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float denom = std::sqrt(v[i]) / c2Sqrt + eps;
    p[i] -= stepSize * (m[i] / denom);
  }
}
} // namespace

void adamwStep(float *p, const float *g, float *m, float *v, int64_t n,
               int64_t t, double lr, bool decay, const AdamWOptions &o) {
  // Elementwise: the same values whichever thread computes them.
  parallelChunks(n, kChunk, [&](int64_t, int64_t begin, int64_t end) {
    adamwRange(p, g, m, v, begin, end, t, lr, decay, o);
  });
}

double learningRate(int64_t step, int64_t warmup, int64_t total, double peak,
                    double minRatio) {
  if (warmup > 0 && step < warmup)
    return peak * double(step + 1) / double(warmup);
  if (step >= total)
    return peak * minRatio;
  double span = double(std::max<int64_t>(1, total - warmup));
  double progress = double(step - warmup) / span;
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * (minRatio + (1.0 - minRatio) * cosine);
}

double clipGradients(std::vector<std::pair<float *, int64_t>> &grads,
                     double maxNorm) {
  // Sums of fixed chunks, added in order: the same norm on any core count.
  double sum = 0;
  for (auto &[g, n] : grads) {
    std::vector<double> partial(size_t((n + kChunk - 1) / kChunk), 0.0);
    float *data = g;
    parallelChunks(n, kChunk, [&](int64_t c, int64_t begin, int64_t end) {
      double s = 0;
      for (int64_t i = begin; i < end; ++i)
        s += double(data[i]) * double(data[i]);
      partial[size_t(c)] = s;
    });
    for (double s : partial)
      sum += s;
  }
  double norm = std::sqrt(sum);
  if (maxNorm > 0 && norm > maxNorm && std::isfinite(norm)) {
    float scale = float(maxNorm / (norm + 1e-6));
    for (auto &[g, n] : grads) {
      float *data = g;
      parallelChunks(n, kChunk, [&](int64_t, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          data[i] *= scale;
      });
    }
  }
  return norm;
}

//===----------------------------------------------------------------------===//
// safetensors
//===----------------------------------------------------------------------===//

namespace {

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

/// A JSON value, as much of JSON as safetensors headers use.
struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0;
  bool boolean = false;
  std::string string;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json *get(const std::string &key) const {
    for (auto &[k, v] : members)
      if (k == key)
        return &v;
    return nullptr;
  }
};

struct JsonParser {
  const std::string &s;
  size_t i = 0;
  std::string error;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' ||
                            s[i] == '\t'))
      ++i;
  }
  bool fail(const std::string &what) {
    if (error.empty())
      error = what + " at byte " + std::to_string(i) + " of the header";
    return false;
  }
  bool parseString(std::string &out) {
    if (i >= s.size() || s[i] != '"')
      return fail("expected a string");
    ++i;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size())
        return fail("unterminated escape");
      char e = s[i++];
      switch (e) {
      case '"': case '\\': case '/': out += e; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        if (i + 4 > s.size())
          return fail("short \\u escape");
        unsigned code = unsigned(std::stoul(s.substr(i, 4), nullptr, 16));
        i += 4;
        if (code < 0x80) {
          out += char(code);
        } else if (code < 0x800) {
          out += char(0xC0 | (code >> 6));
          out += char(0x80 | (code & 0x3F));
        } else {
          out += char(0xE0 | (code >> 12));
          out += char(0x80 | ((code >> 6) & 0x3F));
          out += char(0x80 | (code & 0x3F));
        }
        break;
      }
      default:
        return fail("bad escape");
      }
    }
    if (i >= s.size())
      return fail("unterminated string");
    ++i;
    return true;
  }
  bool parse(Json &v, int depth = 0) {
    if (depth > 16)
      return fail("nesting too deep");
    ws();
    if (i >= s.size())
      return fail("unexpected end");
    char c = s[i];
    if (c == '{') {
      v.kind = Json::Object;
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') {
        ++i;
        return true;
      }
      while (true) {
        ws();
        std::string key;
        if (!parseString(key))
          return false;
        for (auto &m : v.members)
          if (m.first == key)
            return fail("duplicate key \"" + key + "\"");
        ws();
        if (i >= s.size() || s[i] != ':')
          return fail("expected ':'");
        ++i;
        Json member;
        if (!parse(member, depth + 1))
          return false;
        v.members.emplace_back(std::move(key), std::move(member));
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') {
          ++i;
          return true;
        }
        return fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') {
        ++i;
        return true;
      }
      while (true) {
        Json item;
        if (!parse(item, depth + 1))
          return false;
        v.items.push_back(std::move(item));
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') {
          ++i;
          return true;
        }
        return fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      return parseString(v.string);
    }
    if (s.compare(i, 4, "true") == 0 || s.compare(i, 5, "false") == 0) {
      v.kind = Json::Bool;
      v.boolean = s[i] == 't';
      i += v.boolean ? 4 : 5;
      return true;
    }
    if (s.compare(i, 4, "null") == 0) {
      i += 4;
      return true;
    }
    size_t start = i;
    while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '-' ||
                            s[i] == '+' || s[i] == '.' || s[i] == 'e' ||
                            s[i] == 'E'))
      ++i;
    if (start == i)
      return fail("unexpected character");
    v.kind = Json::Number;
    char *end = nullptr;
    std::string text = s.substr(start, i - start);
    v.number = std::strtod(text.c_str(), &end);
    if (!end || *end)
      return fail("bad number");
    return true;
  }
};

/// A non-negative integer JSON number that a double holds exactly.
bool asIndex(const Json &v, int64_t &out) {
  if (v.kind != Json::Number || v.number < 0 || v.number > 9007199254740992.0 ||
      v.number != std::floor(v.number))
    return false;
  out = int64_t(v.number);
  return true;
}

bool writeAll(int fd, const void *data, size_t size) {
  const char *p = static_cast<const char *>(data);
  while (size) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    p += n;
    size -= size_t(n);
  }
  return true;
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

} // namespace

bool writeSafetensors(const std::string &path,
                      const std::vector<NamedTensor> &tensors,
                      const std::map<std::string, std::string> &metadata,
                      std::string &error) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (auto &[k, v] : metadata) {
      header += (first ? "" : ",") + jsonString(k) + ":" + jsonString(v);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const NamedTensor &x = tensors[t];
    int64_t n = 1;
    for (int64_t d : x.shape)
      n *= d;
    if (uint64_t(n) != x.data.size()) {
      error = path + ": tensor '" + x.name + "' holds " +
              std::to_string(x.data.size()) + " values for a shape of " +
              std::to_string(n);
      return false;
    }
    header += (header.size() > 1 ? "," : "") + jsonString(x.name) +
              ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < x.shape.size(); ++i)
      header += (i ? "," : "") + std::to_string(x.shape[i]);
    uint64_t bytes = uint64_t(n) * 4;
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8)
    header += ' ';

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    error = "cannot write '" + tmp + "': " + std::strerror(errno);
    return false;
  }
  uint64_t length = header.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i)
    le[i] = (length >> (8 * i)) & 0xFF;
  bool ok = writeAll(fd, le, 8) && writeAll(fd, header.data(), header.size());
  for (const NamedTensor &x : tensors)
    ok = ok && writeAll(fd, x.data.data(), x.data.size() * 4);
  ok = ok && ::fsync(fd) == 0;
  int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok)
      saved = errno;
    error = "cannot write '" + path + "': " + std::strerror(saved);
    ::unlink(tmp.c_str());
    return false;
  }
  // The rename itself reaches the disk with the directory.
  int dir = ::open(directoryOf(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return true;
}

bool readSafetensors(const std::string &path, std::vector<NamedTensor> &tensors,
                     std::map<std::string, std::string> &metadata,
                     std::string &error) {
  auto fail = [&](const std::string &what) {
    error = path + ": " + what;
    return false;
  };
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return fail(std::string("cannot open: ") + std::strerror(errno));
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<char> bytes(size_t(std::max(size, 0L)));
  bool read = size >= 0 && std::fread(bytes.data(), 1, bytes.size(), f) ==
                               bytes.size();
  std::fclose(f);
  if (!read)
    return fail("cannot read the file");
  if (bytes.size() < 8)
    return fail("truncated: " + std::to_string(bytes.size()) +
                " bytes, not even the header length");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | (unsigned char)bytes[size_t(i)];
  if (length > bytes.size() - 8)
    return fail("truncated or corrupt: the header claims " +
                std::to_string(length) + " bytes, the file has " +
                std::to_string(bytes.size() - 8) + " after the length");
  std::string header(bytes.data() + 8, size_t(length));
  JsonParser parser{header, 0, {}};
  Json root;
  if (!parser.parse(root))
    return fail("corrupt header: " + parser.error);
  if (root.kind != Json::Object)
    return fail("corrupt header: not a JSON object");
  uint64_t dataSize = bytes.size() - 8 - length;
  const char *data = bytes.data() + 8 + length;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  tensors.clear();
  metadata.clear();
  for (auto &[name, v] : root.members) {
    if (name == "__metadata__") {
      if (v.kind != Json::Object)
        return fail("corrupt header: __metadata__ is not an object");
      for (auto &[k, m] : v.members) {
        if (m.kind != Json::String)
          return fail("corrupt header: metadata '" + k + "' is not a string");
        metadata[k] = m.string;
      }
      continue;
    }
    const Json *dtype = v.get("dtype"), *shape = v.get("shape"),
               *offsets = v.get("data_offsets");
    if (v.kind != Json::Object || !dtype || !shape || !offsets ||
        dtype->kind != Json::String || shape->kind != Json::Array ||
        offsets->kind != Json::Array || offsets->items.size() != 2)
      return fail("corrupt header: tensor '" + name +
                  "' lacks dtype, shape or data_offsets");
    if (dtype->string != "F32")
      return fail("tensor '" + name + "' is " + dtype->string +
                  ", expected F32");
    NamedTensor t;
    t.name = name;
    int64_t n = 1;
    for (const Json &d : shape->items) {
      int64_t dim;
      if (!asIndex(d, dim) || (dim && n > (int64_t(1) << 40) / dim))
        return fail("corrupt header: tensor '" + name + "' has a bad shape");
      t.shape.push_back(dim);
      n *= dim;
    }
    int64_t begin, end;
    if (!asIndex(offsets->items[0], begin) || !asIndex(offsets->items[1], end) ||
        end < begin || uint64_t(end) > dataSize)
      return fail("truncated or corrupt: tensor '" + name + "' lies outside "
                  "the file's " + std::to_string(dataSize) + " data bytes");
    if (end - begin != n * 4)
      return fail("corrupt header: tensor '" + name + "' has " +
                  std::to_string(end - begin) + " bytes for " +
                  std::to_string(n) + " f32 values");
    ranges.push_back({begin, end});
    t.data.resize(size_t(n));
    std::memcpy(t.data.data(), data + begin, size_t(n) * 4);
    tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      return fail("corrupt header: tensors overlap in the data");
  return true;
}

//===----------------------------------------------------------------------===//
// Loss plot (PNG)
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

uint32_t crc32(const unsigned char *p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k)
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put32(std::string &out, uint32_t v) {
  for (int i = 3; i >= 0; --i)
    out += char((v >> (8 * i)) & 0xFF);
}

void chunk(std::string &png, const char type[4], const std::string &data) {
  put32(png, uint32_t(data.size()));
  std::string body = std::string(type, 4) + data;
  png += body;
  put32(png, crc32(reinterpret_cast<const unsigned char *>(body.data()),
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
  double x0 = 0, x1 = 1, lo = std::numeric_limits<double>::infinity(),
         hi = -lo;
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
  std::string png = encodePNG(c);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE *f = std::fopen(tmp.c_str(), "wb");
  if (!f || std::fwrite(png.data(), 1, png.size(), f) != png.size() ||
      std::fclose(f) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = "cannot write '" + path + "': " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

} // namespace moert
