//===- CommProtocol.cpp - the exchange protocol the backends share --------===//
//
// What every backend does the same way: number the collectives (and inject
// the test faults), build and check the all_to_all header (the counts first,
// then the rows), plan where the rows go, convert bf16/f16, and count what
// moert_comm_stats reports.
//
//===----------------------------------------------------------------------===//

#include "CommProtocol.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace moert::comm {

const char *name(DType type) {
  switch (type) {
  case DType::F32:
    return "f32";
  case DType::F64:
    return "f64";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::I32:
    return "i32";
  case DType::I64:
    return "i64";
  }
  return "?";
}

size_t bytes(DType type) {
  switch (type) {
  case DType::F64:
  case DType::I64:
    return 8;
  case DType::BF16:
  case DType::F16:
    return 2;
  default:
    return 4;
  }
}

const char *name(Kind kind) {
  switch (kind) {
  case Kind::AllToAll:
    return "all_to_all";
  case Kind::AllReduce:
    return "all_reduce_sum";
  case Kind::Barrier:
    return "barrier";
  }
  return "?";
}

namespace {

/// An exchange that finished when it was started.
struct Completed final : Communicator::Pending {
  void wait() override {}
};

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) // Inf or NaN
    return uint16_t(sign | 0x7C00 | (absx > 0x7F800000 ? 0x200 : 0));
  if (absx >= 0x477FF000) // rounds to >= 65536: overflow to Inf
    return uint16_t(sign | 0x7C00);
  if (absx < 0x38800000) { // below the smallest normal half: subnormal
    // value * 2^24 rounded to an integer (nearest even).
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;   // exact: a power of two
    float r = std::nearbyint(scaled); // default rounding: nearest even
    return uint16_t(sign | uint32_t(r));
  }
  uint32_t mant = absx & 0x7FFFFF;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
    ++h; // may carry into the exponent: still right
  return uint16_t(sign | h);
}

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b |= sign;
    std::memcpy(&f, &b, 4);
    return f;
  }
  uint32_t b = exp == 31 ? (sign | 0x7F800000 | (mant << 13))
                         : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  std::memcpy(&f, &b, 4);
  return f;
}

struct Stats {
  std::mutex mu;
  moert_comm_stats s{};
};
Stats &stats() {
  static Stats *s = new Stats();
  return *s;
}

} // namespace

std::unique_ptr<Communicator::Pending> Communicator::allToAllVStart(
    const void *send, int64_t sendRows, const int32_t *sendCounts,
    int64_t slots, int64_t rowBytes, void *recv, int64_t recvCapacity,
    int32_t *recvCounts, const char *what, const RowLayout &layout) {
  allToAllV(send, sendRows, sendCounts, slots, rowBytes, recv, recvCapacity,
            recvCounts, what, layout);
  return std::make_unique<Completed>();
}

/// " (in the group of ranks a, b, c, whose ranks the message counts)" for a
/// group's communicator, "" for the job's.
static std::string groupNote(const Communicator &c) {
  if (c.members().empty())
    return "";
  std::string s = " (in the group of ranks ";
  for (size_t i = 0; i < c.members().size(); ++i)
    s += (i ? ", " : "") + std::to_string(c.members()[i]);
  return s + ", counted 0 to " + std::to_string(c.size() - 1) + " above)";
}

std::unique_ptr<Communicator::Pending>
Communicator::allReduceSumStart(const void *in, void *out, int64_t count,
                                DType type) {
  allReduceSum(in, out, count, type);
  return std::make_unique<Completed>();
}

void Communicator::fail(int status, const std::string &message) {
  if (failure_.empty()) {
    failure_ = message + groupNote(*this);
    abortCommunicator();
  }
  throw Error("rank " + std::to_string(jobRank()) + ": " + message +
                  groupNote(*this),
              status);
}

std::unique_ptr<Communicator> Communicator::split(int, int, int, int) {
  fail(1, std::string("the ") + backend() +
              " backend cannot form groups of ranks (data and expert "
              "parallelism together)");
}

std::string Sequence::enter(Communicator &comm, Kind kind, const char *what) {
  const int rank = comm.jobRank();
  if (!comm.failure().empty())
    throw Error("rank " + std::to_string(rank) + ": " + name(kind) +
                    ": the communicator failed earlier (" + comm.failure() +
                    ")",
                2);
  ++total;
  uint64_t n = ++perKind[int(kind)];
  std::string label = std::string(name(kind)) + " #" + std::to_string(n);
  if (what && *what)
    label += std::string(" (") + what + ")";
  static const int failRank = envInt("MOERT_TEST_FAIL_RANK");
  static const int stallRank = envInt("MOERT_TEST_STALL_RANK");
  static const int at = envInt("MOERT_TEST_FAULT_AT");
  // The hooks count the collectives of every communicator of the process.
  static std::atomic<uint64_t> processTotal{0};
  uint64_t nth = ++processTotal;
  if ((rank == failRank || rank == stallRank) &&
      nth == uint64_t(at < 0 ? 1 : at)) {
    std::fflush(stdout);
    if (rank == failRank) {
      std::fprintf(stderr,
                   "moert: rank %d: MOERT_TEST_FAIL_RANK: exiting at %s\n",
                   rank, label.c_str());
      std::fflush(stderr);
      // A test hook, not an error path: it simulates a crash (no
      // finalization, no exit handlers), so that the other ranks' fault
      // handling can be tested.
      ::_exit(3);
    }
    int seconds = envInt("MOERT_TEST_STALL_SECONDS");
    std::fprintf(stderr,
                 "moert: rank %d: MOERT_TEST_STALL_RANK: sleeping %d s at %s\n",
                 rank, seconds < 0 ? 3600 : seconds, label.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(
        std::chrono::seconds(seconds < 0 ? 3600 : seconds));
  }
  return label;
}

void checkHeader(Communicator &comm, const std::string &label, int peer,
                 const int64_t *h, uint64_t seqTotal, Kind kind) {
  if (h[0] == int64_t(seqTotal) && h[1] == int64_t(kind))
    return;
  const char *theirs = h[1] >= 1 && h[1] <= 3 ? name(Kind(h[1])) : "?";
  comm.fail(1, label + ": rank " + std::to_string(peer) +
                   " is at collective #" + std::to_string(h[0]) + " (" +
                   theirs + "), this rank at #" + std::to_string(seqTotal) +
                   " (" + name(kind) +
                   "): the ranks run different programs or call collectives "
                   "in different orders");
}

int64_t layoutWord(const RowLayout &layout) {
  return (layout.slotMajorSend ? 1 : 0) | (layout.slotMajorRecv ? 2 : 0) |
         (layout.padTo << 2);
}

std::vector<int64_t> allToAllHeaders(int size, uint64_t seqTotal,
                                     int64_t rowBytes, int64_t slots,
                                     const RowLayout &layout,
                                     const int32_t *sendCounts) {
  const int64_t words = kAllToAllHeaderWords + slots;
  std::vector<int64_t> out(size_t(size * words));
  for (int p = 0; p < size; ++p) {
    int64_t *h = &out[size_t(p * words)];
    h[0] = int64_t(seqTotal);
    h[1] = int64_t(Kind::AllToAll);
    h[2] = rowBytes;
    h[3] = slots;
    h[4] = layoutWord(layout);
    for (int64_t j = 0; j < slots; ++j)
      h[kAllToAllHeaderWords + j] = sendCounts[p * slots + j];
  }
  return out;
}

void readAllToAllHeaders(Communicator &comm, const std::string &label,
                         const std::vector<int64_t> &in, uint64_t seqTotal,
                         int64_t rowBytes, int64_t slots,
                         const RowLayout &layout, const int32_t *sendCounts,
                         int32_t *recvCounts, int64_t recvCapacity) {
  const int size = comm.size();
  const int64_t words = kAllToAllHeaderWords + slots;
  for (int p = 0; p < size; ++p) {
    const int64_t *h = &in[size_t(p * words)];
    checkHeader(comm, label, p, h, seqTotal, Kind::AllToAll);
    if (h[2] != rowBytes || h[3] != slots)
      comm.fail(1, label + ": rank " + std::to_string(p) + " sends " +
                       std::to_string(h[3]) + " counts per rank and rows of " +
                       std::to_string(h[2]) + " bytes, this rank expects " +
                       std::to_string(slots) + " and " +
                       std::to_string(rowBytes) + " (different programs?)");
    if (h[4] != layoutWord(layout))
      comm.fail(1, label + ": rank " + std::to_string(p) +
                       " orders its rows with layout word " +
                       std::to_string(h[4]) + ", this rank with " +
                       std::to_string(layoutWord(layout)) +
                       " (slot-major sides or padding differ: different "
                       "programs?)");
  }
  std::vector<int64_t> recvRowsFrom(static_cast<size_t>(size), 0);
  int64_t received = 0;
  uint64_t toPeers = 0;
  for (int p = 0; p < size; ++p)
    for (int64_t j = 0; j < slots; ++j) {
      int64_t n = in[size_t(p * words + kAllToAllHeaderWords + j)];
      if (n < 0 || n > INT32_MAX)
        comm.fail(1, label + ": rank " + std::to_string(p) +
                         " announces a count of " + std::to_string(n));
      recvCounts[p * slots + j] = int32_t(n);
      recvRowsFrom[size_t(p)] += n;
      received += n;
      if (p != comm.rank())
        toPeers += uint64_t(int64_t(sendCounts[p * slots + j]) * rowBytes);
    }
  if (received > recvCapacity) {
    std::string from;
    for (int p = 0; p < size; ++p)
      from += (p ? ", " : "") + std::to_string(recvRowsFrom[size_t(p)]) +
              " from rank " + std::to_string(p);
    comm.fail(1, label + ": receives " + std::to_string(received) + " rows (" +
                     from + ") but the result holds " +
                     std::to_string(recvCapacity) + " rows");
  }
  countBytesToPeers(toPeers);
}

std::vector<std::vector<RowSegment>>
rowSegments(const int32_t *counts, int size, int64_t slots, bool slotMajor,
            int64_t padTo, bool perSlot, int64_t &extent) {
  std::vector<std::vector<RowSegment>> segments(static_cast<size_t>(size));
  int64_t at = 0;
  if (!slotMajor) {
    for (int p = 0; p < size; ++p) {
      int64_t start = at;
      for (int64_t j = 0; j < slots; ++j) {
        int64_t n = counts[p * slots + j];
        if (perSlot)
          segments[size_t(p)].push_back({at, n});
        at += n;
      }
      if (!perSlot)
        segments[size_t(p)].push_back({start, at - start});
    }
  } else {
    for (int64_t j = 0; j < slots; ++j) {
      int64_t start = at;
      for (int p = 0; p < size; ++p) {
        int64_t n = counts[p * slots + j];
        segments[size_t(p)].push_back({at, n});
        at += n;
      }
      at = start + (at - start + padTo - 1) / padTo * padTo;
    }
  }
  extent = at;
  return segments;
}

RowPlan planRows(Communicator &comm, const std::string &label,
                 const int32_t *sendCounts, const int32_t *recvCounts,
                 int64_t slots, const RowLayout &layout, int64_t sendRows,
                 int64_t recvCapacity) {
  const int size = comm.size();
  bool perSlot = layout.slotMajorSend || layout.slotMajorRecv;
  RowPlan plan;
  int64_t sendExtent = 0, recvExtent = 0;
  plan.send = rowSegments(sendCounts, size, slots, layout.slotMajorSend,
                          layout.padTo, perSlot, sendExtent);
  plan.recv = rowSegments(recvCounts, size, slots, layout.slotMajorRecv,
                          layout.padTo, perSlot, recvExtent);
  if (sendExtent > sendRows)
    comm.fail(1, label + ": the rows sent span " + std::to_string(sendExtent) +
                     " rows (slot-major, padded to " +
                     std::to_string(layout.padTo) + ") but the input has " +
                     std::to_string(sendRows));
  if (recvExtent > recvCapacity)
    comm.fail(
        1, label + ": the rows received span " + std::to_string(recvExtent) +
               " rows (slot-major, padded to " + std::to_string(layout.padTo) +
               ") but the result holds " + std::to_string(recvCapacity));
  // Zeros wherever nothing is received: between slots and after the last.
  std::vector<RowSegment> covered;
  for (const auto &list : plan.recv)
    for (RowSegment s : list)
      if (s.rows > 0)
        covered.push_back(s);
  std::sort(covered.begin(), covered.end(),
            [](RowSegment a, RowSegment b) { return a.row < b.row; });
  int64_t at = 0;
  for (RowSegment s : covered) {
    if (s.row > at)
      plan.zero.push_back({at, s.row - at});
    at = std::max(at, s.row + s.rows);
  }
  if (recvCapacity > at)
    plan.zero.push_back({at, recvCapacity - at});
  return plan;
}

int64_t checkSendCounts(Communicator &comm, const std::string &label,
                        int64_t sendRows, const int32_t *sendCounts,
                        int64_t count) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (sendCounts[i] < 0)
      comm.fail(1, label + ": send count #" + std::to_string(i) + " is " +
                       std::to_string(sendCounts[i]));
    total += sendCounts[i];
  }
  if (total > sendRows)
    comm.fail(1, label + ": the send counts add up to " +
                     std::to_string(total) + " rows but the input has " +
                     std::to_string(sendRows));
  return total;
}

float toFloat(const void *p, DType type, int64_t i) {
  if (type == DType::BF16) {
    uint16_t h;
    std::memcpy(&h, static_cast<const char *>(p) + 2 * i, 2);
    uint32_t b = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char *>(p) + 2 * i, 2);
  return halfToFloat(h);
}

void fromFloat(void *p, DType type, int64_t i, float value) {
  uint16_t h;
  if (type == DType::BF16) {
    uint32_t b;
    std::memcpy(&b, &value, 4);
    if ((b & 0x7FFFFFFF) > 0x7F800000)
      h = uint16_t((b >> 16) | 0x40); // NaN stays NaN
    else
      h = uint16_t((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
  } else {
    h = floatToHalf(value);
  }
  std::memcpy(static_cast<char *>(p) + 2 * i, &h, 2);
}

void countBytesToPeers(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(stats().mu);
  stats().s.all_to_all_bytes_to_peers += bytes;
}

void countCall(bool allToAll, bool newCall, double seconds) {
  std::lock_guard<std::mutex> lock(stats().mu);
  if (allToAll) {
    stats().s.all_to_all_calls += newCall ? 1 : 0;
    stats().s.all_to_all_seconds += seconds;
  } else {
    ++stats().s.all_reduce_calls;
    stats().s.all_reduce_seconds += seconds;
  }
}

moert_comm_stats statsSnapshot() {
  std::lock_guard<std::mutex> lock(stats().mu);
  return stats().s;
}

void resetStats() {
  std::lock_guard<std::mutex> lock(stats().mu);
  stats().s = moert_comm_stats{};
}

} // namespace moert::comm
