//===- Comm.cpp - launch environment, backend choice, C entry points ------===//

#include "CommImpl.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace moert::comm {

const char *name(DType type) {
  switch (type) {
  case DType::F32: return "f32";
  case DType::F64: return "f64";
  case DType::BF16: return "bf16";
  case DType::F16: return "f16";
  case DType::I32: return "i32";
  case DType::I64: return "i64";
  }
  return "?";
}

size_t bytes(DType type) {
  switch (type) {
  case DType::F64:
  case DType::I64: return 8;
  case DType::BF16:
  case DType::F16: return 2;
  default: return 4;
  }
}

const char *name(Kind kind) {
  switch (kind) {
  case Kind::AllToAll: return "all_to_all";
  case Kind::AllReduce: return "all_reduce_sum";
  case Kind::Barrier: return "barrier";
  }
  return "?";
}

void fatal(const std::string &message) {
  std::fflush(stdout);
  std::fprintf(stderr, "moert: error: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

namespace {

/// A non-negative integer variable; -1 when unset. Anything else is an error
/// naming the variable.
int intVar(const char *var) {
  const char *value = std::getenv(var);
  if (!value)
    return -1;
  char *end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (!*value || *end || errno || v < 0 || v > (1 << 24))
    fatal(std::string(var) + "='" + value +
          "' is not a non-negative integer");
  return int(v);
}

LaunchEnv readLaunchEnv() {
  LaunchEnv env;
  env.rank = intVar("RANK");
  env.worldSize = intVar("WORLD_SIZE");
  env.localRank = intVar("LOCAL_RANK");
  // MPI launchers announce themselves (Open MPI, PMIx, MPICH/hydra, Slurm).
  for (auto [var, sizeVar] :
       {std::pair<const char *, const char *>{"OMPI_COMM_WORLD_SIZE",
                                              "OMPI_COMM_WORLD_SIZE"},
        {"PMIX_RANK", nullptr},
        {"PMI_SIZE", "PMI_SIZE"},
        {"PMI_RANK", nullptr}}) {
    if (std::getenv(var)) {
      env.mpiLauncherVar = var;
      if (sizeVar)
        env.mpiLauncherSize = intVar(sizeVar);
      break;
    }
  }
  if (env.worldSize == 0)
    fatal("WORLD_SIZE=0: there must be at least one rank");
  // Under an MPI launcher, MPI gives the rank (RANK/WORLD_SIZE, if set, are
  // checked against it); otherwise both must be set together.
  if (env.worldSize > 0 && env.rank < 0 && !env.mpiLauncherVar)
    fatal("RANK is not set, but WORLD_SIZE=" + std::to_string(env.worldSize) +
          " is: set RANK to this process's rank (0.." +
          std::to_string(env.worldSize - 1) + ")");
  if (env.rank >= 0 && env.worldSize < 0 && !env.mpiLauncherVar)
    fatal("WORLD_SIZE is not set, but RANK=" + std::to_string(env.rank) +
          " is: set WORLD_SIZE to the number of ranks");
  if (env.rank >= 0 && env.worldSize > 0 && env.rank >= env.worldSize)
    fatal("RANK=" + std::to_string(env.rank) + " is not below WORLD_SIZE=" +
          std::to_string(env.worldSize));
  if (env.localRank >= 0 && env.worldSize > 0 && env.localRank >= env.worldSize)
    fatal("LOCAL_RANK=" + std::to_string(env.localRank) +
          " is not below WORLD_SIZE=" + std::to_string(env.worldSize));
  if (const char *port = std::getenv("MASTER_PORT")) {
    int p = intVar("MASTER_PORT");
    if (p < 1 || p > 65535)
      fatal(std::string("MASTER_PORT='") + port + "' is not a port (1..65535)");
  }
  if (const char *addr = std::getenv("MASTER_ADDR"); addr && !*addr)
    fatal("MASTER_ADDR is set but empty");
  return env;
}

/// One rank: every exchange is a copy.
class SelfComm final : public Communicator {
public:
  const char *backend() const override { return "self"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }

  void allToAllV(const void *send, int64_t sendRows, const int32_t *sendCounts,
                 int64_t slots, int64_t rowBytes, void *recv,
                 int64_t recvCapacity, int32_t *recvCounts, const char *what,
                 const RowLayout &layout) override {
    std::string label = seq.enter(0, Kind::AllToAll, what);
    checkSendCounts(*this, label, sendRows, sendCounts, slots);
    std::memmove(recvCounts, sendCounts, size_t(slots) * sizeof(int32_t));
    RowPlan plan = planRows(*this, label, sendCounts, recvCounts, slots,
                            layout, sendRows, recvCapacity);
    char *to = static_cast<char *>(recv);
    const char *from = static_cast<const char *>(send);
    // Rows moving within one buffer (send == recv, a slot-major side): read
    // them all before writing any.
    std::vector<char> copyOfInput;
    if (send == recv && (layout.slotMajorSend || layout.slotMajorRecv)) {
      copyOfInput.assign(from, from + sendRows * rowBytes);
      from = copyOfInput.data();
    }
    for (auto [s, r] : zipped(plan.send[0], plan.recv[0]))
      std::memmove(to + r.row * rowBytes, from + s.row * rowBytes,
                   size_t(r.rows * rowBytes));
    for (RowSegment z : plan.zero)
      std::memset(to + z.row * rowBytes, 0, size_t(z.rows * rowBytes));
  }

  void allReduceSum(const void *in, void *out, int64_t count,
                    DType type) override {
    seq.enter(0, Kind::AllReduce, name(type));
    if (in != out)
      std::memmove(out, in, size_t(count) * bytes(type));
  }

  void barrier() override { seq.enter(0, Kind::Barrier, ""); }

  [[noreturn]] void abort(int code, const std::string &message) override {
    std::fflush(stdout);
    std::fprintf(stderr, "moert: rank 0: %s\n", message.c_str());
    std::fflush(stderr);
    std::exit(code);
  }

private:
  Sequence seq;
};

/// The error for ranks launched torchrun-style that no backend can join.
std::string noLauncherMessage(const LaunchEnv &env, const std::string &ncclWhy) {
  std::string n = std::to_string(env.worldSize);
  std::string message =
      "WORLD_SIZE=" + n +
      " asks for several ranks, but this process was not started by an MPI "
      "launcher: the MPI backend cannot meet the other ranks through "
      "MASTER_ADDR/MASTER_PORT; start the ranks with `mpirun -np " + n +
      "` (-H or --hostfile for several hosts)";
  if (!ncclWhy.empty())
    message += ". The NCCL backend, which meets them there (one GPU per "
               "rank), cannot run here: " + ncclWhy;
  return message;
}

/// The host communicator: MPI or one rank.
std::unique_ptr<Communicator> createHost() {
  const LaunchEnv &env = launchEnv();
  const std::string &backend = backendChoice();
  bool wantMpi = backend == "mpi" ||
                 (backend != "self" &&
                  (env.mpiLauncherVar || env.worldSize > 1));
  if (backend == "self" && (env.worldSize > 1 || env.mpiLauncherSize > 1))
    fatal("MOERT_COMM_BACKEND=self runs one rank, but " +
          std::string(env.worldSize > 1 ? "WORLD_SIZE" : env.mpiLauncherVar) +
          "=" +
          std::to_string(env.worldSize > 1 ? env.worldSize
                                           : env.mpiLauncherSize) +
          " ranks were launched");
  if (!wantMpi)
    return std::make_unique<SelfComm>();
#ifdef MOERT_HAVE_MPI
  if (env.worldSize > 1 && !env.mpiLauncherVar)
    fatal(noLauncherMessage(env, ""));
  return createMpiCommunicator(env);
#else
  fatal(std::string("this program needs the MPI communication backend (") +
        (backend == "mpi" ? "MOERT_COMM_BACKEND=mpi"
         : env.mpiLauncherVar
             ? std::string("launched by an MPI launcher: ") + env.mpiLauncherVar
             : "WORLD_SIZE=" + std::to_string(env.worldSize)) +
        "), but libmoert was built without MPI: install an MPI (Debian: "
        "libopenmpi-dev openmpi-bin) and rebuild libmoert");
#endif
}

/// The NCCL communicator, created on first use; `why` says what asked for
/// it (for the message when it cannot be made).
Communicator &ncclWorld(const std::string &why) {
  static Communicator *comm = [&] {
    const LaunchEnv &env = launchEnv();
    // A missing libnccl is reported before any rendezvous.
    if (std::string error = ncclLibraryError(); !error.empty())
      fatal(why + " needs the NCCL backend, but " + error);
    NcclBootstrap b;
    if (env.mpiLauncherVar) {
#ifdef MOERT_HAVE_MPI
      Communicator &mpi = hostWorld();
      b.rank = mpi.rank();
      b.size = mpi.size();
      b.mpi = &mpi;
#else
      if (env.rank < 0 || env.worldSize < 0 || !std::getenv("MASTER_ADDR"))
        fatal(std::string("launched by an MPI launcher (") + env.mpiLauncherVar +
              "), but libmoert was built without MPI, through which the NCCL "
              "backend would meet the other ranks: rebuild libmoert with MPI, "
              "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
      b.rank = env.rank;
      b.size = env.worldSize;
      b.store = storeAddress(env.worldSize);
#endif
    } else if (env.worldSize > 1) {
      b.rank = env.rank;
      b.size = env.worldSize;
      b.store = storeAddress(env.worldSize);
    }
    return createNcclCommunicator(b).release();
  }();
  return *comm;
}

double parseTimeout() {
  const char *value = std::getenv("MOERT_COMM_TIMEOUT");
  if (!value)
    return 300.0;
  char *end = nullptr;
  double t = std::strtod(value, &end);
  if (!*value || *end || !std::isfinite(t) || t <= 0)
    fatal(std::string("MOERT_COMM_TIMEOUT='") + value +
          "' is not a positive number of seconds");
  return t;
}

bool parseOverlap() {
  const char *value = std::getenv("MOERT_COMM_OVERLAP");
  if (!value || !*value)
    return true;
  if (std::strcmp(value, "1") == 0)
    return true;
  if (std::strcmp(value, "0") == 0)
    return false;
  fatal(std::string("MOERT_COMM_OVERLAP='") + value + "' is not 0 or 1");
}

/// An exchange that finished when it was started.
struct Completed final : Communicator::Pending {
  void wait() override {}
};

int faultVar(const char *var) {
  const char *value = std::getenv(var);
  if (!value || !*value)
    return -1;
  return intVar(var);
}

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
    float scaled = a * 16777216.0f; // exact: a power of two
    float r = std::nearbyint(scaled);  // default rounding: nearest even
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

} // namespace

const LaunchEnv &launchEnv() {
  static LaunchEnv env = readLaunchEnv();
  return env;
}

const std::string &backendChoice() {
  static const std::string backend = [] {
    std::string b = "auto";
    if (const char *v = std::getenv("MOERT_COMM_BACKEND"))
      b = v;
    if (b != "auto" && b != "mpi" && b != "self" && b != "nccl")
      fatal("MOERT_COMM_BACKEND='" + b +
            "' is not one of auto, mpi, self, nccl");
    return b;
  }();
  return backend;
}

Communicator &hostWorld() {
  static Communicator *comm = [] {
    timeoutSeconds();
    return createHost().release();
  }();
  return *comm;
}

double timeoutSeconds() {
  static double t = parseTimeout();
  return t;
}

bool overlapEnabled() {
  static bool on = parseOverlap();
  return on;
}

std::unique_ptr<Communicator::Pending> Communicator::allToAllVStart(
    const void *send, int64_t sendRows, const int32_t *sendCounts,
    int64_t slots, int64_t rowBytes, void *recv, int64_t recvCapacity,
    int32_t *recvCounts, const char *what, const RowLayout &layout) {
  allToAllV(send, sendRows, sendCounts, slots, rowBytes, recv, recvCapacity,
            recvCounts, what, layout);
  return std::make_unique<Completed>();
}

Communicator &world() {
  static Communicator *comm = [] {
    timeoutSeconds(); // a bad MOERT_COMM_TIMEOUT fails before any exchange
    const LaunchEnv &env = launchEnv();
    const std::string &backend = backendChoice();
    if (backend == "nccl")
      return &ncclWorld("MOERT_COMM_BACKEND=nccl");
    if (backend == "auto" && !env.mpiLauncherVar && env.worldSize > 1) {
      // torchrun-style: only NCCL meets the ranks at MASTER_ADDR:MASTER_PORT.
      if (std::string why = ncclUnavailable(); !why.empty())
        fatal(noLauncherMessage(env, why));
      return &ncclWorld("WORLD_SIZE=" + std::to_string(env.worldSize) +
                        " without an MPI launcher");
    }
    return &hostWorld();
  }();
  return *comm;
}

Communicator &deviceWorld() {
  static Communicator *comm = [] {
    timeoutSeconds();
    const LaunchEnv &env = launchEnv();
    const std::string &backend = backendChoice();
    if (backend == "nccl")
      return &ncclWorld("MOERT_COMM_BACKEND=nccl");
    if (backend == "auto") {
      int ranks = env.mpiLauncherVar ? hostWorld().size()
                  : env.worldSize > 1 ? env.worldSize
                                      : 1;
      if (ranks > 1)
        return &ncclWorld(
            "exchanging device buffers between " + std::to_string(ranks) +
            " ranks (MOERT_COMM_BACKEND=auto; MOERT_COMM_BACKEND=mpi copies "
            "them through host memory instead)");
    }
    // One rank, or MPI asked for: through host memory.
    return createStagedCommunicator(hostWorld()).release();
  }();
  return *comm;
}

std::string Sequence::enter(int rank, Kind kind, const char *what) {
  ++total;
  uint64_t n = ++perKind[int(kind)];
  std::string label = std::string(name(kind)) + " #" + std::to_string(n);
  if (what && *what)
    label += std::string(" (") + what + ")";
  static const int failRank = faultVar("MOERT_TEST_FAIL_RANK");
  static const int stallRank = faultVar("MOERT_TEST_STALL_RANK");
  static const int at = faultVar("MOERT_TEST_FAULT_AT");
  if ((rank == failRank || rank == stallRank) &&
      total == uint64_t(at < 0 ? 1 : at)) {
    std::fflush(stdout);
    if (rank == failRank) {
      std::fprintf(stderr,
                   "moert: rank %d: MOERT_TEST_FAIL_RANK: exiting at %s\n",
                   rank, label.c_str());
      std::fflush(stderr);
      ::_exit(3); // as if it crashed: no finalization, no exit handlers
    }
    int seconds = faultVar("MOERT_TEST_STALL_SECONDS");
    std::fprintf(stderr,
                 "moert: rank %d: MOERT_TEST_STALL_RANK: sleeping %d s at %s\n",
                 rank, seconds < 0 ? 3600 : seconds, label.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(seconds < 0 ? 3600 : seconds));
  }
  return label;
}

void checkHeader(Communicator &comm, const std::string &label, int peer,
                 const int64_t *h, uint64_t seqTotal, Kind kind) {
  if (h[0] == int64_t(seqTotal) && h[1] == int64_t(kind))
    return;
  const char *theirs = h[1] >= 1 && h[1] <= 3 ? name(Kind(h[1])) : "?";
  comm.abort(1, label + ": rank " + std::to_string(peer) +
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
      comm.abort(1, label + ": rank " + std::to_string(p) + " sends " +
                        std::to_string(h[3]) + " counts per rank and rows of " +
                        std::to_string(h[2]) + " bytes, this rank expects " +
                        std::to_string(slots) + " and " +
                        std::to_string(rowBytes) + " (different programs?)");
    if (h[4] != layoutWord(layout))
      comm.abort(1, label + ": rank " + std::to_string(p) +
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
        comm.abort(1, label + ": rank " + std::to_string(p) +
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
    comm.abort(1, label + ": receives " + std::to_string(received) +
                      " rows (" + from + ") but the result holds " +
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
    comm.abort(1, label + ": the rows sent span " +
                      std::to_string(sendExtent) +
                      " rows (slot-major, padded to " +
                      std::to_string(layout.padTo) + ") but the input has " +
                      std::to_string(sendRows));
  if (recvExtent > recvCapacity)
    comm.abort(1, label + ": the rows received span " +
                      std::to_string(recvExtent) +
                      " rows (slot-major, padded to " +
                      std::to_string(layout.padTo) +
                      ") but the result holds " +
                      std::to_string(recvCapacity));
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
      comm.abort(1, label + ": send count #" + std::to_string(i) + " is " +
                        std::to_string(sendCounts[i]));
    total += sendCounts[i];
  }
  if (total > sendRows)
    comm.abort(1, label + ": the send counts add up to " +
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

namespace {
struct Stats {
  std::mutex mu;
  moert_comm_stats s{};
};
Stats &stats() {
  static Stats *s = new Stats();
  return *s;
}
} // namespace

void countBytesToPeers(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(stats().mu);
  stats().s.all_to_all_bytes_to_peers += bytes;
}

} // namespace moert::comm

//===----------------------------------------------------------------------===//
// C entry points
//===----------------------------------------------------------------------===//

using namespace moert::comm;

namespace {

/// A buffer a collective is given: where it starts and how many bytes.
struct Buffer {
  const void *data;
  int64_t bytes;
};

/// The communicator for these buffers: deviceWorld() when they are device
/// memory, else world(). Buffers on both sides are an error.
Communicator &checkedWorld(const char *op, int64_t groupSize,
                           std::initializer_list<Buffer> buffers) {
  int onDevice = 0, onHost = 0;
  for (const Buffer &b : buffers)
    if (b.data && b.bytes > 0)
      ++(isDevicePointer(b.data) ? onDevice : onHost);
  if (onDevice && onHost)
    world().abort(1, std::string(op) + ": " + std::to_string(onDevice) +
                         " of its buffers are in device memory and " +
                         std::to_string(onHost) +
                         " in host memory; all must be on the same side");
  Communicator &c = onDevice ? deviceWorld() : world();
  if (groupSize != c.size())
    c.abort(1, std::string(op) + ": the program was compiled for " +
                   std::to_string(groupSize) +
                   " ranks (its shard.grid), but " + std::to_string(c.size()) +
                   " were launched (" + c.backend() + " backend)");
  return c;
}

template <typename T> T *data(const moert_memref1d *m) {
  return static_cast<T *>(m->aligned) + m->offset;
}

void checkContiguous(Communicator &c, const char *op, const char *what,
                     const moert_memref1d *m) {
  if (m->sizes[0] > 1 && m->strides[0] != 1)
    c.abort(1, std::string(op) + ": " + what + " is not contiguous (stride " +
                   std::to_string(m->strides[0]) + ")");
}

void checkRows(Communicator &c, const char *op, const char *what,
               const moert_memref2d *m) {
  if ((m->sizes[1] > 1 && m->strides[1] != 1) ||
      (m->sizes[0] > 1 && m->strides[0] != m->sizes[1]))
    c.abort(1, std::string(op) + ": " + what +
                   " does not hold contiguous rows (strides " +
                   std::to_string(m->strides[0]) + ", " +
                   std::to_string(m->strides[1]) + ")");
}

/// Times a collective entry point for moert_comm_stats (`count`: the call
/// is a new collective, not the wait of a started one).
struct Timed {
  bool allToAll, count;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  explicit Timed(bool allToAll, bool count = true)
      : allToAll(allToAll), count(count) {}
  ~Timed() {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             start)
                   .count();
    std::lock_guard<std::mutex> lock(stats().mu);
    if (allToAll) {
      stats().s.all_to_all_calls += count ? 1 : 0;
      stats().s.all_to_all_seconds += s;
    } else {
      ++stats().s.all_reduce_calls;
      stats().s.all_reduce_seconds += s;
    }
  }
};

/// An all_to_all call's buffers, checked: what allToAllV(Start) takes.
struct AllToAllArgs {
  Communicator *comm;
  const void *send;
  int64_t sendRows;
  const int32_t *sendCounts;
  int64_t slots, rowBytes;
  void *recv;
  int64_t recvCapacity;
  int32_t *recvCounts;
  std::string what;
  RowLayout layout;
};

char *rowsOf(const moert_memref2d *m, size_t elementBytes) {
  return static_cast<char *>(m->aligned) + m->offset * int64_t(elementBytes);
}

AllToAllArgs allToAllArgs(const std::string &op, size_t elementBytes,
                          const char *dtype, moert_memref2d *input,
                          moert_memref1d *sendCounts, moert_memref2d *result,
                          moert_memref1d *recvCounts, int64_t groupSize,
                          int64_t layout, int64_t padTo) {
  auto bytesOf = [&](const moert_memref2d *m) {
    return m->sizes[0] * m->sizes[1] * int64_t(elementBytes);
  };
  Communicator &c = checkedWorld(
      op.c_str(), groupSize,
      {{rowsOf(input, elementBytes), bytesOf(input)},
       {data<int32_t>(sendCounts), sendCounts->sizes[0] * 4},
       {rowsOf(result, elementBytes), bytesOf(result)},
       {data<int32_t>(recvCounts), recvCounts->sizes[0] * 4}});
  checkRows(c, op.c_str(), "the input", input);
  checkRows(c, op.c_str(), "the result", result);
  checkContiguous(c, op.c_str(), "send_counts", sendCounts);
  checkContiguous(c, op.c_str(), "recv_counts", recvCounts);
  int64_t count = sendCounts->sizes[0];
  if (input->sizes[1] != result->sizes[1])
    c.abort(1, op + ": rows of " + std::to_string(input->sizes[1]) +
                   " values in, " + std::to_string(result->sizes[1]) + " out");
  if (recvCounts->sizes[0] != count || count % c.size() != 0)
    c.abort(1, op + ": " + std::to_string(count) + " send counts and " +
                   std::to_string(recvCounts->sizes[0]) +
                   " receive counts; both must be the same multiple of the " +
                   std::to_string(c.size()) + " ranks");
  if (layout < 0 || layout > 3 || padTo < 1)
    c.abort(1, op + ": layout " + std::to_string(layout) + " and pad_to " +
                   std::to_string(padTo) +
                   " (expected a layout of 0 to 3 and pad_to >= 1)");
  return {&c,
          rowsOf(input, elementBytes),
          input->sizes[0],
          data<int32_t>(sendCounts),
          count / c.size(),
          input->sizes[1] * int64_t(elementBytes),
          rowsOf(result, elementBytes),
          result->sizes[0],
          data<int32_t>(recvCounts),
          std::string(dtype) + " rows",
          RowLayout{(layout & 1) != 0, (layout & 2) != 0, padTo}};
}

void allToAll(const char *entry, const char *dtype, size_t elementBytes,
              moert_memref2d *input, moert_memref1d *sendCounts,
              moert_memref2d *result, moert_memref1d *recvCounts,
              int64_t groupSize, int64_t layout = 0, int64_t padTo = 1) {
  Timed timed(/*allToAll=*/true);
  AllToAllArgs a = allToAllArgs(std::string(entry) + dtype, elementBytes,
                                dtype, input, sendCounts, result, recvCounts,
                                groupSize, layout, padTo);
  a.comm->allToAllV(a.send, a.sendRows, a.sendCounts, a.slots, a.rowBytes,
                    a.recv, a.recvCapacity, a.recvCounts, a.what.c_str(),
                    a.layout);
}

/// Exchanges started and not yet waited for, by handle.
struct Started {
  std::unique_ptr<Communicator::Pending> pending;
  Communicator *comm;
  const void *send;
  void *recv;
};
struct StartedTable {
  std::mutex mu;
  int64_t next = 1;
  std::map<int64_t, Started> live;
};
StartedTable &started() {
  static StartedTable *t = new StartedTable();
  return *t;
}

int64_t allToAllStart(const char *entry, const char *dtype,
                      size_t elementBytes, moert_memref2d *input,
                      moert_memref1d *sendCounts, moert_memref2d *result,
                      moert_memref1d *recvCounts, int64_t groupSize,
                      int64_t layout = 0, int64_t padTo = 1) {
  Timed timed(/*allToAll=*/true);
  AllToAllArgs a = allToAllArgs(std::string(entry) + dtype, elementBytes,
                                dtype, input, sendCounts, result, recvCounts,
                                groupSize, layout, padTo);
  // MOERT_COMM_OVERLAP=0: the base class's start, which completes the
  // exchange, whatever the backend.
  std::unique_ptr<Communicator::Pending> pending =
      overlapEnabled()
          ? a.comm->allToAllVStart(a.send, a.sendRows, a.sendCounts, a.slots,
                                   a.rowBytes, a.recv, a.recvCapacity,
                                   a.recvCounts, a.what.c_str(), a.layout)
          : a.comm->Communicator::allToAllVStart(
                a.send, a.sendRows, a.sendCounts, a.slots, a.rowBytes, a.recv,
                a.recvCapacity, a.recvCounts, a.what.c_str(), a.layout);
  StartedTable &t = started();
  std::lock_guard<std::mutex> lock(t.mu);
  int64_t handle = t.next++;
  t.live.emplace(handle, Started{std::move(pending), a.comm, a.send, a.recv});
  return handle;
}

void allToAllWait(const char *dtype, size_t elementBytes, int64_t handle,
                  moert_memref2d *input, moert_memref2d *result) {
  Timed timed(/*allToAll=*/true, /*count=*/false);
  std::string op = std::string("moert_all_to_all_wait_") + dtype;
  Started s;
  {
    StartedTable &t = started();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.live.find(handle);
    if (it == t.live.end())
      world().abort(1, op + ": no exchange was started with handle " +
                           std::to_string(handle) + " (or it was waited for "
                           "already)");
    s = std::move(it->second);
    t.live.erase(it);
  }
  if (s.send != rowsOf(input, elementBytes) ||
      s.recv != rowsOf(result, elementBytes))
    s.comm->abort(1, op + ": handle " + std::to_string(handle) +
                         " was started with other buffers");
  s.pending->wait();
}

void allReduce(const char *dtype, DType type, moert_memref1d *input,
               moert_memref1d *result, int64_t groupSize) {
  Timed timed(/*allToAll=*/false);
  std::string op = std::string("moert_all_reduce_sum_") + dtype;
  size_t eb = bytes(type);
  Communicator &c = checkedWorld(
      op.c_str(), groupSize,
      {{static_cast<char *>(input->aligned) + input->offset * eb,
        input->sizes[0] * int64_t(eb)},
       {static_cast<char *>(result->aligned) + result->offset * eb,
        result->sizes[0] * int64_t(eb)}});
  checkContiguous(c, op.c_str(), "the input", input);
  checkContiguous(c, op.c_str(), "the result", result);
  if (input->sizes[0] != result->sizes[0])
    c.abort(1, op + ": " + std::to_string(input->sizes[0]) + " values in, " +
                   std::to_string(result->sizes[0]) + " out");
  c.allReduceSum(static_cast<char *>(input->aligned) + input->offset * eb,
                 static_cast<char *>(result->aligned) + result->offset * eb,
                 input->sizes[0], type);
}

} // namespace

extern "C" {

#define MOERT_DEFINE_ALL_TO_ALL(T, BYTES)                                      \
  void _mlir_ciface_moert_all_to_all_##T(                                      \
      moert_memref2d *input, moert_memref1d *send_counts,                      \
      moert_memref2d *result, moert_memref1d *recv_counts,                     \
      int64_t group_size) {                                                    \
    allToAll("moert_all_to_all_", #T, BYTES, input, send_counts, result,       \
             recv_counts, group_size);                                         \
  }
MOERT_DEFINE_ALL_TO_ALL(f32, 4)
MOERT_DEFINE_ALL_TO_ALL(bf16, 2)
MOERT_DEFINE_ALL_TO_ALL(f16, 2)
MOERT_DEFINE_ALL_TO_ALL(f64, 8)
MOERT_DEFINE_ALL_TO_ALL(f8e4m3fn, 1)
MOERT_DEFINE_ALL_TO_ALL(f8e5m2, 1)
MOERT_DEFINE_ALL_TO_ALL(f8e8m0fnu, 1)
#undef MOERT_DEFINE_ALL_TO_ALL

#define MOERT_DEFINE_ALL_TO_ALL_ASYNC(T, BYTES)                                \
  int64_t _mlir_ciface_moert_all_to_all_start_##T(                             \
      moert_memref2d *input, moert_memref1d *send_counts,                      \
      moert_memref2d *result, moert_memref1d *recv_counts,                     \
      int64_t group_size) {                                                    \
    return allToAllStart("moert_all_to_all_start_", #T, BYTES, input,          \
                         send_counts, result, recv_counts, group_size);        \
  }                                                                            \
  void _mlir_ciface_moert_all_to_all_wait_##T(                                 \
      int64_t handle, moert_memref2d *input, moert_memref2d *result) {         \
    allToAllWait(#T, BYTES, handle, input, result);                            \
  }
MOERT_DEFINE_ALL_TO_ALL_ASYNC(f32, 4)
MOERT_DEFINE_ALL_TO_ALL_ASYNC(bf16, 2)
MOERT_DEFINE_ALL_TO_ALL_ASYNC(f16, 2)
MOERT_DEFINE_ALL_TO_ALL_ASYNC(f64, 8)
MOERT_DEFINE_ALL_TO_ALL_ASYNC(f8e4m3fn, 1)
MOERT_DEFINE_ALL_TO_ALL_ASYNC(f8e5m2, 1)
MOERT_DEFINE_ALL_TO_ALL_ASYNC(f8e8m0fnu, 1)
#undef MOERT_DEFINE_ALL_TO_ALL_ASYNC

#define MOERT_DEFINE_ALL_TO_ALL_SLOTS(T, BYTES)                                \
  void _mlir_ciface_moert_all_to_all_slots_##T(                                \
      moert_memref2d *input, moert_memref1d *send_counts,                      \
      moert_memref2d *result, moert_memref1d *recv_counts,                     \
      int64_t group_size, int64_t layout, int64_t pad_to) {                    \
    allToAll("moert_all_to_all_slots_", #T, BYTES, input, send_counts, result, \
             recv_counts, group_size, layout, pad_to);                         \
  }                                                                            \
  int64_t _mlir_ciface_moert_all_to_all_slots_start_##T(                       \
      moert_memref2d *input, moert_memref1d *send_counts,                      \
      moert_memref2d *result, moert_memref1d *recv_counts,                     \
      int64_t group_size, int64_t layout, int64_t pad_to) {                    \
    return allToAllStart("moert_all_to_all_slots_start_", #T, BYTES, input,    \
                         send_counts, result, recv_counts, group_size, layout, \
                         pad_to);                                              \
  }
MOERT_DEFINE_ALL_TO_ALL_SLOTS(f32, 4)
MOERT_DEFINE_ALL_TO_ALL_SLOTS(bf16, 2)
MOERT_DEFINE_ALL_TO_ALL_SLOTS(f16, 2)
MOERT_DEFINE_ALL_TO_ALL_SLOTS(f64, 8)
MOERT_DEFINE_ALL_TO_ALL_SLOTS(f8e4m3fn, 1)
MOERT_DEFINE_ALL_TO_ALL_SLOTS(f8e5m2, 1)
MOERT_DEFINE_ALL_TO_ALL_SLOTS(f8e8m0fnu, 1)
#undef MOERT_DEFINE_ALL_TO_ALL_SLOTS

#define MOERT_DEFINE_ALL_REDUCE(T, TYPE)                                       \
  void _mlir_ciface_moert_all_reduce_sum_##T(                                  \
      moert_memref1d *input, moert_memref1d *result, int64_t group_size) {     \
    allReduce(#T, DType::TYPE, input, result, group_size);                     \
  }
MOERT_DEFINE_ALL_REDUCE(f32, F32)
MOERT_DEFINE_ALL_REDUCE(f64, F64)
MOERT_DEFINE_ALL_REDUCE(bf16, BF16)
MOERT_DEFINE_ALL_REDUCE(f16, F16)
MOERT_DEFINE_ALL_REDUCE(i32, I32)
MOERT_DEFINE_ALL_REDUCE(i64, I64)
#undef MOERT_DEFINE_ALL_REDUCE

int32_t moert_comm_rank(void) { return world().rank(); }
int32_t moert_comm_size(void) { return world().size(); }
void moert_comm_barrier(void) { world().barrier(); }
void moert_comm_get_stats(moert_comm_stats *s) {
  std::lock_guard<std::mutex> lock(stats().mu);
  *s = stats().s;
}
void moert_comm_reset_stats(void) {
  std::lock_guard<std::mutex> lock(stats().mu);
  stats().s = moert_comm_stats{};
}
void moert_comm_abort(int32_t code, const char *message) {
  world().abort(code, message ? message : "aborted");
}

} // extern "C"
