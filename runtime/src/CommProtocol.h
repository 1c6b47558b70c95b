//===- CommProtocol.h - what the communication backends share ---*- C++ -*-===//
//
// The small internal interface every backend (SelfComm, MpiComm, NcclComm,
// StagedComm) depends on, and nothing else of the communication layer:
// the launch settings (CommEnv.cpp) and the exchange protocol
// (CommProtocol.cpp): collective numbering and the test faults, the
// all_to_all header with its checks, the row plan, the element conversions
// and the statistics of moert_comm_stats. Which backend runs is chosen
// in CommBackend.cpp (CommBackends.h); the C entry points are CommApi.cpp.
//
// Errors are thrown (moert::Error): before a communicator exists with
// moert::fail, inside a collective with Communicator::fail, which also
// aborts the communicator.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_SRC_COMMPROTOCOL_H
#define MOERT_SRC_COMMPROTOCOL_H

#include "moert/Comm.h"
#include "moert/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moert::comm {

//===----------------------------------------------------------------------===//
// Launch settings (CommEnv.cpp)
//===----------------------------------------------------------------------===//

/// The launch environment, read and checked once.
struct LaunchEnv {
  int rank = -1;      ///< RANK, -1 when unset
  int worldSize = -1; ///< WORLD_SIZE, -1 when unset
  int localRank = -1; ///< LOCAL_RANK, -1 when unset
  /// Set by an MPI launcher (mpirun, srun --mpi, hydra): its variable's name.
  const char *mpiLauncherVar = nullptr;
  int mpiLauncherSize = -1; ///< the size that launcher announces, if any
};
/// Throws moert::Error naming a malformed or inconsistent variable.
const LaunchEnv &launchEnv();

/// MOERT_COMM_BACKEND, checked: "auto", "mpi", "self" or "nccl".
const std::string &backendChoice();

/// A non-negative integer variable; -1 when unset or empty. Anything else
/// is an error naming the variable.
int envInt(const char *var);

//===----------------------------------------------------------------------===//
// The exchange protocol (CommProtocol.cpp)
//===----------------------------------------------------------------------===//

/// Collective kinds, for messages and the consistency check between ranks.
enum class Kind : int64_t { AllToAll = 1, AllReduce = 2, Barrier = 3 };
const char *name(Kind kind);

/// Counts collectives and injects the test faults (MOERT_TEST_FAIL_RANK,
/// MOERT_TEST_STALL_RANK at collective MOERT_TEST_FAULT_AT). Returns the
/// collective's label, e.g. "all_to_all #2 (f32 rows)". A communicator that
/// failed earlier fails again here, naming the first failure.
struct Sequence {
  uint64_t total = 0;
  uint64_t perKind[4] = {0, 0, 0, 0};
  std::string enter(Communicator &comm, Kind kind, const char *what);
};

/// Checks send counts against the rows there are (an error names the sizes)
/// and returns their sum.
int64_t checkSendCounts(Communicator &comm, const std::string &label,
                        int64_t sendRows, const int32_t *sendCounts,
                        int64_t count);

/// Peers must be at the same collective of the same kind: `h` starts with a
/// peer's [sequence number, kind]; fails naming both ranks' collectives.
void checkHeader(Communicator &comm, const std::string &label, int peer,
                 const int64_t *h, uint64_t seqTotal, Kind kind);

/// The words of an all_to_all header before the counts.
constexpr int64_t kAllToAllHeaderWords = 5;

/// A RowLayout as one header word (the ranks must agree on it).
int64_t layoutWord(const RowLayout &layout);

/// This rank's all_to_all header for every rank, kAllToAllHeaderWords +
/// slots int64 each: [sequence, kind, rowBytes, slots, layout, sendCounts
/// for that rank...].
std::vector<int64_t> allToAllHeaders(int size, uint64_t seqTotal,
                                     int64_t rowBytes, int64_t slots,
                                     const RowLayout &layout,
                                     const int32_t *sendCounts);

/// Reads every rank's all_to_all header (allToAllHeaders). Checks that
/// the ranks agree and that the rows fit recvCapacity (failing with a
/// message naming the rank otherwise), writes the received counts to
/// recvCounts (size * slots, rank-major) and counts the bytes sent to peers.
/// Where the rows lie is planRows' part.
void readAllToAllHeaders(Communicator &comm, const std::string &label,
                         const std::vector<int64_t> &in, uint64_t seqTotal,
                         int64_t rowBytes, int64_t slots,
                         const RowLayout &layout, const int32_t *sendCounts,
                         int32_t *recvCounts, int64_t recvCapacity);

/// Rows [row, row + rows) of an exchange's input or result.
struct RowSegment {
  int64_t row, rows;
};

/// Where the rows to (send) or from (recv) each rank lie, rank by rank, in
/// the order they travel between that pair of ranks: one segment per rank
/// when both sides are peer-major, else one per slot on both sides (so that
/// the messages of a pair match whatever each side's layout), and the rows
/// of the result to zero.
struct RowPlan {
  std::vector<std::vector<RowSegment>> send, recv;
  std::vector<RowSegment> zero;
};

/// The segments of rows counted by `counts` ([size * slots], rank-major) in
/// a peer-major or slot-major layout (RowLayout), and the rows they span.
std::vector<std::vector<RowSegment>> rowSegments(const int32_t *counts,
                                                 int size, int64_t slots,
                                                 bool slotMajor, int64_t padTo,
                                                 bool perSlot, int64_t &extent);

/// The row plan of an exchange whose counts are known on both sides; the
/// rows must fit the input (`sendRows`) and the result (`recvCapacity`),
/// else the collective fails with a message naming the sizes.
RowPlan planRows(Communicator &comm, const std::string &label,
                 const int32_t *sendCounts, const int32_t *recvCounts,
                 int64_t slots, const RowLayout &layout, int64_t sendRows,
                 int64_t recvCapacity);

/// Pairs of a's and b's elements, in order (equal lengths).
template <typename T>
std::vector<std::pair<T, T>> zipped(const std::vector<T> &a,
                                    const std::vector<T> &b) {
  std::vector<std::pair<T, T>> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    out.emplace_back(a[i], b[i]);
  return out;
}

/// bf16 / f16 <-> f32, round to nearest even.
float toFloat(const void *p, DType type, int64_t i);
void fromFloat(void *p, DType type, int64_t i, float value);

/// Adds bytes of rows an all_to_all sent to other ranks (moert_comm_stats).
void countBytesToPeers(uint64_t bytes);
/// Adds a call of a collective entry point and the seconds it took
/// (`newCall`: a new collective, not the wait of a started one).
void countCall(bool allToAll, bool newCall, double seconds);
moert_comm_stats statsSnapshot();
void resetStats();

//===----------------------------------------------------------------------===//
// Device memory (StagedComm.cpp)
//===----------------------------------------------------------------------===//

/// Whether `p` points to device memory. Asks the CUDA driver only when this
/// process has loaded it already (no driver, no device memory), so CPU
/// programs never load or initialize CUDA.
bool isDevicePointer(const void *p);

} // namespace moert::comm

#endif
