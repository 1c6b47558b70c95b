//===- CommBackend.cpp - which backend runs: world(), deviceWorld() -------===//
//
// The choice of backend (Comm.h, "Backends"): from the launch environment
// and MOERT_COMM_BACKEND, the host communicator (MPI or one rank), the NCCL
// one, and the device one (NCCL, or staged through the host communicator).
// Also the one-rank backend, and abortJob for the tools' error paths.
//
//===----------------------------------------------------------------------===//

#include "CommBackends.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace moert::comm {
namespace {

/// The communicators made so far, for abortJob.
struct Made {
  std::mutex mu;
  std::vector<Communicator *> all;
};
Made &made() {
  static Made *m = new Made();
  return *m;
}
Communicator *remember(Communicator *c) {
  std::lock_guard<std::mutex> lock(made().mu);
  made().all.push_back(c);
  return c;
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
    std::string label = seq.enter(*this, Kind::AllToAll, what);
    checkSendCounts(*this, label, sendRows, sendCounts, slots);
    std::memmove(recvCounts, sendCounts, size_t(slots) * sizeof(int32_t));
    RowPlan plan = planRows(*this, label, sendCounts, recvCounts, slots, layout,
                            sendRows, recvCapacity);
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
    seq.enter(*this, Kind::AllReduce, name(type));
    if (in != out)
      std::memmove(out, in, size_t(count) * bytes(type));
  }

  void barrier() override { seq.enter(*this, Kind::Barrier, ""); }

  void abort(int) override {} // nothing to stop: no other rank

private:
  Sequence seq;
};

/// The error for ranks launched torchrun-style that no backend can join.
std::string noLauncherMessage(const LaunchEnv &env,
                              const std::string &ncclWhy) {
  std::string n = std::to_string(env.worldSize);
  std::string message =
      "WORLD_SIZE=" + n +
      " asks for several ranks, but this process was not started by an MPI "
      "launcher: the MPI backend cannot meet the other ranks through "
      "MASTER_ADDR/MASTER_PORT; start the ranks with `mpirun -np " +
      n + "` (-H or --hostfile for several hosts)";
  if (!ncclWhy.empty())
    message += ". The NCCL backend, which meets them there (one GPU per "
               "rank), cannot run here: " +
               ncclWhy;
  return message;
}

/// The host communicator: MPI or one rank.
std::unique_ptr<Communicator> createHost() {
  const LaunchEnv &env = launchEnv();
  const std::string &backend = backendChoice();
  bool wantMpi =
      backend == "mpi" ||
      (backend != "self" && (env.mpiLauncherVar || env.worldSize > 1));
  if (backend == "self" && (env.worldSize > 1 || env.mpiLauncherSize > 1))
    fail("MOERT_COMM_BACKEND=self runs one rank, but " +
         std::string(env.worldSize > 1 ? "WORLD_SIZE" : env.mpiLauncherVar) +
         "=" +
         std::to_string(env.worldSize > 1 ? env.worldSize
                                          : env.mpiLauncherSize) +
         " ranks were launched");
  if (!wantMpi)
    return std::make_unique<SelfComm>();
#ifdef MOERT_HAVE_MPI
  if (env.worldSize > 1 && !env.mpiLauncherVar)
    fail(noLauncherMessage(env, ""));
  return createMpiCommunicator(env);
#else
  fail(std::string("this program needs the MPI communication backend (") +
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
      fail(why + " needs the NCCL backend, but " + error);
    NcclBootstrap b;
    if (env.mpiLauncherVar) {
#ifdef MOERT_HAVE_MPI
      Communicator &mpi = hostWorld();
      b.rank = mpi.rank();
      b.size = mpi.size();
      b.mpi = &mpi;
#else
      if (env.rank < 0 || env.worldSize < 0 || !std::getenv("MASTER_ADDR"))
        fail(std::string("launched by an MPI launcher (") + env.mpiLauncherVar +
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
    return remember(createNcclCommunicator(b).release());
  }();
  return *comm;
}

} // namespace

std::unique_ptr<Communicator> createSelfCommunicator() {
  return std::make_unique<SelfComm>();
}

Communicator &hostWorld() {
  static Communicator *comm = [] {
    timeoutSeconds();
    return remember(createHost().release());
  }();
  return *comm;
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
        fail(noLauncherMessage(env, why));
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
      int ranks = env.mpiLauncherVar  ? hostWorld().size()
                  : env.worldSize > 1 ? env.worldSize
                                      : 1;
      if (ranks > 1)
        return &ncclWorld(
            "exchanging device buffers between " + std::to_string(ranks) +
            " ranks (MOERT_COMM_BACKEND=auto; MOERT_COMM_BACKEND=mpi copies "
            "them through host memory instead)");
    }
    // One rank, or MPI asked for: through host memory.
    return remember(createStagedCommunicator(hostWorld()).release());
  }();
  return *comm;
}

Communicator &group(Communicator &parent, int size, int stride) {
  const int n = parent.size();
  if (size < 1 || stride < 1 || int64_t(size) * stride > n ||
      n % (size * stride) != 0)
    fail("a group of " + std::to_string(size) + " ranks " +
         std::to_string(stride) + " apart does not tile the " +
         std::to_string(n) + " ranks launched");
  if (size == n)
    return parent;
  static std::mutex mu;
  static std::map<std::tuple<Communicator *, int, int>, Communicator *>
      *groups =
          new std::map<std::tuple<Communicator *, int, int>, Communicator *>();
  std::lock_guard<std::mutex> lock(mu);
  Communicator *&c = (*groups)[{&parent, size, stride}];
  if (c)
    return *c;
  const int rank = parent.rank(), span = size * stride;
  const int base = rank / span * span + rank % stride;
  // Every rank is there (within the deadline) before the split, which
  // blocks without one.
  parent.barrier();
  std::unique_ptr<Communicator> made =
      parent.split(/*color=*/rank / span * stride + rank % stride,
                   /*colors=*/n / size, /*key=*/(rank - base) / stride, size);
  std::vector<int> members;
  for (int k = 0; k < size; ++k)
    members.push_back(parent.members().empty()
                          ? base + k * stride
                          : parent.members()[size_t(base + k * stride)]);
  made->setMembers(std::move(members));
  c = remember(made.release());
  return *c;
}

void abortJob(int code) {
  std::vector<Communicator *> all;
  {
    std::lock_guard<std::mutex> lock(made().mu);
    all = made().all;
  }
  for (Communicator *c : all)
    c->abort(code);
#ifdef MOERT_HAVE_MPI
  abortMpiJob(code); // MPI initialized but no communicator made
#endif
}

} // namespace moert::comm
