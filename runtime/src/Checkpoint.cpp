//===- Checkpoint.cpp - a run's checkpoint: one file, or one per rank -----===//
//
// A run on one rank keeps its latest state in OUT/checkpoint.safetensors. A
// run on R expert-parallel ranks writes, per checkpoint, one file per rank,
// OUT/checkpoint-<step>-<r>-of-<R>.safetensors (rank r's rows of the expert
// tensors and of their moments; the first file also every replicated tensor
// and the routers' state), and then OUT/checkpoint.index.json naming the
// step and the files. The index is replaced (atomically) only once every
// rank's file is on disk, so it always names a complete checkpoint: a run
// killed while writing leaves the previous one readable.
//
// Reading merges the files: a tensor found in several of them is one tensor
// split along its first dimension, its parts in file order. So a checkpoint
// reads the same whatever number of ranks wrote it.
//
//===----------------------------------------------------------------------===//

#include "moert/Train.h"

#include "Crc32.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <functional>
#include <memory>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace moert {
namespace {

using Json = nlohmann::ordered_json;

std::string indexPath(const std::string &out) {
  return out + "/checkpoint.index.json";
}
std::string singlePath(const std::string &out) {
  return out + "/checkpoint.safetensors";
}

/// Whether `path` exists (a directory in its place is the reader's error).
bool exists(const std::string &path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

/// The step of a shard file name (checkpoint-<step>-<r>-of-<R>.safetensors),
/// or -1 for other names.
int64_t shardStep(const std::string &name) {
  long long step, r, n;
  char tail[32];
  if (std::sscanf(name.c_str(), "checkpoint-%8lld-%5lld-of-%5lld.%31s", &step,
                  &r, &n, tail) != 4 ||
      std::string(tail) != "safetensors" ||
      name.size() != std::strlen("checkpoint-00000000-00000-of-00000."
                                 "safetensors"))
    return -1;
  return step;
}

/// The step of a kept index name (checkpoint-<step>.index.json), or -1.
int64_t keptIndexStep(const std::string &name) {
  long long step;
  char tail[32];
  if (std::sscanf(name.c_str(), "checkpoint-%8lld.%31s", &step, tail) != 2 ||
      std::string(tail) != "index.json" ||
      name.size() != std::strlen("checkpoint-00000000.index.json"))
    return -1;
  return step;
}

/// The step an index names; -1 if it cannot be read.
int64_t indexStep(const std::string &path) {
  try {
    Json index = Json::parse(readWholeFile(path));
    if (index.is_object() && index.contains("step") &&
        index["step"].is_number_unsigned())
      return int64_t(index["step"].get<uint64_t>());
  } catch (const Json::exception &) {
  }
  return -1;
}

std::vector<std::string> listDirectory(const std::string &dir) {
  std::vector<std::string> names;
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d))
      names.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// Opens the safetensors file at `path` and reads its header: the entries,
/// the metadata and where the data start. Errors name the file.
std::unique_ptr<FILE, int (*)(FILE *)>
openSafetensors(const std::string &path, std::vector<SafetensorsEntry> &entries,
                std::map<std::string, std::string> &metadata,
                uint64_t &dataStart, std::string &error) {
  std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "rb"),
                                           std::fclose);
  auto fail = [&](const std::string &what) {
    error = path + ": " + what;
    f.reset();
    return std::move(f);
  };
  if (!f)
    return fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat info;
  if (::fstat(::fileno(f.get()), &info) != 0 || !S_ISREG(info.st_mode))
    return fail("not a regular file");
  uint64_t size = uint64_t(info.st_size), length = 0;
  unsigned char le[8];
  if (size < 8 || std::fread(le, 1, 8, f.get()) != 8)
    return fail("truncated: not even the header length");
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | le[i];
  if (length > size - 8)
    return fail("truncated or corrupt: the header claims " +
                std::to_string(length) + " bytes, the file has " +
                std::to_string(size - 8) + " after the length");
  std::string header(length, '\0');
  if (std::fread(header.data(), 1, length, f.get()) != length)
    return fail("cannot read the header");
  std::string what;
  if (!parseSafetensorsHeader(header.data(), length, size - 8 - length, entries,
                              metadata, what))
    return fail(what);
  dataStart = 8 + length;
  return f;
}

/// The step in a checkpoint file's metadata; -1 if it cannot be read.
int64_t singleStep(const std::string &path) {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t dataStart = 0;
  std::string error;
  if (!openSafetensors(path, entries, metadata, dataStart, error))
    return -1;
  char *end = nullptr;
  long long step = std::strtoll(metadata["step"].c_str(), &end, 10);
  return metadata["step"].empty() || *end ? -1 : step;
}

/// Reads rows [first, last) of the first dimension of each tensor of the
/// file at `path` (`keep(name, rows)`; all rows: {0, rows}), streaming the
/// data in pieces: the tensors come back with the file's shapes and only
/// the kept rows' values. With `verify`, every byte of the data is read
/// and checked against the CRC-32 in the metadata.
bool readRows(const std::string &path, bool verify,
              const std::function<std::pair<int64_t, int64_t>(
                  const std::string &, int64_t)> &keep,
              std::vector<NamedTensor> &tensors,
              std::map<std::string, std::string> &metadata,
              std::string &error) {
  auto fail = [&](const std::string &what) {
    error = path + ": " + what;
    return false;
  };
  std::vector<SafetensorsEntry> entries;
  uint64_t dataStart = 0;
  auto f = openSafetensors(path, entries, metadata, dataStart, error);
  if (!f)
    return false;
  tensors.clear();
  // A file none of whose rows are kept is not read (nor checked).
  bool any = false;
  std::vector<std::pair<int64_t, int64_t>> kept;
  for (const SafetensorsEntry &e : entries) {
    int64_t rows = e.shape.empty() ? 1 : e.shape[0];
    auto [first, last] = keep(e.name, rows);
    first = std::clamp<int64_t>(first, 0, rows);
    last = std::clamp<int64_t>(last, first, rows);
    kept.push_back({first, last});
    any |= last > first;
  }
  verify &= any;
  uint32_t crc = 0;
  std::vector<char> piece(size_t(1) << 24);
  for (size_t k = 0; k < entries.size(); ++k) {
    const SafetensorsEntry &e = entries[k];
    if (e.dtype != "F32")
      return fail("tensor '" + e.name + "' is " + e.dtype + ", expected F32");
    int64_t rows = e.shape.empty() ? 1 : e.shape[0];
    auto [first, last] = kept[k];
    uint64_t rowBytes = rows ? (e.end - e.begin) / uint64_t(rows) : 0;
    uint64_t from = e.begin + rowBytes * uint64_t(first),
             to = e.begin + rowBytes * uint64_t(last);
    NamedTensor t{e.name, e.shape, {}};
    t.data.resize(size_t((to - from) / 4));
    // The kept bytes, or every byte of the tensor when checking the CRC.
    uint64_t at = verify ? e.begin : from, end = verify ? e.end : to;
    if (::fseeko(f.get(), off_t(dataStart + at), SEEK_SET) != 0)
      return fail("cannot read tensor '" + e.name + "'");
    while (at < end) {
      size_t n = size_t(std::min<uint64_t>(piece.size(), end - at));
      if (std::fread(piece.data(), 1, n, f.get()) != n)
        return fail("cannot read tensor '" + e.name + "'");
      if (verify)
        crc = crc32Update(crc, piece.data(), n);
      uint64_t lo = std::max(at, from), hi = std::min(at + n, to);
      if (lo < hi)
        std::memcpy(reinterpret_cast<char *>(t.data.data()) + (lo - from),
                    piece.data() + (lo - at), size_t(hi - lo));
      at += n;
    }
    tensors.push_back(std::move(t));
  }
  if (verify && metadata.count("data_crc32") &&
      std::to_string(crc) != metadata["data_crc32"])
    return fail("the data do not match the checksum they were written with "
                "(a corrupt checkpoint; --no-checksum resumes anyway)");
  return true;
}

} // namespace

std::string checkpointShardPath(const std::string &out, int64_t step, int rank,
                                int ranks) {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%08lld-%05d-of-%05d.safetensors",
                (long long)step, rank + 1, ranks);
  return out + "/" + name;
}

std::string findCheckpoint(const std::string &out) {
  bool hasSingle = exists(singlePath(out)), hasIndex = exists(indexPath(out));
  // Both: a run killed between writing one and removing the other; the
  // later step wins (a file that cannot be read loses, and reports itself
  // when it is the only one).
  if (hasSingle && hasIndex)
    return indexStep(indexPath(out)) > singleStep(singlePath(out))
               ? indexPath(out)
               : singlePath(out);
  return hasIndex ? indexPath(out) : hasSingle ? singlePath(out) : "";
}

bool readCheckpoint(const std::string &path, bool verifyChecksum,
                    std::vector<NamedTensor> &tensors,
                    std::map<std::string, std::string> &metadata,
                    std::string &error, const RowsOf &rowsOf) {
  tensors.clear();
  metadata.clear();
  // Rows of a file's tensor kept, given the rows of that tensor in the
  // files before it.
  std::map<std::string, int64_t> rowsBefore;
  auto keep = [&](const std::string &name, int64_t rows) {
    auto [lo, hi] = rowsOf ? rowsOf(name) : std::pair<int64_t, int64_t>{0, -1};
    int64_t before = rowsBefore[name];
    rowsBefore[name] += rows;
    if (hi < 0)
      return std::pair<int64_t, int64_t>{0, rows};
    return std::pair<int64_t, int64_t>{lo - before, hi - before};
  };
  auto readFile = [&](const std::string &file, std::vector<NamedTensor> &out,
                      std::map<std::string, std::string> &meta) {
    return readRows(file, verifyChecksum, keep, out, meta, error);
  };
  if (path.size() < 11 || path.compare(path.size() - 11, 11, ".index.json"))
    return readFile(path, tensors, metadata);

  // The index: {"format", "step", "files"}.
  if (FILE *f = std::fopen(path.c_str(), "r"))
    std::fclose(f);
  else {
    error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  Json index;
  try {
    index = Json::parse(readWholeFile(path));
  } catch (const Json::exception &e) {
    error = path + ": not JSON (" + e.what() + ")";
    return false;
  }
  if (!index.is_object() || !index.contains("format") ||
      index["format"] != "moe-train-index/1" || !index.contains("step") ||
      !index["step"].is_number_unsigned() || !index.contains("files") ||
      !index["files"].is_array() || index["files"].empty()) {
    error = path + ": not a moe-train checkpoint index ({\"format\": "
                   "\"moe-train-index/1\", \"step\", \"files\"})";
    return false;
  }
  std::string step = std::to_string(index["step"].get<uint64_t>());
  std::string dir = path.substr(0, path.rfind('/') + 1);
  std::map<std::string, size_t> where; // a tensor's place in `tensors`
  const size_t count = index["files"].size();
  std::set<std::string> named;
  for (size_t k = 0; k < count; ++k) {
    const Json &file = index["files"][k];
    if (!file.is_string() || file.get<std::string>().empty() ||
        file.get<std::string>().find('/') != std::string::npos ||
        !named.insert(file.get<std::string>()).second) {
      error = path + ": 'files' holds names of distinct files beside the "
                     "index";
      return false;
    }
    std::string part = dir + file.get<std::string>();
    std::vector<NamedTensor> partTensors;
    std::map<std::string, std::string> partMeta;
    if (!readFile(part, partTensors, partMeta))
      return false;
    if (partMeta["step"] != step) {
      error = part + ": holds step '" + partMeta["step"] + "', its index " +
              path + " step " + step + " (files of another checkpoint)";
      return false;
    }
    // The ranks' files in rank order: rows in another order would be
    // other experts.
    std::string shard = std::to_string(k + 1) + " of " + std::to_string(count);
    if (count > 1 && partMeta["shard"] != shard) {
      error = part + ": is shard '" + partMeta["shard"] + "', its place in " +
              path + " says " + shard;
      return false;
    }
    partMeta.erase("data_crc32");
    partMeta.erase("shard");
    if (metadata.empty())
      metadata = partMeta;
    for (NamedTensor &x : partTensors) {
      auto [it, fresh] = where.try_emplace(x.name, tensors.size());
      if (fresh) {
        tensors.push_back(std::move(x));
        continue;
      }
      // Another part of a tensor split along its first dimension.
      NamedTensor &whole = tensors[it->second];
      if (whole.shape.empty() || whole.shape.size() != x.shape.size() ||
          !std::equal(whole.shape.begin() + 1, whole.shape.end(),
                      x.shape.begin() + 1)) {
        error = part + ": tensor '" + x.name +
                "' is not a part of the one in the files before it (other "
                "dimensions than the first differ)";
        return false;
      }
      whole.shape[0] += x.shape[0];
      whole.data.insert(whole.data.end(), x.data.begin(), x.data.end());
    }
  }
  return true;
}

bool writeCheckpointIndex(const std::string &out, int64_t step, int ranks,
                          int64_t keep, std::string &error) {
  Json files = Json::array();
  for (int r = 0; r < ranks; ++r) {
    std::string shard = checkpointShardPath(out, step, r, ranks);
    // Every rank said it wrote its file; this one must see them all.
    if (!exists(shard)) {
      error = "cannot see " + shard + " (rank " + std::to_string(r) +
              " wrote it): --out must be a directory every rank sees";
      return false;
    }
    files.push_back(shard.substr(shard.rfind('/') + 1));
  }
  Json index = {{"format", "moe-train-index/1"},
                {"step", uint64_t(step)},
                {"files", files}};
  if (!writeFileAtomically(indexPath(out), index.dump(2) + "\n", error))
    return false;
  // Steps whose files stay: this one and, with keep > 1, those of the last
  // keep - 1 kept indices before it.
  std::set<int64_t> kept = {step};
  if (keep <= 1) {
    // The latest only: indices an earlier run kept go with their files.
    for (const std::string &n : listDirectory(out))
      if (keptIndexStep(n) >= 0)
        ::unlink((out + "/" + n).c_str());
  } else {
    char name[64];
    std::snprintf(name, sizeof name, "checkpoint-%08lld.index.json",
                  (long long)step);
    std::string numbered = out + "/" + name;
    ::unlink(numbered.c_str()); // (the same step written again)
    if (::link(indexPath(out).c_str(), numbered.c_str()) != 0) {
      error = "cannot keep " + numbered + ": " + std::strerror(errno);
      return false;
    }
    std::vector<int64_t> steps;
    for (const std::string &n : listDirectory(out))
      if (int64_t s = keptIndexStep(n); s >= 0)
        steps.push_back(s);
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i < steps.size(); ++i) {
      if (i + size_t(keep) < steps.size()) {
        std::snprintf(name, sizeof name, "checkpoint-%08lld.index.json",
                      (long long)steps[i]);
        ::unlink((out + "/" + name).c_str());
      } else {
        kept.insert(steps[i]);
      }
    }
  }
  // A one-rank checkpoint of the same run is older than this one.
  ::unlink(singlePath(out).c_str());
  for (const std::string &n : listDirectory(out))
    if (int64_t s = shardStep(n); s >= 0 && !kept.count(s))
      ::unlink((out + "/" + n).c_str());
  return true;
}

void removeAbandonedCheckpointTemporaries(const std::string &out) {
  for (const std::string &n : listDirectory(out)) {
    size_t tmp = n.find(".safetensors.tmp.");
    if (n.rfind("checkpoint", 0) == 0 && tmp != std::string::npos)
      removeAbandonedTemporaries(out + "/" + n.substr(0, tmp + 12));
    if (n.rfind("checkpoint", 0) == 0 &&
        n.find(".index.json.tmp.") != std::string::npos)
      removeAbandonedTemporaries(out + "/" + n.substr(0, n.find(".tmp.")));
  }
}

void retireShardedCheckpoint(const std::string &out) {
  if (!exists(indexPath(out)))
    return;
  ::unlink(indexPath(out).c_str());
  // Files that no kept index (--keep-checkpoints) names any more.
  std::set<int64_t> kept;
  for (const std::string &n : listDirectory(out))
    if (int64_t s = keptIndexStep(n); s >= 0)
      kept.insert(s);
  for (const std::string &n : listDirectory(out))
    if (int64_t s = shardStep(n); s >= 0 && !kept.count(s))
      ::unlink((out + "/" + n).c_str());
}

} // namespace moert
