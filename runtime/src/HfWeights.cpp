//===- HfWeights.cpp - weights of a transformers model directory ----------===//
//
// Headers are read whole and checked (parseSafetensorsHeader); tensor data
// are read one tensor at a time with pread, so a model is never held twice.
//
//===----------------------------------------------------------------------===//

#include "moert/HfWeights.h"
#include "moert/Train.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>

namespace moert {
namespace {

using Json = nlohmann::json;

struct Shard {
  std::string path;
  int fd = -1;
  uint64_t dataStart = 0;
  std::map<std::string, SafetensorsEntry> entries;
  ~Shard() {
    if (fd >= 0)
      ::close(fd);
  }
};

bool readAt(int fd, void *dst, size_t size, uint64_t offset) {
  char *p = static_cast<char *>(dst);
  while (size) {
    ssize_t n = ::pread(fd, p, size, off_t(offset));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= size_t(n);
    offset += uint64_t(n);
  }
  return true;
}

bool openShard(Shard &s, std::string &error) {
  auto fail = [&](const std::string &what) {
    error = s.path + ": " + what;
    return false;
  };
  s.fd = ::open(s.path.c_str(), O_RDONLY);
  if (s.fd < 0)
    return fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat info;
  if (::fstat(s.fd, &info) != 0 || !S_ISREG(info.st_mode))
    return fail("not a regular file");
  uint64_t size = uint64_t(info.st_size);
  unsigned char le[8];
  if (size < 8 || !readAt(s.fd, le, 8, 0))
    return fail("truncated: not even the header length");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | le[i];
  if (length > size - 8 || length > (uint64_t(1) << 30))
    return fail("truncated or corrupt: the header claims " +
                std::to_string(length) + " bytes, the file has " +
                std::to_string(size - 8) + " after the length");
  std::string header(size_t(length), '\0');
  if (!readAt(s.fd, header.data(), header.size(), 8))
    return fail("cannot read the header");
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  std::string what;
  if (!parseSafetensorsHeader(header.data(), length, size - 8 - length, entries,
                              metadata, what))
    return fail(what);
  s.dataStart = 8 + length;
  for (SafetensorsEntry &e : entries)
    s.entries[e.name] = std::move(e);
  return true;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31, exponent = (h >> 10) & 0x1F,
           mantissa = h & 0x3FF;
  if (exponent == 0x1F) {
    uint32_t bits = sign | 0x7F800000u | (mantissa << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  float magnitude =
      exponent == 0 ? std::ldexp(float(mantissa), -24)
                    : std::ldexp(float(mantissa | 0x400), int(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

/// Converts `n` values of `dtype` at `src` to f32.
void toFloat(const std::string &dtype, const char *src, size_t n, float *dst) {
  for (size_t i = 0; i < n; ++i) {
    if (dtype == "F32") {
      std::memcpy(dst + i, src + 4 * i, 4);
    } else if (dtype == "BF16") {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      uint32_t bits = uint32_t(b) << 16;
      std::memcpy(dst + i, &bits, 4);
    } else if (dtype == "F16") {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      dst[i] = halfToFloat(b);
    } else { // F64
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      dst[i] = float(d);
    }
  }
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

bool readHfWeights(const std::string &dir,
                   const std::vector<ModelParam> &params,
                   std::vector<std::vector<float>> *values,
                   std::vector<std::string> &unused, std::string &error) {
  // --- the files: one, or the shards of the index ---
  std::vector<std::unique_ptr<Shard>> shards;
  std::map<std::string, Shard *> where; // tensor name -> its shard
  std::string indexPath = dir + "/model.safetensors.index.json";
  std::string single = dir + "/model.safetensors";
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    error = "'" + dir +
            "' is not a directory (a transformers model directory "
            "holds config.json and model.safetensors)";
    return false;
  }
  if (::stat(indexPath.c_str(), &st) == 0) {
    FILE *f = std::fopen(indexPath.c_str(), "rb");
    std::string text;
    if (f) {
      char buffer[65536];
      size_t n;
      while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0 &&
             text.size() < (size_t(1) << 28))
        text.append(buffer, n);
      std::fclose(f);
    }
    Json index;
    try {
      index = Json::parse(text);
    } catch (const Json::exception &e) {
      error = indexPath + ": not valid JSON: " + e.what();
      return false;
    }
    auto map = index.is_object() ? index.find("weight_map") : index.end();
    if (map == index.end() || !map->is_object()) {
      error = indexPath + ": no \"weight_map\" object";
      return false;
    }
    std::map<std::string, Shard *> byFile;
    for (auto &[name, file] : map->items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos) {
        error = indexPath + ": tensor '" + name +
                "' maps to no file name of this directory";
        return false;
      }
      std::string fileName = file.get<std::string>();
      Shard *&s = byFile[fileName];
      if (!s) {
        shards.push_back(std::make_unique<Shard>());
        s = shards.back().get();
        s->path = dir + "/" + fileName;
        if (!openShard(*s, error))
          return false;
      }
      if (!s->entries.count(name)) {
        error = indexPath + ": tensor '" + name + "' is not in " + s->path;
        return false;
      }
      where[name] = s;
    }
  } else if (::stat(single.c_str(), &st) == 0) {
    shards.push_back(std::make_unique<Shard>());
    shards.back()->path = single;
    if (!openShard(*shards.back(), error))
      return false;
    for (auto &[name, e] : shards.back()->entries)
      where[name] = shards.back().get();
  } else {
    error = dir + ": no model.safetensors or model.safetensors.index.json "
                  "(save the model with transformers' save_pretrained, which "
                  "writes safetensors)";
    return false;
  }

  // --- each parameter from one tensor, or from one per expert ---
  std::map<std::string, bool> used;
  auto find = [&](const std::string &name) -> const SafetensorsEntry * {
    auto it = where.find(name);
    return it == where.end() ? nullptr : &it->second->entries.at(name);
  };
  // Reads rows [first, last) of the first dimension of tensor `name` of
  // transformers shape `shape` (all of it: last -1) into `dst` (f32).
  auto read = [&](const std::string &name, const std::vector<int64_t> &shape,
                  float *dst, int64_t first = 0, int64_t last = -1) -> bool {
    const SafetensorsEntry *e = find(name);
    Shard *s = where[name];
    used[name] = true;
    if (e->shape != shape) {
      error = s->path + ": tensor '" + name + "' has shape " +
              shapeText(e->shape) + ", the model expects " + shapeText(shape) +
              " (a checkpoint of another config?)";
      return false;
    }
    if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16" &&
        e->dtype != "F64") {
      error = s->path + ": tensor '" + name + "' is " + e->dtype +
              "; weights are read from F32, BF16, F16 or F64 tensors";
      return false;
    }
    if (!dst)
      return true;
    uint64_t rowBytes = shape.empty() || shape[0] == 0
                            ? 0
                            : (e->end - e->begin) / uint64_t(shape[0]);
    if (last < 0)
      last = shape.empty() ? 1 : shape[0];
    uint64_t begin = shape.empty() ? e->begin : e->begin + rowBytes * first;
    std::vector<char> raw(shape.empty() ? size_t(e->end - e->begin)
                                        : size_t(rowBytes * (last - first)));
    if (!readAt(s->fd, raw.data(), raw.size(), s->dataStart + begin)) {
      error = s->path + ": cannot read tensor '" + name + "'";
      return false;
    }
    size_t n = raw.size() / size_t(safetensorsDtypeBytes(e->dtype));
    toFloat(e->dtype, raw.data(), n, dst);
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(dst[i])) {
        error = s->path + ": tensor '" + name + "' holds " +
                (std::isnan(dst[i]) ? "NaN" : "an infinity") + " at element " +
                std::to_string(i);
        return false;
      }
    return true;
  };

  if (values)
    values->assign(params.size(), {});
  for (size_t k = 0; k < params.size(); ++k) {
    const ModelParam &p = params[k];
    std::vector<int64_t> hf = p.shape; // transformers' shape
    if (p.hfTransposed)
      std::swap(hf[hf.size() - 1], hf[hf.size() - 2]);
    // The rows read (all, or a rank's experts).
    int64_t first = p.rowEnd < 0 ? 0 : p.rowBegin,
            last = p.rowEnd < 0 ? (hf.empty() ? 1 : hf[0]) : p.rowEnd;
    if (p.rowEnd >= 0 &&
        (hf.empty() || first < 0 || first >= last || last > hf[0])) {
      error = "rows [" + std::to_string(first) + ", " + std::to_string(last) +
              ") of parameter " + p.name + " asked for, of shape " +
              shapeText(hf);
      return false;
    }
    int64_t n = 1;
    for (int64_t d : hf)
      n *= d;
    if (!hf.empty() && hf[0] > 0)
      n = n / hf[0] * (last - first);
    std::vector<float> buffer(values ? size_t(n) : 0);
    float *dst = values ? buffer.data() : nullptr;
    bool gateUp = endsWith(p.name, "mlp.experts.gate_up_proj"),
         down = endsWith(p.name, "mlp.experts.down_proj");
    std::string prefix = p.name.substr(0, p.name.size() - (gateUp ? 12
                                                           : down ? 9
                                                                  : 0));
    if (find(p.name)) {
      if (!read(p.name, hf, dst, first, p.rowEnd < 0 ? -1 : last))
        return false;
    } else if ((gateUp || down) && hf.size() == 3 &&
               find(prefix + "0." + (gateUp ? "gate_proj" : "down_proj") +
                    ".weight")) {
      // One [out, in] tensor per expert and projection; gate_up_proj is
      // each expert's gate rows, then its up rows.
      int64_t experts = hf[0], rows = hf[1], cols = hf[2];
      int64_t part = gateUp ? rows / 2 : rows;
      for (int64_t e = 0; e < experts; ++e) {
        // Other ranks' experts: only checked to be there.
        bool mine = e >= first && e < last;
        for (const char *proj :
             gateUp ? std::vector<const char *>{"gate_proj", "up_proj"}
                    : std::vector<const char *>{"down_proj"}) {
          std::string name =
              prefix + std::to_string(e) + "." + proj + ".weight";
          if (!find(name)) {
            error = dir + ": no tensor '" + name + "' (the model has " +
                    std::to_string(experts) + " experts)";
            return false;
          }
          int64_t offset = (e - first) * rows * cols +
                           (std::string(proj) == "up_proj" ? part * cols : 0);
          if (!read(name, {part, cols}, dst && mine ? dst + offset : nullptr))
            return false;
        }
      }
    } else {
      error = dir + ": no tensor '" + p.name + "'" +
              (p.name == "lm_head.weight"
                   ? " (the checkpoint may tie it to the embedding: "
                     "'tie_word_embeddings' true in config.json)"
                   : "");
      return false;
    }
    if (!values)
      continue;
    if (p.hfTransposed) { // [.., rows, cols] -> [.., cols, rows]
      int64_t rows = hf[hf.size() - 2], cols = hf[hf.size() - 1];
      int64_t batch = n / std::max<int64_t>(1, rows * cols);
      std::vector<float> ours(buffer.size());
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            ours[size_t(b * rows * cols + c * rows + r)] =
                buffer[size_t(b * rows * cols + r * cols + c)];
      buffer.swap(ours);
    }
    (*values)[k] = std::move(buffer);
  }
  unused.clear();
  for (auto &[name, s] : where)
    if (!used.count(name))
      unused.push_back(name);
  return true;
}

} // namespace moert
