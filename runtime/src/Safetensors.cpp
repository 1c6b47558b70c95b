//===- Safetensors.cpp - checkpoints in the safetensors format ------------===//
//
// The format: an 8-byte little-endian header length, a JSON header (an
// object of tensors by name, each {"dtype", "shape", "data_offsets"}, and
// "__metadata__" with string values), then the data. The header goes
// through nlohmann/json; writes are atomic (a temporary file, fsync, rename,
// fsync of the directory), reads check every field against the file.
//
//===----------------------------------------------------------------------===//

#include "moert/Train.h"

#include "Crc32.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace moert {
namespace {

/// Members in the order they were written or read.
using Json = nlohmann::ordered_json;

/// A non-negative integer JSON number that a double holds exactly.
bool asIndex(const Json &v, int64_t &out) {
  constexpr double kMax = 9007199254740992.0; // 2^53
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (double(u) > kMax)
      return false;
    out = int64_t(u);
    return true;
  }
  if (!v.is_number())
    return false;
  double d = v.get<double>();
  if (d < 0 || d > kMax || d != std::floor(d))
    return false;
  out = int64_t(d);
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

/// Writes `path` through a temporary file in the same directory: `body`
/// writes the bytes to its descriptor, then fsync, rename over `path`, fsync
/// of the directory. On failure `path` is untouched.
template <typename Body>
bool writeAtomically(const std::string &path, Body &&body, std::string &error) {
  std::string tmp = temporaryPathFor(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    error = "cannot write '" + tmp + "': " + std::strerror(errno);
    return false;
  }
  bool ok = body(fd) && ::fsync(fd) == 0;
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

} // namespace

bool writeSafetensors(const std::string &path,
                      const std::vector<NamedTensor> &tensors,
                      const std::map<std::string, std::string> &metadata,
                      std::string &error) {
  std::vector<TensorSource> sources;
  for (const NamedTensor &x : tensors) {
    int64_t n = 1;
    for (int64_t d : x.shape)
      n *= d;
    if (uint64_t(n) != x.data.size()) {
      error = path + ": tensor '" + x.name + "' holds " +
              std::to_string(x.data.size()) + " values for a shape of " +
              std::to_string(n);
      return false;
    }
    sources.push_back({x.name, x.shape, [&x](float *to) {
                         std::memcpy(to, x.data.data(), x.data.size() * 4);
                       }});
  }
  return writeSafetensors(path, sources, metadata, "", error);
}

bool writeSafetensors(const std::string &path,
                      const std::vector<TensorSource> &tensors,
                      std::map<std::string, std::string> metadata,
                      const std::string &crcKey, std::string &error) {
  // The header: metadata first, then the tensors in their order
  // (ordered_json keeps it). With a CRC to record, a placeholder of its
  // widest decimal holds its place until the data have been written.
  uint64_t largest = 0;
  auto header = [&]() {
    Json root = Json::object();
    if (!metadata.empty()) {
      Json meta = Json::object();
      for (auto &[k, v] : metadata)
        meta[k] = v;
      root["__metadata__"] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const TensorSource &x : tensors) {
      uint64_t n = 1;
      for (int64_t d : x.shape)
        n *= uint64_t(d);
      largest = std::max(largest, n);
      root[x.name] = Json{{"dtype", "F32"},
                          {"shape", x.shape},
                          {"data_offsets", {offset, offset + 4 * n}}};
      offset += 4 * n;
    }
    // Compact, and names or values that are not UTF-8 written with U+FFFD
    // (the format's header is UTF-8 JSON).
    return root.dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  if (!crcKey.empty())
    metadata[crcKey] = "4294967295";
  std::string text = header();
  while (text.size() % 8)
    text += ' ';
  uint64_t length = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i)
    le[i] = (length >> (8 * i)) & 0xFF;
  return writeAtomically(
      path,
      [&](int fd) {
        bool ok = writeAll(fd, le, 8) && writeAll(fd, text.data(), text.size());
        // One tensor at a time through one buffer: the caller's data need
        // not be in host memory all at once.
        std::vector<float> buffer(static_cast<size_t>(largest));
        uint32_t crc = 0;
        for (const TensorSource &x : tensors) {
          if (!ok)
            break;
          size_t n = 1;
          for (int64_t d : x.shape)
            n *= size_t(d);
          x.fill(buffer.data());
          crc = crc32Update(crc, buffer.data(), n * 4);
          ok = writeAll(fd, buffer.data(), n * 4);
        }
        if (!ok || crcKey.empty())
          return ok;
        // The CRC in place of its placeholder: a header of the same length
        // (JSON allows the spaces that pad it).
        metadata[crcKey] = std::to_string(crc);
        std::string final = header();
        final.resize(text.size(), ' ');
        return ::pwrite(fd, final.data(), final.size(), 8) ==
               ssize_t(final.size());
      },
      error);
}

std::string readWholeFile(const std::string &path) {
  std::string text;
  if (FILE *f = std::fopen(path.c_str(), "rb")) {
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
      text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

bool writeFileAtomically(const std::string &path, const std::string &bytes,
                         std::string &error) {
  return writeAtomically(
      path, [&](int fd) { return writeAll(fd, bytes.data(), bytes.size()); },
      error);
}

std::string temporaryPathFor(const std::string &path) {
  return path + ".tmp." + std::to_string(::getpid());
}

void removeAbandonedTemporaries(const std::string &path) {
  std::string dir = directoryOf(path);
  std::string prefix = path.substr(path.rfind('/') + 1) + ".tmp.";
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return;
  while (struct dirent *entry = ::readdir(d)) {
    std::string name = entry->d_name;
    if (name.rfind(prefix, 0) != 0)
      continue;
    char *end = nullptr;
    long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (*end || pid <= 0)
      continue; // not one of ours
    if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH)
      ::unlink((dir + "/" + name).c_str());
  }
  ::closedir(d);
}

bool parseSafetensorsHeader(const char *header, uint64_t length,
                            uint64_t dataSize,
                            std::vector<SafetensorsEntry> &entries,
                            std::map<std::string, std::string> &metadata,
                            std::string &error) {
  auto fail = [&](const std::string &what) {
    error = what;
    return false;
  };
  Json root;
  try {
    root = Json::parse(header, header + length);
  } catch (const Json::exception &e) {
    // (A syntax error, or a number out of range: 1e400, 3e333333.)
    return fail(std::string("corrupt header: ") + e.what());
  }
  if (!root.is_object())
    return fail("corrupt header: not a JSON object");
  std::vector<std::pair<int64_t, int64_t>> ranges;
  entries.clear();
  metadata.clear();
  for (auto &[name, v] : root.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        return fail("corrupt header: __metadata__ is not an object");
      for (auto &[k, m] : v.items()) {
        if (!m.is_string())
          return fail("corrupt header: metadata '" + k + "' is not a string");
        metadata[k] = m.get<std::string>();
      }
      continue;
    }
    auto member = [&](const char *key) -> const Json * {
      auto it = v.is_object() ? v.find(key) : v.end();
      return it == v.end() ? nullptr : &*it;
    };
    const Json *dtype = member("dtype"), *shape = member("shape"),
               *offsets = member("data_offsets");
    if (!v.is_object() || !dtype || !shape || !offsets || !dtype->is_string() ||
        !shape->is_array() || !offsets->is_array() || offsets->size() != 2)
      return fail("corrupt header: tensor '" + name +
                  "' lacks dtype, shape or data_offsets");
    SafetensorsEntry t;
    t.name = name;
    t.dtype = dtype->get<std::string>();
    int64_t width = safetensorsDtypeBytes(t.dtype);
    if (!width)
      return fail("tensor '" + name + "' has the unknown dtype '" + t.dtype +
                  "'");
    int64_t n = 1;
    for (const Json &d : *shape) {
      int64_t dim;
      if (!asIndex(d, dim) || (dim && n > (int64_t(1) << 40) / dim))
        return fail("corrupt header: tensor '" + name + "' has a bad shape");
      t.shape.push_back(dim);
      n *= dim;
    }
    int64_t begin, end;
    if (!asIndex((*offsets)[0], begin) || !asIndex((*offsets)[1], end) ||
        end < begin || uint64_t(end) > dataSize)
      return fail("truncated or corrupt: tensor '" + name +
                  "' lies outside the file's " + std::to_string(dataSize) +
                  " data bytes");
    if (end - begin != n * width)
      return fail("corrupt header: tensor '" + name + "' has " +
                  std::to_string(end - begin) + " bytes for " +
                  std::to_string(n) + " " + t.dtype + " values");
    t.begin = uint64_t(begin);
    t.end = uint64_t(end);
    ranges.push_back({begin, end});
    entries.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      return fail("corrupt header: tensors overlap in the data");
  return true;
}

int64_t safetensorsDtypeBytes(const std::string &dtype) {
  static const std::map<std::string, int64_t> widths = {
      {"F64", 8},  {"F32", 4},     {"F16", 2},     {"BF16", 2},
      {"I64", 8},  {"I32", 4},     {"I16", 2},     {"I8", 1},
      {"U64", 8},  {"U32", 4},     {"U16", 2},     {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
  auto it = widths.find(dtype);
  return it == widths.end() ? 0 : it->second;
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
  // (A directory opens too, and reports an absurd size.)
  struct stat info;
  if (::fstat(::fileno(f), &info) != 0 || !S_ISREG(info.st_mode)) {
    std::fclose(f);
    return fail("not a regular file");
  }
  std::vector<char> bytes(size_t(info.st_size));
  bool read = std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
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
  std::vector<SafetensorsEntry> entries;
  std::string what;
  if (!parseSafetensorsHeader(bytes.data() + 8, length,
                              bytes.size() - 8 - length, entries, metadata,
                              what))
    return fail(what);
  const char *data = bytes.data() + 8 + length;
  tensors.clear();
  for (SafetensorsEntry &e : entries) {
    if (e.dtype != "F32")
      return fail("tensor '" + e.name + "' is " + e.dtype + ", expected F32");
    NamedTensor t;
    t.name = std::move(e.name);
    t.shape = std::move(e.shape);
    t.data.resize(size_t((e.end - e.begin) / 4));
    std::memcpy(t.data.data(), data + e.begin, e.end - e.begin);
    tensors.push_back(std::move(t));
  }
  return true;
}

} // namespace moert
