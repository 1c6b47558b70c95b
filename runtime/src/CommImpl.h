//===- CommImpl.h - what the communication backends share -------*- C++ -*-===//
#ifndef MOERT_SRC_COMMIMPL_H
#define MOERT_SRC_COMMIMPL_H

#include "moert/Comm.h"

#include <cstdint>
#include <memory>
#include <string>

namespace moert::comm {

/// The launch environment, read and checked once.
struct LaunchEnv {
  int rank = -1;      ///< RANK, -1 when unset
  int worldSize = -1; ///< WORLD_SIZE, -1 when unset
  int localRank = -1; ///< LOCAL_RANK, -1 when unset
  /// Set by an MPI launcher (mpirun, srun --mpi, hydra): its variable's name.
  const char *mpiLauncherVar = nullptr;
  int mpiLauncherSize = -1; ///< the size that launcher announces, if any
};
const LaunchEnv &launchEnv();

/// Prints "moert: error: <message>" and exits 1 (before a communicator
/// exists, or where there is nothing to abort).
[[noreturn]] void fatal(const std::string &message);

/// Collective kinds, for messages and the consistency check between ranks.
enum class Kind : int64_t { AllToAll = 1, AllReduce = 2, Barrier = 3 };
const char *name(Kind kind);

/// Counts collectives and injects the test faults (MOERT_TEST_FAIL_RANK,
/// MOERT_TEST_STALL_RANK at collective MOERT_TEST_FAULT_AT). Returns the
/// collective's label, e.g. "all_to_all #2 (f32 rows)".
struct Sequence {
  uint64_t total = 0;
  uint64_t perKind[4] = {0, 0, 0, 0};
  std::string enter(int rank, Kind kind, const char *what);
};

/// Checks send counts against the rows there are (an error names the sizes)
/// and returns their sum.
int64_t checkSendCounts(Communicator &comm, const std::string &label,
                        int64_t sendRows, const int32_t *sendCounts,
                        int64_t count);

/// bf16 / f16 <-> f32, round to nearest even.
float toFloat(const void *p, DType type, int64_t i);
void fromFloat(void *p, DType type, int64_t i, float value);

#ifdef MOERT_HAVE_MPI
std::unique_ptr<Communicator> createMpiCommunicator(const LaunchEnv &env);
#endif

} // namespace moert::comm

#endif
