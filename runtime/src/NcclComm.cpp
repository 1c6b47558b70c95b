//===- NcclComm.cpp - collectives on device buffers: NCCL, or staged ------===//
//
// The NCCL backend: one process per GPU, the collectives of Communicator on
// device buffers (host buffers are staged through device memory).
//
// libnccl is opened at run time, like the CUDA driver (MOERT_NCCL_LIBRARY
// names it, else libnccl.so.2): libmoert has no link-time dependency on it
// and loads on machines without NCCL or a GPU. The few NCCL declarations it
// needs are written out below (nccl.h's C ABI, stable since NCCL 2.7), so
// building needs no nccl.h either.
//
// Streams: every collective runs on the communicator's own stream and is
// complete when the call returns. Compiled GPU programs synchronize their
// stream before calling the runtime (-gpu-async-region puts a host wait
// before every call) and start a new one after it; other callers must have
// finished writing the input buffers, and the runtime synchronizes the
// context first (cuCtxSynchronize, under the watchdog) to be safe.
//
// Two NCCL communicators over the same ranks, each with its stream: `data`
// carries the rows, the reductions and the blocking collectives' headers;
// `control` the headers and counts of started exchanges (allToAllVStart),
// which must not queue behind rows still in flight. A started exchange
// skips the context synchronization (it would wait for those rows; the
// caller has written its inputs), exchanges the counts on `control`, enqueues
// the rows on `data` and records an event there; its wait polls the event.
//
// all_to_all: (1) the send counts are copied to the host and checked;
// (2) each pair of ranks exchanges, with grouped ncclSend/ncclRecv, a header
// (the collective's number and kind, the row size, the number of counts)
// and the counts, which are copied back to the host: they size the row
// exchange, and a header that does not match means the ranks run different
// programs; (3) the rows, one grouped ncclSend/ncclRecv per peer with
// something to send or receive (a slot-major side staged through a device
// buffer, gathered or scattered by segment), while this rank's own rows are
// copied and the rows nothing is received into zeroed on a third stream
// (copy engines, concurrent with NCCL's kernels; the data stream waits).
// all_reduce: the same header exchange, then ncclAllReduce (bf16 and f16 on
// more than 2 ranks are widened to f32 on the host first: the contract is
// one rounding, and NCCL's ring rounds at every step).
// barrier: the header exchange alone.
//
// Faults: the host polls the stream and ncclCommGetAsyncError; past
// MOERT_COMM_TIMEOUT seconds, or on an asynchronous NCCL error, it calls
// ncclCommAbort and the collective fails (moert::Error, status 2) naming the
// rank, the collective and the phase; the tool then ends the job (abortJob:
// MPI_Abort when launched by MPI). Calls that block inside NCCL
// (ncclCommInitRank, connection setup in ncclGroupEnd) cannot return an
// error: they are guarded by a watchdog thread that ends the process
// (status 2) a little after the same deadline, the library's one exit on a
// fault, so that a dead peer never hangs the job.
//
//===----------------------------------------------------------------------===//

#include "CommBackends.h"
#include "CudaDriver.h"
#include "moert/Gpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>

namespace moert::comm {
namespace {

using cuda::driver;
using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// NCCL's C ABI, loaded at run time
//===----------------------------------------------------------------------===//

namespace nccl {
typedef struct ncclComm *Comm;
struct UniqueId {
  char internal[128];
};
// ncclResult_t
constexpr int Success = 0, InProgress = 7;
// ncclDataType_t
constexpr int Uint8 = 1, Int32 = 2, Int64 = 4, Float16 = 6, Float32 = 7,
              Float64 = 8, Bfloat16 = 9;
// ncclRedOp_t
constexpr int Sum = 0;
} // namespace nccl

struct NcclApi {
  int (*getVersion)(int *) = nullptr;
  int (*getUniqueId)(nccl::UniqueId *) = nullptr;
  int (*commInitRank)(nccl::Comm *, int, nccl::UniqueId, int) = nullptr;
  int (*commAbort)(nccl::Comm) = nullptr;
  int (*commGetAsyncError)(nccl::Comm, int *) = nullptr;
  const char *(*getErrorString)(int) = nullptr;
  const char *(*getLastError)(nccl::Comm) = nullptr; // 2.13+, optional
  int (*allReduce)(const void *, void *, size_t, int, int, nccl::Comm,
                   CUstream) = nullptr;
  int (*send)(const void *, size_t, int, int, nccl::Comm, CUstream) = nullptr;
  int (*recv)(void *, size_t, int, int, nccl::Comm, CUstream) = nullptr;
  int (*groupStart)() = nullptr;
  int (*groupEnd)() = nullptr;
  int version = 0;
  std::string path;
  std::string versionText() const {
    int major, minor, patch;
    if (version >= 10000) { // NCCL_VERSION since 2.9: X*10000 + Y*100 + Z
      major = version / 10000;
      minor = version % 10000 / 100;
    } else {
      major = version / 1000;
      minor = version % 1000 / 100;
    }
    patch = version % 100;
    return std::to_string(major) + "." + std::to_string(minor) + "." +
           std::to_string(patch);
  }
};

/// Opens libnccl once; nullptr and `error` when it cannot be used.
const NcclApi *loadNccl(std::string &error) {
  static NcclApi api;
  static std::string failure;
  static bool loaded = false;
  static std::once_flag once;
  std::call_once(once, [] {
    const char *override = std::getenv("MOERT_NCCL_LIBRARY");
    void *handle = nullptr;
    std::string tried;
    if (override && *override) {
      handle = dlopen(override, RTLD_NOW | RTLD_LOCAL);
      tried = std::string("MOERT_NCCL_LIBRARY=") + override;
    } else {
      for (const char *name : {"libnccl.so.2", "libnccl.so"})
        if ((handle = dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
          tried = name;
          break;
        }
      if (!handle)
        tried = "libnccl.so.2";
    }
    if (!handle) {
      const char *why = dlerror();
      failure =
          "cannot load the NCCL library (" + tried +
          "): " + (why ? why : "unknown error") +
          (override && *override ? ""
                                 : "; install NCCL (Ubuntu: libnccl2) or set "
                                   "MOERT_NCCL_LIBRARY to libnccl.so.2's path");
      return;
    }
    api.path = override && *override ? override : tried;
    char origin[4096];
    if (dlinfo(handle, RTLD_DI_ORIGIN, origin) == 0 && !(override && *override))
      api.path = std::string(origin) + "/" + tried;
    struct Symbol {
      const char *name;
      void **slot;
      bool required;
    } symbols[] = {
        {"ncclGetVersion", reinterpret_cast<void **>(&api.getVersion), true},
        {"ncclGetUniqueId", reinterpret_cast<void **>(&api.getUniqueId), true},
        {"ncclCommInitRank", reinterpret_cast<void **>(&api.commInitRank),
         true},
        {"ncclCommAbort", reinterpret_cast<void **>(&api.commAbort), true},
        {"ncclCommGetAsyncError",
         reinterpret_cast<void **>(&api.commGetAsyncError), true},
        {"ncclGetErrorString", reinterpret_cast<void **>(&api.getErrorString),
         true},
        {"ncclGetLastError", reinterpret_cast<void **>(&api.getLastError),
         false},
        {"ncclAllReduce", reinterpret_cast<void **>(&api.allReduce), true},
        {"ncclSend", reinterpret_cast<void **>(&api.send), true},
        {"ncclRecv", reinterpret_cast<void **>(&api.recv), true},
        {"ncclGroupStart", reinterpret_cast<void **>(&api.groupStart), true},
        {"ncclGroupEnd", reinterpret_cast<void **>(&api.groupEnd), true},
    };
    for (Symbol &s : symbols) {
      *s.slot = dlsym(handle, s.name);
      if (!*s.slot && s.required) {
        failure = "the NCCL library " + api.path + " has no " + s.name +
                  ": it is not NCCL, or older than 2.7 (libmoert needs "
                  "ncclSend/ncclRecv)";
        return;
      }
    }
    if (api.getVersion(&api.version) != nccl::Success) {
      failure = "ncclGetVersion failed in " + api.path;
      return;
    }
    if (api.version < 10000 && api.version < 2700) {
      failure = "NCCL " + api.versionText() + " (" + api.path +
                ") is too old: libmoert needs NCCL 2.7 or later";
      return;
    }
    loaded = true;
  });
  if (!loaded) {
    error = failure;
    return nullptr;
  }
  return &api;
}

std::string secondsText(double t) {
  char s[32];
  std::snprintf(s, sizeof(s), "%g", t);
  return s;
}

//===----------------------------------------------------------------------===//
// The watchdog: ends the process when a blocking call outlives its deadline
//===----------------------------------------------------------------------===//

class Watchdog {
public:
  static Watchdog &get() {
    static Watchdog *w = new Watchdog(); // never destroyed: runs until exit
    return *w;
  }

  /// Ends the process with `message` unless disarmed within `seconds`.
  void arm(const std::string &message, double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    if (!started) {
      std::thread([this] { loop(); }).detach();
      started = true;
    }
    armed = true;
    text = message;
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(seconds));
    cv.notify_all();
  }

  void disarm() {
    std::lock_guard<std::mutex> lock(mu);
    armed = false;
    cv.notify_all();
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      if (!armed) {
        cv.wait(lock);
        continue;
      }
      if (Clock::now() < deadline) {
        cv.wait_until(lock, deadline);
        continue;
      }
      // The thread that armed the watchdog is blocked inside NCCL and will
      // not return: no error can reach a caller, and waiting longer would
      // hang the job. Ending the process is the only way out.
      std::fflush(stdout);
      std::fprintf(stderr, "%s\n", text.c_str());
      std::fflush(stderr);
      std::_Exit(2);
    }
  }

  std::mutex mu;
  std::condition_variable cv;
  bool started = false, armed = false;
  std::string text;
  Clock::time_point deadline;
};

/// Arms the watchdog for a scope.
struct Guard {
  Guard(const std::string &message, double seconds) {
    Watchdog::get().arm(message, seconds);
  }
  ~Guard() { Watchdog::get().disarm(); }
};

/// Extra time the watchdog gives a blocking call beyond the deadline that
/// the polling loop keeps (which then reports with more detail).
constexpr double kWatchdogGrace = 5.0;

//===----------------------------------------------------------------------===//
// CUDA helpers
//===----------------------------------------------------------------------===//

/// Makes the runtime's context current for a scope.
struct ContextScope {
  ContextScope() { MOERT_CU(driver().cuCtxPushCurrent(gpu::primaryContext())); }
  ~ContextScope() { driver().cuCtxPopCurrent(nullptr); }
};

/// A device buffer that grows as needed (contents not kept).
struct Scratch {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUdeviceptr get(size_t n) {
    if (n <= bytes)
      return ptr;
    if (ptr)
      MOERT_CU(driver().cuMemFree(ptr));
    size_t size = std::max<size_t>(n, std::max<size_t>(2 * bytes, 4096));
    MOERT_CU(driver().cuMemAlloc(&ptr, size));
    bytes = size;
    return ptr;
  }
};

CUdeviceptr dev(const void *p) { return reinterpret_cast<CUdeviceptr>(p); }

/// Device-to-device copies of many pieces in one launch: block (x, y)
/// copies piece x (its {dst, src, bytes} in the parameter table) with the
/// other blocks of column x, 16-byte words when everything is 16-byte
/// aligned, else bytes. (An exchange with slot-major sides copies pieces by
/// slot and rank; a cuMemcpyAsync each costs microseconds on the host and on
/// the GPU.) Loaded once per communicator, JIT-compiled by the driver.
constexpr int kPiecesPerLaunch = 166; // 24 bytes each, in 4 KB of parameters
const char *const kCopyPiecesPtx = R"PTX(
.version 7.0
.target sm_70
.address_size 64

.visible .entry moert_copy_pieces(
  .param .u64 p_count,
  .param .align 8 .b8 p_table[3984])
{
  .reg .pred %p<5>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<24>;

  ld.param.u64 %rd2, [p_count];
  mov.u32 %r1, %ctaid.x;
  cvt.u64.u32 %rd3, %r1;
  setp.ge.u64 %p1, %rd3, %rd2;
  @%p1 bra DONE;
  mov.u64 %rd1, p_table;
  mul.lo.u64 %rd7, %rd3, 24;
  add.u64 %rd8, %rd1, %rd7;
  ld.param.u64 %rd9, [%rd8];
  ld.param.u64 %rd10, [%rd8+8];
  ld.param.u64 %rd11, [%rd8+16];
  cvta.to.global.u64 %rd9, %rd9;
  cvta.to.global.u64 %rd10, %rd10;
  mov.u32 %r2, %ctaid.y;
  mov.u32 %r3, %nctaid.y;
  mov.u32 %r4, %tid.x;
  mov.u32 %r9, %ntid.x;
  mul.lo.u32 %r10, %r2, %r9;
  add.u32 %r10, %r10, %r4;
  cvt.u64.u32 %rd14, %r10;
  mul.lo.u32 %r11, %r3, %r9;
  cvt.u64.u32 %rd6, %r11;
  or.b64 %rd12, %rd9, %rd10;
  or.b64 %rd12, %rd12, %rd11;
  and.b64 %rd12, %rd12, 15;
  setp.ne.u64 %p2, %rd12, 0;
  @%p2 bra BYTES;
  shr.u64 %rd13, %rd11, 4;
WORDS:
  setp.ge.u64 %p3, %rd14, %rd13;
  @%p3 bra DONE;
  shl.b64 %rd15, %rd14, 4;
  add.u64 %rd16, %rd10, %rd15;
  add.u64 %rd17, %rd9, %rd15;
  ld.global.nc.v4.u32 {%r5, %r6, %r7, %r8}, [%rd16];
  st.global.v4.u32 [%rd17], {%r5, %r6, %r7, %r8};
  add.u64 %rd14, %rd14, %rd6;
  bra WORDS;
BYTES:
  setp.ge.u64 %p4, %rd14, %rd11;
  @%p4 bra DONE;
  add.u64 %rd16, %rd10, %rd14;
  add.u64 %rd17, %rd9, %rd14;
  ld.global.u8 %r5, [%rd16];
  st.global.u8 [%rd17], %r5;
  add.u64 %rd14, %rd14, %rd6;
  bra BYTES;
DONE:
  ret;
}
)PTX";

struct Piece {
  CUdeviceptr dst, src;
  uint64_t bytes;
};
static_assert(sizeof(Piece) == 24, "the kernel reads 24-byte pieces");

int ncclType(DType type) {
  switch (type) {
  case DType::F32:
    return nccl::Float32;
  case DType::F64:
    return nccl::Float64;
  case DType::BF16:
    return nccl::Bfloat16;
  case DType::F16:
    return nccl::Float16;
  case DType::I32:
    return nccl::Int32;
  case DType::I64:
    return nccl::Int64;
  }
  return nccl::Float32;
}

//===----------------------------------------------------------------------===//
// The NCCL communicator
//===----------------------------------------------------------------------===//

class NcclComm final : public Communicator {
public:
  NcclComm(const NcclApi &api, const NcclBootstrap &b)
      : nc(api), rank_(b.rank), size_(b.size), mpi(b.mpi) {
    ContextScope scope; // initializes the device: a missing GPU stops here
    MOERT_CU(driver().cuStreamCreate(&data.stream, CU_STREAM_NON_BLOCKING));
    MOERT_CU(driver().cuStreamCreate(&control.stream, CU_STREAM_NON_BLOCKING));
    MOERT_CU(driver().cuStreamCreate(&local, CU_STREAM_NON_BLOCKING));
    MOERT_CU(driver().cuEventCreate(&localDone, CU_EVENT_DISABLE_TIMING));
    // Without it (a driver that cannot compile the PTX) pieces are copied
    // one by one.
    if (driver().cuModuleLoadData(&copyModule, kCopyPiecesPtx) ==
            CUDA_SUCCESS &&
        driver().cuModuleGetFunction(&copyKernel, copyModule,
                                     "moert_copy_pieces") != CUDA_SUCCESS)
      copyKernel = nullptr;
    double timeout = timeoutSeconds();
    // Two ids: the rows' communicator and the control one.
    nccl::UniqueId ids[2] = {};
    static_assert(sizeof(ids) % 8 == 0, "ncclUniqueId is 128 bytes");
    if (rank_ == 0)
      for (nccl::UniqueId &id : ids)
        check(nc.getUniqueId(&id), "ncclGetUniqueId", "setup");
    if (b.parent) {
      // Each group's rank 0 puts its ids in its group's slot; the sum over
      // the communicator being split gives every rank every group's ids.
      const size_t words = sizeof(ids) / 8;
      std::vector<int64_t> all(words * size_t(b.colors), 0);
      if (rank_ == 0)
        std::memcpy(&all[words * size_t(b.color)], ids, sizeof(ids));
      b.parent->allReduceSum(all.data(), all.data(), int64_t(all.size()),
                             DType::I64);
      std::memcpy(ids, &all[words * size_t(b.color)], sizeof(ids));
    } else if (size_ > 1) {
      if (mpi) {
        // Rank 0's ids, everyone else's zeros: the sum is the ids.
        std::vector<int64_t> words(sizeof(ids) / 8, 0);
        if (rank_ == 0)
          std::memcpy(words.data(), ids, sizeof(ids));
        mpi->allReduceSum(words.data(), words.data(), int64_t(words.size()),
                          DType::I64);
        std::memcpy(ids, words.data(), sizeof(ids));
      } else {
        std::string blob(reinterpret_cast<const char *>(ids), sizeof(ids));
        blob = storeBroadcast(b.store, rank_, size_, blob, timeout);
        if (blob.size() != sizeof(ids))
          fail(1, "setup: the NCCL ids from rank 0 have " +
                      std::to_string(blob.size()) + " bytes, not " +
                      std::to_string(sizeof(ids)));
        std::memcpy(ids, blob.data(), sizeof(ids));
      }
    }
    {
      Guard guard(prefix() + "setup: ncclCommInitRank did not finish within " +
                      secondsText(timeout + kWatchdogGrace) +
                      " s (MOERT_COMM_TIMEOUT): a rank did not join the NCCL "
                      "communicator; exiting",
                  timeout + kWatchdogGrace);
      check(nc.commInitRank(&data.comm, size_, ids[0], rank_),
            "ncclCommInitRank", "setup");
      check(nc.commInitRank(&control.comm, size_, ids[1], rank_),
            "ncclCommInitRank", "setup");
    }
  }

  std::unique_ptr<Communicator> split(int color, int colors, int key,
                                      int size) override {
    NcclBootstrap g;
    g.rank = key;
    g.size = size;
    g.mpi = mpi;
    g.parent = this;
    g.color = color;
    g.colors = colors;
    try {
      return std::make_unique<NcclComm>(nc, g);
    } catch (const Error &e) {
      // The other ranks may be waiting for this one's part of the ids in
      // this communicator's sum: failing it (ncclCommAbort) stops them at
      // once, naming this failure, instead of at the deadline.
      if (failure().empty())
        fail(e.status(), "forming a group of " + std::to_string(size) +
                             " ranks: " + e.what());
      throw;
    }
  }

  const char *backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allToAllV(const void *send, int64_t sendRows, const int32_t *sendCounts,
                 int64_t slots, int64_t rowBytes, void *recv,
                 int64_t recvCapacity, int32_t *recvCounts, const char *what,
                 const RowLayout &layout) override {
    std::lock_guard<std::mutex> lock(mu);
    ContextScope scope;
    std::string label = seq.enter(*this, Kind::AllToAll, what);
    drainRows(label);
    int64_t count = slots * size_;
    if (isDevicePointer(sendCounts)) {
      synchronizeContext(label); // the inputs are written
      exchange(label, data, dev(send), sendRows, dev(sendCounts), slots,
               rowBytes, dev(recv), recvCapacity, dev(recvCounts), layout);
      wait(label, "rows", data, nullptr);
      return;
    }
    // Host buffers: through device memory.
    size_t inBytes = size_t(sendRows * rowBytes),
           outBytes = size_t(recvCapacity * rowBytes),
           countBytes = size_t(count) * sizeof(int32_t);
    CUdeviceptr in = stageIn.get(inBytes + 1), out = stageOut.get(outBytes + 1),
                counts = stageCounts.get(2 * countBytes + 1);
    copy(in, dev(send), inBytes);
    copy(counts, dev(sendCounts), countBytes);
    exchange(label, data, in, sendRows, counts, slots, rowBytes, out,
             recvCapacity, counts + countBytes, layout);
    wait(label, "rows", data, nullptr);
    copy(dev(recv), out, outBytes);
    copy(dev(recvCounts), counts + countBytes, countBytes);
    MOERT_CU(driver().cuStreamSynchronize(data.stream));
  }

  /// Rows still travelling on the data stream, up to `done`.
  struct Rows final : Pending {
    Rows(NcclComm &comm, std::string label, CUevent done,
         const char *phase = "rows")
        : comm(comm), label(std::move(label)), done(done), phase(phase) {}
    ~Rows() override {
      if (done) {
        ContextScope scope;
        driver().cuEventDestroy(done);
      }
    }
    void wait() override {
      std::lock_guard<std::mutex> lock(comm.mu);
      ContextScope scope;
      comm.wait(label, phase, comm.data, done);
    }
    NcclComm &comm;
    std::string label;
    CUevent done;
    const char *phase;
  };

  std::unique_ptr<Pending> allToAllVStart(const void *send, int64_t sendRows,
                                          const int32_t *sendCounts,
                                          int64_t slots, int64_t rowBytes,
                                          void *recv, int64_t recvCapacity,
                                          int32_t *recvCounts, const char *what,
                                          const RowLayout &layout) override {
    // Host buffers are staged through device memory: nothing to overlap.
    if (!isDevicePointer(sendCounts))
      return Communicator::allToAllVStart(send, sendRows, sendCounts, slots,
                                          rowBytes, recv, recvCapacity,
                                          recvCounts, what, layout);
    std::lock_guard<std::mutex> lock(mu);
    ContextScope scope;
    std::string label = seq.enter(*this, Kind::AllToAll, what);
    // No context synchronization: it would wait for the rows in flight. The
    // caller has written the inputs (see the file comment).
    exchange(label, control, dev(send), sendRows, dev(sendCounts), slots,
             rowBytes, dev(recv), recvCapacity, dev(recvCounts), layout);
    CUevent done = nullptr;
    MOERT_CU(driver().cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    MOERT_CU(driver().cuEventRecord(done, data.stream));
    return std::make_unique<Rows>(*this, label, done);
  }

  void allReduceSum(const void *in, void *out, int64_t count,
                    DType type) override {
    std::lock_guard<std::mutex> lock(mu);
    ContextScope scope;
    std::string what =
        std::string(name(type)) + ", " + std::to_string(count) + " values";
    std::string label = seq.enter(*this, Kind::AllReduce, what.c_str());
    drainRows(label);
    size_t n = size_t(count) * bytes(type);
    if (isDevicePointer(in) || isDevicePointer(out)) {
      synchronizeContext(label);
      reduce(label, dev(in), dev(out), count, type);
      return;
    }
    CUdeviceptr buffer = stageIn.get(n + 1);
    copy(buffer, dev(in), n);
    reduce(label, buffer, buffer, count, type);
    copy(dev(out), buffer, n);
    MOERT_CU(driver().cuStreamSynchronize(data.stream));
  }

  /// A sum of device buffers enqueued on the data stream behind the rows
  /// and sums in flight (the headers go over the control channel, which
  /// does not wait for them); its wait polls an event recorded after it.
  /// Host buffers, and bf16/f16 on more than 2 ranks (summed in f32 on the
  /// host), complete here.
  std::unique_ptr<Pending> allReduceSumStart(const void *in, void *out,
                                             int64_t count,
                                             DType type) override {
    bool widen = (type == DType::BF16 || type == DType::F16) && size_ > 2;
    if (widen || count == 0 || !isDevicePointer(in) || !isDevicePointer(out))
      return Communicator::allReduceSumStart(in, out, count, type);
    std::lock_guard<std::mutex> lock(mu);
    ContextScope scope;
    std::string what =
        std::string(name(type)) + ", " + std::to_string(count) + " values";
    std::string label = seq.enter(*this, Kind::AllReduce, what.c_str());
    // No context synchronization (it would wait for what is in flight):
    // the caller has written the input.
    headers(label, Kind::AllReduce, count, int64_t(type), "arrival", &control);
    {
      Guard guard(watchdogText(label, "ncclAllReduce", "values"),
                  timeoutSeconds() + kWatchdogGrace);
      check(nc.allReduce(reinterpret_cast<void *>(dev(in)),
                         reinterpret_cast<void *>(dev(out)), size_t(count),
                         ncclType(type), nccl::Sum, data.comm, data.stream),
            "ncclAllReduce", label);
    }
    CUevent done = nullptr;
    MOERT_CU(driver().cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    MOERT_CU(driver().cuEventRecord(done, data.stream));
    return std::make_unique<Rows>(*this, label, done, "values");
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mu);
    ContextScope scope;
    std::string label = seq.enter(*this, Kind::Barrier, "");
    drainRows(label);
    headers(label, Kind::Barrier, 0, 0, "arrival");
  }

  /// Waits, against the deadline, for the rows of started exchanges still on
  /// the data stream. Blocking collectives call it first: their context and
  /// stream synchronizations (and memory frees) would otherwise wait on
  /// those rows with no deadline, and a dead peer would hang this rank.
  void drainRows(const std::string &label) {
    wait(label, "rows of earlier started exchanges", data, nullptr);
  }

  /// The context synchronization of a blocking collective, under the
  /// watchdog: drainRows bounds this communicator's own work in flight, but
  /// the context may also hold another communicator's (another group of the
  /// job's, or its parent's) started collectives, which a dead peer keeps
  /// there for ever.
  void synchronizeContext(const std::string &label) {
    Guard guard(prefix() + label + ": timed out after " +
                    secondsText(timeoutSeconds() + kWatchdogGrace) +
                    " s (MOERT_COMM_TIMEOUT) waiting for the device's earlier "
                    "work, which holds another communicator's collectives: "
                    "a rank of that group failed or stalls; exiting",
                timeoutSeconds() + kWatchdogGrace);
    MOERT_CU(driver().cuCtxSynchronize());
  }

  /// A communicator and the stream its operations run on.
  struct Channel {
    nccl::Comm comm = nullptr;
    CUstream stream = nullptr;
    Scratch meta; ///< device memory for exchanged words
  };

  void abort(int code) override {
    abortCommunicator();
    if (mpi)
      mpi->abort(code); // MPI_Abort: ends the job
  }

protected:
  void abortCommunicator() override {
    if (data.comm || control.comm) {
      // If even the abort hangs (a wedged device), end the process anyway.
      Guard guard(prefix() + "ncclCommAbort did not return; exiting",
                  std::min(30.0, timeoutSeconds() + kWatchdogGrace));
      for (Channel *c : {&data, &control})
        if (c->comm) {
          nc.commAbort(c->comm);
          c->comm = nullptr;
        }
    }
  }

private:
  std::string prefix() const {
    return "moert: rank " + std::to_string(jobRank()) + ": ";
  }

  /// Every NCCL call is checked; a failure names the call and the collective.
  void check(int rc, const char *call, const std::string &label) {
    if (rc == nccl::Success || rc == nccl::InProgress)
      return;
    std::string detail = nc.getErrorString(rc);
    if (nc.getLastError && data.comm)
      if (const char *last = nc.getLastError(data.comm); last && *last)
        detail += std::string(": ") + last;
    fail(1, label + ": " + call + " failed: " + detail + " (NCCL " +
                nc.versionText() + ")");
  }

  /// Asynchronous copy on a stream (the data stream unless given; any
  /// direction: unified addressing tells host from device).
  void copy(CUdeviceptr to, CUdeviceptr from, size_t n, CUstream on = nullptr) {
    if (n)
      MOERT_CU(driver().cuMemcpyAsync(to, from, n, on ? on : data.stream));
  }

  /// Who the other ranks are, for messages.
  std::string peers() const {
    if (size_ == 2)
      return "rank " + std::to_string(1 - rank_);
    std::string s = "one of ranks ";
    for (int p = 0, n = 0; p < size_; ++p)
      if (p != rank_)
        s += (n++ ? ", " : "") + std::to_string(p);
    return s;
  }

  /// Polls `on`'s stream (or, given, the event `until`) until the work is
  /// done. Past the deadline, or when NCCL reports an asynchronous error on
  /// either communicator, fails (ncclCommAbort) naming the rank, the collective
  /// and the phase.
  void wait(const std::string &label, const char *phase, Channel &on,
            CUevent until) {
    double timeout = timeoutSeconds();
    auto start = Clock::now();
    auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(timeout));
    while (true) {
      CUresult r = until ? driver().cuEventQuery(until)
                         : driver().cuStreamQuery(on.stream);
      if (r == CUDA_SUCCESS)
        return;
      if (r != CUDA_ERROR_NOT_READY)
        cuda::fail(r, "cuStreamQuery (waiting for NCCL)", __FILE__, __LINE__);
      int async = nccl::Success;
      nccl::Comm failed = nullptr;
      for (Channel *c : {&data, &control})
        if (!failed && c->comm &&
            nc.commGetAsyncError(c->comm, &async) == nccl::Success &&
            async != nccl::Success && async != nccl::InProgress)
          failed = c->comm;
      if (failed) {
        std::string detail = nc.getErrorString(async);
        if (nc.getLastError)
          if (const char *last = nc.getLastError(failed); last && *last)
            detail += std::string(": ") + last;
        fail(2, label + ": NCCL failed while waiting for " + peers() + " (" +
                    phase + "): " + detail +
                    "; a rank failed; aborting the job (ncclCommAbort)");
      }
      auto now = Clock::now();
      if (now >= deadline)
        fail(2, label + ": timed out after " + secondsText(timeout) +
                    " s (MOERT_COMM_TIMEOUT) waiting for " + peers() + " (" +
                    phase +
                    ", NCCL): that rank failed or stalls; aborting "
                    "the job (ncclCommAbort)");
      // Spin for short exchanges, then back off to at most 1 ms.
      if (now - start < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(
            now - start < std::chrono::milliseconds(200) ? 20 : 1000));
    }
  }

  /// Sends `out[p * words ...]` to every peer p and receives theirs into
  /// `in`, `words` int64 each; this rank's own part is copied. The group
  /// (connection setup included) is guarded by the watchdog.
  void exchangeWords(const std::string &label, const char *phase, Channel &on,
                     const std::vector<int64_t> &out, std::vector<int64_t> &in,
                     int64_t words) {
    size_t part = size_t(words) * sizeof(int64_t);
    // Growing the scratch frees the old one, which waits for the device.
    if (on.meta.bytes < 2 * part * size_t(size_))
      drainRows(label);
    CUdeviceptr m = on.meta.get(2 * part * size_t(size_));
    CUdeviceptr mOut = m, mIn = m + part * size_t(size_);
    copy(mOut, dev(out.data()), part * size_t(size_), on.stream);
    {
      Guard guard(watchdogText(label, "ncclGroupEnd", phase),
                  timeoutSeconds() + kWatchdogGrace);
      check(nc.groupStart(), "ncclGroupStart", label);
      for (int p = 0; p < size_; ++p) {
        if (p == rank_)
          continue;
        check(nc.send(reinterpret_cast<void *>(mOut + part * size_t(p)),
                      size_t(words), nccl::Int64, p, on.comm, on.stream),
              "ncclSend", label);
        check(nc.recv(reinterpret_cast<void *>(mIn + part * size_t(p)),
                      size_t(words), nccl::Int64, p, on.comm, on.stream),
              "ncclRecv", label);
      }
      check(nc.groupEnd(), "ncclGroupEnd", label);
      wait(label, phase, on, nullptr);
    }
    in.assign(out.size(), 0);
    // Device -> pageable host memory is synchronous; the data is there.
    MOERT_CU(driver().cuMemcpyDtoH(in.data(), mIn, part * size_t(size_)));
    std::copy_n(&out[size_t(rank_ * words)], words, &in[size_t(rank_ * words)]);
  }

  std::string watchdogText(const std::string &label, const char *call,
                           const char *phase) const {
    return prefix() + label + ": timed out after " +
           secondsText(timeoutSeconds() + kWatchdogGrace) +
           " s (MOERT_COMM_TIMEOUT) inside " + call + " (" + phase +
           ", NCCL) waiting for " + peers() +
           ": that rank failed or stalls; exiting";
  }

  /// Every rank tells every other where it is: a barrier, and the check
  /// that the ranks run the same collective with the same sizes.
  void headers(const std::string &label, Kind kind, int64_t a, int64_t b,
               const char *phase, Channel *on = nullptr) {
    std::vector<int64_t> out(size_t(4 * size_)), in;
    for (int p = 0; p < size_; ++p) {
      int64_t *h = &out[size_t(4 * p)];
      h[0] = int64_t(seq.total);
      h[1] = int64_t(kind);
      h[2] = a;
      h[3] = b;
    }
    exchangeWords(label, phase, on ? *on : data, out, in, 4);
    for (int p = 0; p < size_; ++p) {
      const int64_t *h = &in[size_t(4 * p)];
      checkHeader(*this, label, p, h, seq.total, kind);
      if (h[2] != a || h[3] != b)
        fail(1, label + ": rank " + std::to_string(p) + " sums " +
                    std::to_string(h[2]) + " " +
                    (h[3] >= 0 && h[3] <= 5 ? name(DType(h[3])) : "?") +
                    " values, this rank " + std::to_string(a) + " " +
                    name(DType(b)) + " (different programs?)");
    }
  }

  /// Copies `pieces` on `stream`: one kernel launch per kPiecesPerLaunch
  /// pieces (the table travels as a launch parameter, so the host can reuse
  /// it at once), or cuMemcpyAsync for a piece or two.
  void copyPieces(std::vector<Piece> pieces, CUstream stream) {
    pieces.erase(std::remove_if(pieces.begin(), pieces.end(),
                                [](const Piece &p) { return p.bytes == 0; }),
                 pieces.end());
    if (!copyKernel || pieces.size() <= 2) {
      for (const Piece &p : pieces)
        copy(p.dst, p.src, size_t(p.bytes), stream);
      return;
    }
    for (size_t first = 0; first < pieces.size(); first += kPiecesPerLaunch) {
      uint64_t count =
          std::min<uint64_t>(kPiecesPerLaunch, pieces.size() - first);
      Piece table[kPiecesPerLaunch] = {};
      uint64_t largest = 0;
      for (uint64_t i = 0; i < count; ++i) {
        table[i] = pieces[first + i];
        largest = std::max(largest, table[i].bytes);
      }
      // Columns of blocks sized to the largest piece (256 KiB a block).
      unsigned columns =
          unsigned(std::clamp<uint64_t>(largest / (256 << 10), 1, 32));
      void *args[] = {&count, table};
      MOERT_CU(driver().cuLaunchKernel(copyKernel, unsigned(count), columns, 1,
                                       256, 1, 1, 0, stream, args, nullptr));
    }
  }

  /// Where each peer's rows of one side of an exchange travel from or to:
  /// `base[p]` (`rows[p]` contiguous rows). For a slot-major side, a staging
  /// buffer holds them peer by peer (`at[p]`: where each of the side's
  /// segments lies in it); else they are the side's own contiguous rows.
  struct Staged {
    CUdeviceptr buffer = 0;
    std::vector<CUdeviceptr> base;
    std::vector<int64_t> rows;
    std::vector<std::vector<RowSegment>> at;
  };

  Staged stage(const std::string &label, Scratch &scratch,
               const std::vector<std::vector<RowSegment>> &segments,
               bool slotMajor, CUdeviceptr rowsPtr, int64_t rowBytes) {
    Staged s;
    s.base.assign(size_t(size_), 0);
    s.rows.assign(size_t(size_), 0);
    s.at.resize(size_t(size_));
    int64_t total = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_)
        continue;
      for (RowSegment seg : segments[size_t(p)]) {
        s.at[size_t(p)].push_back({s.rows[size_t(p)], seg.rows});
        s.rows[size_t(p)] += seg.rows;
      }
      total += s.rows[size_t(p)];
    }
    if (slotMajor && total > 0) {
      // The data stream orders the exchanges that share it; a larger
      // buffer waits until the old one is no longer in use.
      size_t bytes = size_t(total * rowBytes);
      if (bytes > scratch.bytes)
        wait(label, "rows of earlier started exchanges", data, nullptr);
      s.buffer = scratch.get(bytes);
      int64_t at = 0;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_)
          continue;
        for (RowSegment &seg : s.at[size_t(p)])
          seg.row += at;
        s.base[size_t(p)] = s.buffer + CUdeviceptr(at * rowBytes);
        at += s.rows[size_t(p)];
      }
      return s;
    }
    // Peer-major: each peer's segments are adjacent.
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !segments[size_t(p)].empty())
        s.base[size_t(p)] =
            rowsPtr + CUdeviceptr(segments[size_t(p)].front().row * rowBytes);
    return s;
  }

  /// all_to_all on device buffers (see the file comment), headers and
  /// counts through `counts`' communicator: returns with recvCounts written
  /// and the rows enqueued on the data stream.
  void exchange(const std::string &label, Channel &counts, CUdeviceptr send,
                int64_t sendRows, CUdeviceptr sendCounts, int64_t slots,
                int64_t rowBytes, CUdeviceptr recv, int64_t recvCapacity,
                CUdeviceptr recvCounts, const RowLayout &layout) {
    const int64_t count = slots * size_;
    // 1. This rank's counts, on the host (staged ones come on the stream).
    std::vector<int32_t> mine(static_cast<size_t>(count));
    MOERT_CU(driver().cuStreamSynchronize(counts.stream));
    MOERT_CU(driver().cuMemcpyDtoH(mine.data(), sendCounts,
                                   size_t(count) * sizeof(int32_t)));
    checkSendCounts(*this, label, sendRows, mine.data(), count);
    // 2. Headers and counts: [seq, kind, rowBytes, slots, layout,
    // counts...] per peer.
    const int64_t words = kAllToAllHeaderWords + slots;
    std::vector<int64_t> out =
        allToAllHeaders(size_, seq.total, rowBytes, slots, layout, mine.data());
    std::vector<int64_t> in;
    exchangeWords(label, "counts", counts, out, in, words);
    // 3. Where the rows go and come from.
    std::vector<int32_t> received(static_cast<size_t>(count));
    readAllToAllHeaders(*this, label, in, seq.total, rowBytes, slots, layout,
                        mine.data(), received.data(), recvCapacity);
    RowPlan plan = planRows(*this, label, mine.data(), received.data(), slots,
                            layout, sendRows, recvCapacity);
    // 4. The rows.
    MOERT_CU(driver().cuMemcpyHtoD(recvCounts, received.data(),
                                   size_t(count) * sizeof(int32_t)));
    // This rank's own rows and the zeros on the local stream, by the copy
    // engines while NCCL moves the others (the buffers are written, and
    // nothing else writes these rows); the data stream waits for it.
    std::vector<Piece> own;
    for (auto [s, r] :
         zipped(plan.send[size_t(rank_)], plan.recv[size_t(rank_)]))
      own.push_back({recv + CUdeviceptr(r.row * rowBytes),
                     send + CUdeviceptr(s.row * rowBytes),
                     uint64_t(r.rows * rowBytes)});
    copyPieces(std::move(own), local);
    for (RowSegment z : plan.zero)
      MOERT_CU(driver().cuMemsetD8Async(recv + CUdeviceptr(z.row * rowBytes), 0,
                                        size_t(z.rows * rowBytes), local));
    MOERT_CU(driver().cuEventRecord(localDone, local));
    // One message per peer and direction, contiguous: a slot-major side
    // goes through a staging buffer, its segments gathered before the sends
    // or scattered after the receives (all on the data stream).
    // (NCCL runs one message per segment far below its bandwidth.)
    Staged sending = stage(label, sendStage, plan.send, layout.slotMajorSend,
                           send, rowBytes);
    Staged receiving = stage(label, recvStage, plan.recv, layout.slotMajorRecv,
                             recv, rowBytes);
    if (sending.buffer) {
      std::vector<Piece> gather;
      for (int p = 0; p < size_; ++p)
        if (p != rank_)
          for (auto [s, at] :
               zipped(plan.send[size_t(p)], sending.at[size_t(p)]))
            gather.push_back({sending.buffer + CUdeviceptr(at.row * rowBytes),
                              send + CUdeviceptr(s.row * rowBytes),
                              uint64_t(s.rows * rowBytes)});
      copyPieces(std::move(gather), data.stream);
    }
    {
      Guard guard(watchdogText(label, "ncclGroupEnd", "rows"),
                  timeoutSeconds() + kWatchdogGrace);
      check(nc.groupStart(), "ncclGroupStart", label);
      for (int p = 0; p < size_; ++p)
        if (p != rank_ && receiving.rows[size_t(p)] > 0)
          check(nc.recv(reinterpret_cast<void *>(receiving.base[size_t(p)]),
                        size_t(receiving.rows[size_t(p)] * rowBytes),
                        nccl::Uint8, p, data.comm, data.stream),
                "ncclRecv", label);
      for (int p = 0; p < size_; ++p)
        if (p != rank_ && sending.rows[size_t(p)] > 0)
          check(nc.send(reinterpret_cast<void *>(sending.base[size_t(p)]),
                        size_t(sending.rows[size_t(p)] * rowBytes), nccl::Uint8,
                        p, data.comm, data.stream),
                "ncclSend", label);
      check(nc.groupEnd(), "ncclGroupEnd", label);
    }
    if (receiving.buffer) {
      std::vector<Piece> scatter;
      for (int p = 0; p < size_; ++p)
        if (p != rank_)
          for (auto [r, at] :
               zipped(plan.recv[size_t(p)], receiving.at[size_t(p)]))
            scatter.push_back(
                {recv + CUdeviceptr(r.row * rowBytes),
                 receiving.buffer + CUdeviceptr(at.row * rowBytes),
                 uint64_t(r.rows * rowBytes)});
      copyPieces(std::move(scatter), data.stream);
    }
    MOERT_CU(driver().cuStreamWaitEvent(data.stream, localDone, 0));
  }

  /// all_reduce on device buffers.
  void reduce(const std::string &label, CUdeviceptr in, CUdeviceptr out,
              int64_t count, DType type) {
    headers(label, Kind::AllReduce, count, int64_t(type), "arrival");
    if (count == 0)
      return;
    bool widen = (type == DType::BF16 || type == DType::F16) && size_ > 2;
    Guard guard(watchdogText(label, "ncclAllReduce", "values"),
                timeoutSeconds() + kWatchdogGrace);
    if (!widen) {
      check(nc.allReduce(reinterpret_cast<void *>(in),
                         reinterpret_cast<void *>(out), size_t(count),
                         ncclType(type), nccl::Sum, data.comm, data.stream),
            "ncclAllReduce", label);
      wait(label, "values", data, nullptr);
      return;
    }
    // bf16/f16: summed in f32, rounded once.
    std::vector<uint16_t> narrow(static_cast<size_t>(count));
    std::vector<float> wide(static_cast<size_t>(count));
    MOERT_CU(driver().cuMemcpyDtoH(narrow.data(), in, size_t(count) * 2));
    for (int64_t i = 0; i < count; ++i)
      wide[size_t(i)] = toFloat(narrow.data(), type, i);
    CUdeviceptr w = stageWide.get(size_t(count) * sizeof(float));
    copy(w, dev(wide.data()), wide.size() * sizeof(float));
    check(nc.allReduce(reinterpret_cast<void *>(w), reinterpret_cast<void *>(w),
                       size_t(count), nccl::Float32, nccl::Sum, data.comm,
                       data.stream),
          "ncclAllReduce", label);
    wait(label, "values", data, nullptr);
    MOERT_CU(
        driver().cuMemcpyDtoH(wide.data(), w, wide.size() * sizeof(float)));
    for (int64_t i = 0; i < count; ++i)
      fromFloat(narrow.data(), type, i, wide[size_t(i)]);
    copy(out, dev(narrow.data()), narrow.size() * 2);
    MOERT_CU(driver().cuStreamSynchronize(data.stream));
  }

  const NcclApi &nc;
  int rank_, size_;
  Communicator *mpi;
  Channel data;    ///< rows, reductions, the blocking collectives' headers
  Channel control; ///< headers and counts of started exchanges
  CUmodule copyModule = nullptr;
  CUfunction copyKernel = nullptr;
  /// Staging of slot-major sides (used in data-stream order).
  Scratch sendStage, recvStage;
  /// An exchange's own rows and zero tail, beside the NCCL transfers.
  CUstream local = nullptr;
  CUevent localDone = nullptr;
  std::mutex mu;
  Sequence seq;
  Scratch stageIn, stageOut, stageCounts, stageWide;
};

} // namespace

std::string ncclLibraryError() {
  std::string error;
  loadNccl(error);
  return error;
}

std::string ncclUnavailable() {
  std::string error;
  if (!loadNccl(error))
    return error;
  if (moert_gpu_device_count() == 0)
    return "NCCL " + loadNccl(error)->versionText() +
           " is there, but no GPU (no CUDA driver, or no device)";
  return "";
}

std::unique_ptr<Communicator> createNcclCommunicator(const NcclBootstrap &b) {
  std::string error;
  const NcclApi *api = loadNccl(error);
  if (!api)
    fail("the NCCL backend: " + error);
  return std::make_unique<NcclComm>(*api, b);
}

} // namespace moert::comm
