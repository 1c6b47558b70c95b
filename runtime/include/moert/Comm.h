//===- Comm.h - libmoert's communication layer ------------------*- C++ -*-===//
//
// The collectives expert-parallel programs need, over a communicator of N
// ranks (one process each):
//
//   allToAllV    variable-size exchange of rows: counts first, then rows
//   allReduce    element-wise sum (f32, f64, bf16, f16, i32, i64)
//   barrier, abort
//
// Backends: "mpi" (MPI_COMM_WORLD, when libmoert was built with MPI), "self"
// (one rank, nothing to exchange) and "nccl" (one process per GPU, device
// buffers; libnccl opened at run time, see below).
//
// Launch: `mpirun -np N prog` or a torchrun-style environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). With MPI, RANK and
// WORLD_SIZE, when set, must agree with MPI's view; a variable that is
// malformed, inconsistent or missing (RANK without WORLD_SIZE, ...) is an
// error naming it.
//
// MOERT_COMM_BACKEND=auto|mpi|self|nccl picks the backend. auto (default):
//   - host buffers: mpi under an MPI launcher, self for one process; a
//     torchrun-style launch of several ranks (no MPI launcher) takes nccl
//     (host buffers staged through device memory), or stops with a message
//     when NCCL or a GPU is missing;
//   - device buffers (the C entry points ask the CUDA driver,
//     cuPointerGetAttribute, and only when the process has loaded it): nccl
//     when more than one rank was launched, else a copy;
// mpi: MPI, device buffers copied through host memory (no NCCL needed);
// self: one rank; nccl: NCCL for every buffer.
//
// Errors (moert/Error.h): nothing here ends the process on an error. A
// collective that fails throws moert::Error naming the rank, the collective
// and what went wrong (exit status 2 for a peer that failed or timed out, 1
// otherwise) after aborting its communicator (Communicator::fail); the C
// entry points turn it into the sticky error. The tool that catches it
// prints it and calls abortJob, which under MPI ends every rank with
// MPI_Abort, and exits non-zero.
//
// Faults: every collective is non-blocking underneath and polled against a
// deadline, MOERT_COMM_TIMEOUT seconds (default 300). A rank that does not
// arrive in time is named with the collective (`all_to_all #3 (f32 rows):
// timed out after 300 s waiting for rank 1`) and the collective fails (with
// NCCL, ncclCommAbort first), so that every rank stops within the deadline:
// no rank hangs forever. MPI and NCCL errors are returned, not fatal inside
// them, and reported by name. A process whose MPI communicator failed is not
// finalized at exit (MPI_Finalize would wait for the failed rank): MPI_Abort
// ends it and the job. For tests, MOERT_TEST_FAIL_RANK=r makes rank r exit
// (status 3, no finalization, as if it crashed: the one deliberate exit in
// the library, a test hook selected by that variable) and
// MOERT_TEST_STALL_RANK=r makes rank r sleep (MOERT_TEST_STALL_SECONDS,
// default 3600) at collective MOERT_TEST_FAULT_AT (default 1).
//
// The communicator is created on first use (MPI_Init_thread unless MPI is
// already initialized) and finalized at exit.
//
// GPUs: the same C entry points receive device buffers from GPU artifacts
// (-moe-gpu-pipeline keeps the calls on the host, with memref descriptors
// of device memory). The NCCL backend (src/NcclComm.cpp):
//   - libnccl.so.2 is dlopen'ed on first use (MOERT_NCCL_LIBRARY names
//     another path); libmoert links neither NCCL nor CUDA, and builds and
//     loads without them; a missing or wrong library is an error naming it;
//   - device: the runtime's GPU (MOERT_DEVICE, LOCAL_RANK, else the MPI
//     launcher's local rank, e.g. OMPI_COMM_WORLD_LOCAL_RANK);
//   - bootstrap: the ncclUniqueId goes through MPI when launched by mpirun,
//     else through a TCP rendezvous at MASTER_ADDR:MASTER_PORT (rank 0
//     listens; MOERT_STORE_PORT overrides the port, and under torchrun's
//     agent store, TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT + 1 is
//     used);
//   - streams: a collective runs on the communicator's own stream and is
//     complete when the call returns. Compiled programs synchronize their
//     stream before each call (-gpu-async-region) and start a new one after
//     it; the runtime also synchronizes the context on entry, so the input
//     buffers are written whoever called (a started exchange,
//     allToAllVStart, does not: that would wait for the exchanges still in
//     flight; its caller has finished writing the input);
//   - two communicators over the same ranks: rows on one (its stream), and
//     the headers and counts of started exchanges on the other, so that a
//     start does not queue behind the rows still in flight; a blocking
//     collective first waits, against the deadline, for rows still in
//     flight (its synchronizations would otherwise wait on them with none);
//   - all_to_all: counts copied to the host and checked, then a header (the
//     collective's number, kind, row size, row layout) and the counts
//     exchanged with grouped ncclSend/ncclRecv and copied back to size the
//     rows, then the rows with a second group, one message per peer (a
//     slot-major side staged through device memory; own rows and staged
//     pieces copied by one kernel launch, zeros where nothing arrives);
//     all_reduce: the same header exchange, then
//     ncclAllReduce (bf16/f16 on more than 2 ranks summed in f32 on the
//     host: one rounding); barrier: the header exchange;
//   - faults: the host polls the stream and ncclCommGetAsyncError against
//     MOERT_COMM_TIMEOUT, then ncclCommAbort and the collective fails
//     (status 2) naming the rank, the collective and the phase; calls that
//     block inside NCCL (ncclCommInitRank, connection setup) cannot return
//     an error: a watchdog a few seconds past the deadline ends the process
//     (status 2) so that the job does not hang.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_COMM_H
#define MOERT_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <memory>
#include <string>
#include <vector>

namespace moert::comm {

/// Element types the reductions know.
enum class DType { F32, F64, BF16, F16, I32, I64 };
const char *name(DType type);
size_t bytes(DType type);

/// Where an exchange's rows lie on one side (input or result).
/// Peer-major (the default): by rank, then slot, one contiguous block per
/// rank. Slot-major: by slot, then rank: slot j's rows (those of every rank)
/// start where the earlier slots' end, rounded up to a multiple of padTo;
/// rows between slots and after the last one are not sent (input) or are
/// zero (result). The exchange of a slot-major result in reverse is the one
/// with a slot-major input.
struct RowLayout {
  bool slotMajorSend = false;
  bool slotMajorRecv = false;
  int64_t padTo = 1;
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual const char *backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Variable-size exchange of rows of `rowBytes` bytes. `sendCounts` has
  /// `slots * size()` entries: `slots` consecutive counts per destination
  /// rank, in rank order; the rows of `send` go out in that order.
  /// `recvCounts` (same length) receives, at `src * slots + j`, what rank
  /// `src` sent for slot `j`; `recv` the rows, by source rank then slot, and
  /// zeros beyond the received ones. More rows than `recvCapacity`, or send
  /// counts that are negative or exceed `sendRows`, are errors naming the
  /// sizes. `what` names the collective in messages ("f32 rows"). `layout`
  /// orders either side by slot instead (see RowLayout); all ranks pass the
  /// same one.
  virtual void allToAllV(const void *send, int64_t sendRows,
                         const int32_t *sendCounts, int64_t slots,
                         int64_t rowBytes, void *recv, int64_t recvCapacity,
                         int32_t *recvCounts, const char *what,
                         const RowLayout &layout = RowLayout()) = 0;

  /// An exchange allToAllVStart began: its rows are in place after wait().
  class Pending {
  public:
    virtual ~Pending() = default;
    /// Returns once the rows are in `recv` and `send` is no longer read. A
    /// rank that does not take part within MOERT_COMM_TIMEOUT fails the
    /// exchange (as for the blocking collectives).
    virtual void wait() = 0;
  };

  /// allToAllV whose row transfer runs in the background: the counts are
  /// exchanged (and `recvCounts` written) before it returns, the rows move
  /// while the caller computes, and `send` and `recv` must be left alone
  /// until the returned exchange's wait(). Exchanges complete in the order
  /// they were started. Backends that cannot overlap (and every backend
  /// when MOERT_COMM_OVERLAP=0) finish the exchange here and return one
  /// that is complete.
  virtual std::unique_ptr<Pending>
  allToAllVStart(const void *send, int64_t sendRows, const int32_t *sendCounts,
                 int64_t slots, int64_t rowBytes, void *recv,
                 int64_t recvCapacity, int32_t *recvCounts, const char *what,
                 const RowLayout &layout = RowLayout());

  /// out[i] = sum over ranks of in[i]; `in` may equal `out`. bf16 and f16
  /// are summed in f32 and rounded once (to nearest even).
  virtual void allReduceSum(const void *in, void *out, int64_t count,
                            DType type) = 0;

  /// allReduceSum that runs in the background: `in` and `out` must be left
  /// alone until the returned reduction's wait(), after which `out` holds
  /// the sums. Reductions and exchanges started on a communicator complete
  /// in the order they were started. Backends that cannot overlap (and
  /// every backend when MOERT_COMM_OVERLAP=0) finish the reduction here and
  /// return one that is complete.
  virtual std::unique_ptr<Pending> allReduceSumStart(const void *in, void *out,
                                                     int64_t count, DType type);

  virtual void barrier() = 0;

  /// Reports an error of a collective on this rank: aborts the communicator
  /// (abortCommunicator: NCCL's ncclCommAbort, so that peers blocked on
  /// this rank fail instead of waiting), remembers `message` and throws
  /// moert::Error("rank R: <message>", status). Every later collective on
  /// this communicator fails too, naming this failure.
  [[noreturn]] void fail(int status, const std::string &message);

  /// The first failure of this communicator (fail), empty while it works.
  const std::string &failure() const { return failure_; }

  /// A communicator over a group of this one's ranks (group() chooses
  /// them): `colors` disjoint groups of `size` ranks each; this rank is in
  /// group `color`, at place `key`. Collective: every rank of this
  /// communicator calls it, in the same order as its collectives. The
  /// default refuses (a backend that cannot form groups).
  virtual std::unique_ptr<Communicator> split(int color, int colors, int key,
                                              int size);

  /// The ranks of the job (world()) this communicator's ranks are, by
  /// their rank here; empty for the job's own communicators. Messages name
  /// a group's ranks by both.
  const std::vector<int> &members() const { return members_; }
  virtual void setMembers(std::vector<int> members) {
    members_ = std::move(members);
  }
  /// This rank in the job: members()[rank()], or rank().
  int jobRank() const {
    return members_.empty() ? rank() : members_[size_t(rank())];
  }

  /// For a tool's error path, after it has said why it stops: makes sure
  /// no other rank waits for this one. Under MPI, MPI_Abort ends the whole
  /// job with `code` and does not return; otherwise the communicator is
  /// aborted and this returns (the tool then exits with `code`).
  virtual void abort(int code) = 0;

protected:
  /// Tears the communicator down after a failure so that no collective
  /// waits on it any more (NCCL: ncclCommAbort); nothing by default.
  virtual void abortCommunicator() {}

private:
  std::string failure_;
  std::vector<int> members_;
};

/// abort(code) on every communicator made so far, and MPI_Abort if MPI was
/// initialized without one (a launch that failed half way). For tools'
/// error paths: under MPI this ends the job; otherwise it returns.
void abortJob(int code);

/// The world communicator, created on first use. Launch errors (bad
/// environment, a backend that is not built) throw moert::Error; the next
/// call tries again.
Communicator &world();

/// The communicator for device buffers (the C entry points use it when
/// they are given device memory): NCCL, or MPI through host memory (see
/// "Backends" above). Same ranks as world().
Communicator &deviceWorld();

/// The group of `parent`'s ranks that holds this rank: `size` ranks
/// `stride` apart, starting at `rank / (size * stride) * (size * stride) +
/// rank % stride`. An axis `a` of a row-major grid over the ranks (rank =
/// its linear index) is size = shape[a], stride = the product of the later
/// axes' sizes; adjacent axes a..b are their sizes' product with b's stride.
/// `parent` itself when size == parent.size(). Made on first use (every
/// rank of `parent` must ask for the same groups in the same order: an SPMD
/// program's collectives do) after a barrier of `parent`, so that a rank
/// that is gone is reported within the deadline; kept until exit. Throws
/// moert::Error when size * stride does not divide parent.size().
Communicator &group(Communicator &parent, int size, int stride);

/// Seconds a collective may wait for the other ranks (MOERT_COMM_TIMEOUT).
double timeoutSeconds();

/// Whether started exchanges may run in the background (MOERT_COMM_OVERLAP,
/// 1 by default; 0 makes every start complete its exchange, for measuring
/// what the overlap gains).
bool overlapEnabled();

} // namespace moert::comm
#endif

#ifdef __cplusplus
extern "C" {
#endif

// --- what compiled programs call (-convert-moe-to-runtime) ---
//
// Memref arguments are MLIR's C-interface descriptors (a pointer to
// {allocated, aligned, offset, sizes[rank], strides[rank]}), rows contiguous;
// the `_mlir_ciface_` prefix is MLIR's name for a function taking them (the
// program's declaration `func.func private @moert_all_to_all_f32(...)
// attributes {llvm.emit_c_interface}` calls it). Every collective names its
// ranks: `group_size` ranks `group_stride` apart, the group holding this
// rank (comm::group: an axis, or adjacent axes, of the program's row-major
// shard.grid), of a program compiled for `grid_size` ranks, which must be
// the number launched.

struct moert_memref1d {
  void *allocated;
  void *aligned;
  int64_t offset;
  int64_t sizes[1];
  int64_t strides[1];
};
struct moert_memref2d {
  void *allocated;
  void *aligned;
  int64_t offset;
  int64_t sizes[2];
  int64_t strides[2];
};

/// moe.all_to_all: rows [R, H] and send counts [C] (C/P per destination
/// rank) in; received rows [R2, H] (source rank then slot, zero-filled) and
/// received counts [C] out. The 8-bit types (an MX tensor's E4M3 or E5M2
/// data and its E8M0 scales) are moved as bytes.
#define MOERT_DECLARE_ALL_TO_ALL(T)                                            \
  void _mlir_ciface_moert_all_to_all_##T(                                      \
      struct moert_memref2d *input, struct moert_memref1d *send_counts,        \
      struct moert_memref2d *result, struct moert_memref1d *recv_counts,       \
      int64_t group_size, int64_t group_stride, int64_t grid_size);
MOERT_DECLARE_ALL_TO_ALL(f32)
MOERT_DECLARE_ALL_TO_ALL(bf16)
MOERT_DECLARE_ALL_TO_ALL(f16)
MOERT_DECLARE_ALL_TO_ALL(f64)
MOERT_DECLARE_ALL_TO_ALL(f8e4m3fn)
MOERT_DECLARE_ALL_TO_ALL(f8e5m2)
MOERT_DECLARE_ALL_TO_ALL(f8e8m0fnu)
#undef MOERT_DECLARE_ALL_TO_ALL

/// The same exchange in two calls, so that compute runs while rows travel
/// (-convert-moe-to-runtime{overlap=true}): `start` checks the buffers,
/// exchanges the counts (recv_counts is written when it returns) and starts
/// the rows, returning a handle; `wait` returns once the rows are in
/// `result`. The program keeps `input` and `result` untouched in between and
/// passes them to `wait` again (checked against the handle). A compiled GPU
/// program synchronizes its stream before each call, so the input is
/// written when `start` runs; the rows then travel on the communicator's
/// stream while the program's next kernels run on its own.
#define MOERT_DECLARE_ALL_TO_ALL_ASYNC(T)                                      \
  int64_t _mlir_ciface_moert_all_to_all_start_##T(                             \
      struct moert_memref2d *input, struct moert_memref1d *send_counts,        \
      struct moert_memref2d *result, struct moert_memref1d *recv_counts,       \
      int64_t group_size, int64_t group_stride, int64_t grid_size);            \
  void _mlir_ciface_moert_all_to_all_wait_##T(int64_t handle,                  \
                                              struct moert_memref2d *input,    \
                                              struct moert_memref2d *result);
MOERT_DECLARE_ALL_TO_ALL_ASYNC(f32)
MOERT_DECLARE_ALL_TO_ALL_ASYNC(bf16)
MOERT_DECLARE_ALL_TO_ALL_ASYNC(f16)
MOERT_DECLARE_ALL_TO_ALL_ASYNC(f64)
MOERT_DECLARE_ALL_TO_ALL_ASYNC(f8e4m3fn)
MOERT_DECLARE_ALL_TO_ALL_ASYNC(f8e5m2)
MOERT_DECLARE_ALL_TO_ALL_ASYNC(f8e8m0fnu)
#undef MOERT_DECLARE_ALL_TO_ALL_ASYNC

/// Both of the above with either side ordered by slot (moe.all_to_all's
/// slot_major_input / slot_major_result; see RowLayout): `layout` bit 0 makes
/// the input slot-major, bit 1 the result; `pad_to` aligns the slots of a
/// slot-major side. The started form is waited for with
/// moert_all_to_all_wait_T.
#define MOERT_DECLARE_ALL_TO_ALL_SLOTS(T)                                      \
  void _mlir_ciface_moert_all_to_all_slots_##T(                                \
      struct moert_memref2d *input, struct moert_memref1d *send_counts,        \
      struct moert_memref2d *result, struct moert_memref1d *recv_counts,       \
      int64_t group_size, int64_t group_stride, int64_t grid_size,             \
      int64_t layout, int64_t pad_to);                                         \
  int64_t _mlir_ciface_moert_all_to_all_slots_start_##T(                       \
      struct moert_memref2d *input, struct moert_memref1d *send_counts,        \
      struct moert_memref2d *result, struct moert_memref1d *recv_counts,       \
      int64_t group_size, int64_t group_stride, int64_t grid_size,             \
      int64_t layout, int64_t pad_to);
MOERT_DECLARE_ALL_TO_ALL_SLOTS(f32)
MOERT_DECLARE_ALL_TO_ALL_SLOTS(bf16)
MOERT_DECLARE_ALL_TO_ALL_SLOTS(f16)
MOERT_DECLARE_ALL_TO_ALL_SLOTS(f64)
MOERT_DECLARE_ALL_TO_ALL_SLOTS(f8e4m3fn)
MOERT_DECLARE_ALL_TO_ALL_SLOTS(f8e5m2)
MOERT_DECLARE_ALL_TO_ALL_SLOTS(f8e8m0fnu)
#undef MOERT_DECLARE_ALL_TO_ALL_SLOTS

/// shard.all_reduce (sum), on the flattened tensor: result = sum of input.
#define MOERT_DECLARE_ALL_REDUCE(T)                                            \
  void _mlir_ciface_moert_all_reduce_sum_##T(                                  \
      struct moert_memref1d *input, struct moert_memref1d *result,             \
      int64_t group_size, int64_t group_stride, int64_t grid_size);
MOERT_DECLARE_ALL_REDUCE(f32)
MOERT_DECLARE_ALL_REDUCE(f64)
MOERT_DECLARE_ALL_REDUCE(bf16)
MOERT_DECLARE_ALL_REDUCE(f16)
MOERT_DECLARE_ALL_REDUCE(i32)
MOERT_DECLARE_ALL_REDUCE(i64)
#undef MOERT_DECLARE_ALL_REDUCE

/// The same sum in two calls, so that compute runs while it travels
/// (-convert-moe-to-runtime{overlap=true}): `start` checks the buffers and
/// starts the reduction, returning a handle; `wait` returns once `result`
/// holds the sums. The program leaves `input` and `result` untouched in
/// between and passes them to `wait` again (checked against the handle).
#define MOERT_DECLARE_ALL_REDUCE_ASYNC(T)                                      \
  int64_t _mlir_ciface_moert_all_reduce_sum_start_##T(                         \
      struct moert_memref1d *input, struct moert_memref1d *result,             \
      int64_t group_size, int64_t group_stride, int64_t grid_size);            \
  void _mlir_ciface_moert_all_reduce_sum_wait_##T(                             \
      int64_t handle, struct moert_memref1d *input,                            \
      struct moert_memref1d *result);
MOERT_DECLARE_ALL_REDUCE_ASYNC(f32)
MOERT_DECLARE_ALL_REDUCE_ASYNC(f64)
MOERT_DECLARE_ALL_REDUCE_ASYNC(bf16)
MOERT_DECLARE_ALL_REDUCE_ASYNC(f16)
MOERT_DECLARE_ALL_REDUCE_ASYNC(i32)
MOERT_DECLARE_ALL_REDUCE_ASYNC(i64)
#undef MOERT_DECLARE_ALL_REDUCE_ASYNC

/// shard.process_linear_index: this process's rank (its linear index in
/// the grid).
int32_t moert_comm_rank(void);
/// The number of ranks launched.
int32_t moert_comm_size(void);
void moert_comm_barrier(void);
/// For a program's error path: prints `message` and stops the other ranks
/// (abortJob): under MPI the job ends with `code`; otherwise this returns
/// and the caller exits.
void moert_comm_abort(int32_t code, const char *message);

/// What the collective entry points above did in this process: calls, the
/// seconds spent in them (wall clock, from entry to return; for a started
/// exchange, the time in start plus the time in wait: what the program was
/// held up, not what the rows took) and the bytes of rows sent to other ranks
/// by all_to_all.
struct moert_comm_stats {
  uint64_t all_to_all_calls;
  double all_to_all_seconds;
  uint64_t all_to_all_bytes_to_peers;
  uint64_t all_reduce_calls;
  double all_reduce_seconds;
};
void moert_comm_get_stats(struct moert_comm_stats *stats);
void moert_comm_reset_stats(void);

#ifdef __cplusplus
}
#endif

#endif
