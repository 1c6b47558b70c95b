//===- CommApi.cpp - the C entry points of the communication layer --------===//
//
// What compiled programs call (moert_all_to_all_*, moert_all_reduce_sum_*)
// and the moert_comm_* calls of tools: the memref descriptors checked, the
// communicator for the buffers chosen (host or device), the call timed for
// moert_comm_stats. These have no error return: an error becomes the sticky
// error (moert/Error.h), and the received counts of a failed all_to_all are
// zero so that a program that goes on reads no garbage sizes.
//
//===----------------------------------------------------------------------===//

#include "CommProtocol.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

using namespace moert;
using namespace moert::comm;

namespace {

/// A buffer a collective is given: where it starts and how many bytes.
struct Buffer {
  const void *data;
  int64_t bytes;
};

/// Which ranks a collective runs over: `size` ranks `stride` apart (see
/// comm::group) of a program compiled for `gridSize` ranks.
struct Group {
  int64_t size, stride, gridSize;
};

/// The communicator for these buffers: the group, of deviceWorld() when
/// they are device memory, else of world(). Buffers on both sides are an
/// error.
Communicator &checkedGroup(const char *op, Group g,
                           std::initializer_list<Buffer> buffers) {
  int onDevice = 0, onHost = 0;
  for (const Buffer &b : buffers)
    if (b.data && b.bytes > 0)
      ++(isDevicePointer(b.data) ? onDevice : onHost);
  if (onDevice && onHost)
    world().fail(1, std::string(op) + ": " + std::to_string(onDevice) +
                        " of its buffers are in device memory and " +
                        std::to_string(onHost) +
                        " in host memory; all must be on the same side");
  Communicator &c = onDevice ? deviceWorld() : world();
  if (g.gridSize != c.size())
    c.fail(1, std::string(op) + ": the program was compiled for " +
                  std::to_string(g.gridSize) + " ranks (its shard.grid), but " +
                  std::to_string(c.size()) + " were launched (" + c.backend() +
                  " backend)");
  if (g.size < 1 || g.stride < 1 || g.size * g.stride > g.gridSize ||
      g.gridSize % (g.size * g.stride) != 0)
    c.fail(1, std::string(op) + ": a group of " + std::to_string(g.size) +
                  " ranks " + std::to_string(g.stride) +
                  " apart does not tile the grid's " +
                  std::to_string(g.gridSize) + " ranks");
  return group(c, int(g.size), int(g.stride));
}

template <typename T> T *data(const moert_memref1d *m) {
  return static_cast<T *>(m->aligned) + m->offset;
}

void checkContiguous(Communicator &c, const char *op, const char *what,
                     const moert_memref1d *m) {
  if (m->sizes[0] > 1 && m->strides[0] != 1)
    c.fail(1, std::string(op) + ": " + what + " is not contiguous (stride " +
                  std::to_string(m->strides[0]) + ")");
}

void checkRows(Communicator &c, const char *op, const char *what,
               const moert_memref2d *m) {
  if ((m->sizes[1] > 1 && m->strides[1] != 1) ||
      (m->sizes[0] > 1 && m->strides[0] != m->sizes[1]))
    c.fail(1, std::string(op) + ": " + what +
                  " does not hold contiguous rows (strides " +
                  std::to_string(m->strides[0]) + ", " +
                  std::to_string(m->strides[1]) + ")");
}

/// Times a collective entry point for moert_comm_stats (`count`: the call
/// is a new collective, not the wait of a started one).
struct Timed {
  bool allToAll, count;
  std::chrono::steady_clock::time_point start =
      std::chrono::steady_clock::now();
  explicit Timed(bool allToAll, bool count = true)
      : allToAll(allToAll), count(count) {}
  ~Timed() {
    countCall(
        allToAll, count,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
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
                          moert_memref1d *recvCounts, Group g, int64_t layout,
                          int64_t padTo) {
  auto bytesOf = [&](const moert_memref2d *m) {
    return m->sizes[0] * m->sizes[1] * int64_t(elementBytes);
  };
  Communicator &c =
      checkedGroup(op.c_str(), g,
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
    c.fail(1, op + ": rows of " + std::to_string(input->sizes[1]) +
                  " values in, " + std::to_string(result->sizes[1]) + " out");
  if (recvCounts->sizes[0] != count || count % c.size() != 0)
    c.fail(1, op + ": " + std::to_string(count) + " send counts and " +
                  std::to_string(recvCounts->sizes[0]) +
                  " receive counts; both must be the same multiple of the " +
                  std::to_string(c.size()) + " ranks");
  if (layout < 0 || layout > 3 || padTo < 1)
    c.fail(1, op + ": layout " + std::to_string(layout) + " and pad_to " +
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

void allToAllChecked(const char *entry, const char *dtype, size_t elementBytes,
                     moert_memref2d *input, moert_memref1d *sendCounts,
                     moert_memref2d *result, moert_memref1d *recvCounts,
                     Group g, int64_t layout, int64_t padTo);

/// After a failed all_to_all (or one skipped for an earlier error): the
/// received counts are zero, where the program can read them (host memory;
/// on a GPU the program's kernels do not run while the error is set).
void zeroCounts(moert_memref1d *recvCounts) {
  int32_t *counts = data<int32_t>(recvCounts);
  if (counts && recvCounts->sizes[0] > 0 && !isDevicePointer(counts))
    for (int64_t i = 0; i < recvCounts->sizes[0]; ++i)
      counts[i * recvCounts->strides[0]] = 0;
}

void allToAll(const char *entry, const char *dtype, size_t elementBytes,
              moert_memref2d *input, moert_memref1d *sendCounts,
              moert_memref2d *result, moert_memref1d *recvCounts, Group g,
              int64_t layout = 0, int64_t padTo = 1) {
  if (!guarded(false, [&] {
        allToAllChecked(entry, dtype, elementBytes, input, sendCounts, result,
                        recvCounts, g, layout, padTo);
        return true;
      }))
    zeroCounts(recvCounts);
}

void allToAllChecked(const char *entry, const char *dtype, size_t elementBytes,
                     moert_memref2d *input, moert_memref1d *sendCounts,
                     moert_memref2d *result, moert_memref1d *recvCounts,
                     Group g, int64_t layout, int64_t padTo) {
  Timed timed(/*allToAll=*/true);
  AllToAllArgs a =
      allToAllArgs(std::string(entry) + dtype, elementBytes, dtype, input,
                   sendCounts, result, recvCounts, g, layout, padTo);
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

int64_t allToAllStartChecked(const char *entry, const char *dtype,
                             size_t elementBytes, moert_memref2d *input,
                             moert_memref1d *sendCounts, moert_memref2d *result,
                             moert_memref1d *recvCounts, Group g,
                             int64_t layout, int64_t padTo) {
  Timed timed(/*allToAll=*/true);
  AllToAllArgs a =
      allToAllArgs(std::string(entry) + dtype, elementBytes, dtype, input,
                   sendCounts, result, recvCounts, g, layout, padTo);
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

/// Waits for the started collective `handle`, which must have been started
/// with the buffers `in` and `out`.
void waitStarted(const std::string &op, int64_t handle, const void *in,
                 const void *out) {
  Started s;
  {
    StartedTable &t = started();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.live.find(handle);
    if (it == t.live.end())
      world().fail(1, op + ": no exchange was started with handle " +
                          std::to_string(handle) +
                          " (or it was waited for "
                          "already)");
    s = std::move(it->second);
    t.live.erase(it);
  }
  if (s.send != in || s.recv != out)
    s.comm->fail(1, op + ": handle " + std::to_string(handle) +
                        " was started with other buffers");
  s.pending->wait();
}

void allToAllWaitChecked(const char *dtype, size_t elementBytes, int64_t handle,
                         moert_memref2d *input, moert_memref2d *result) {
  Timed timed(/*allToAll=*/true, /*count=*/false);
  waitStarted(std::string("moert_all_to_all_wait_") + dtype, handle,
              rowsOf(input, elementBytes), rowsOf(result, elementBytes));
}

/// An all_reduce call's buffers, checked: what allReduceSum(Start) takes.
struct AllReduceArgs {
  Communicator *comm;
  const void *in;
  void *out;
  int64_t count;
};

AllReduceArgs allReduceArgs(const std::string &op, DType type,
                            moert_memref1d *input, moert_memref1d *result,
                            Group g) {
  size_t eb = bytes(type);
  char *in = static_cast<char *>(input->aligned) + input->offset * eb,
       *out = static_cast<char *>(result->aligned) + result->offset * eb;
  Communicator &c = checkedGroup(op.c_str(), g,
                                 {{in, input->sizes[0] * int64_t(eb)},
                                  {out, result->sizes[0] * int64_t(eb)}});
  checkContiguous(c, op.c_str(), "the input", input);
  checkContiguous(c, op.c_str(), "the result", result);
  if (input->sizes[0] != result->sizes[0])
    c.fail(1, op + ": " + std::to_string(input->sizes[0]) + " values in, " +
                  std::to_string(result->sizes[0]) + " out");
  return {&c, in, out, input->sizes[0]};
}

void allReduceChecked(const char *dtype, DType type, moert_memref1d *input,
                      moert_memref1d *result, Group g) {
  Timed timed(/*allToAll=*/false);
  AllReduceArgs a = allReduceArgs(std::string("moert_all_reduce_sum_") + dtype,
                                  type, input, result, g);
  a.comm->allReduceSum(a.in, a.out, a.count, type);
}

int64_t allReduceStartChecked(const char *dtype, DType type,
                              moert_memref1d *input, moert_memref1d *result,
                              Group g) {
  Timed timed(/*allToAll=*/false);
  AllReduceArgs a =
      allReduceArgs(std::string("moert_all_reduce_sum_start_") + dtype, type,
                    input, result, g);
  std::unique_ptr<Communicator::Pending> pending =
      overlapEnabled()
          ? a.comm->allReduceSumStart(a.in, a.out, a.count, type)
          : a.comm->Communicator::allReduceSumStart(a.in, a.out, a.count, type);
  StartedTable &t = started();
  std::lock_guard<std::mutex> lock(t.mu);
  int64_t handle = t.next++;
  t.live.emplace(handle, Started{std::move(pending), a.comm, a.in, a.out});
  return handle;
}

void allReduceWaitChecked(const char *dtype, DType type, int64_t handle,
                          moert_memref1d *input, moert_memref1d *result) {
  Timed timed(/*allToAll=*/false, /*count=*/false);
  std::string op = std::string("moert_all_reduce_sum_wait_") + dtype;
  size_t eb = bytes(type);
  waitStarted(op, handle,
              static_cast<char *>(input->aligned) + input->offset * eb,
              static_cast<char *>(result->aligned) + result->offset * eb);
}

/// A started exchange: handle 0 when it failed (its wait does nothing).
int64_t allToAllStart(const char *entry, const char *dtype, size_t elementBytes,
                      moert_memref2d *input, moert_memref1d *sendCounts,
                      moert_memref2d *result, moert_memref1d *recvCounts,
                      Group g, int64_t layout = 0, int64_t padTo = 1) {
  int64_t handle = guarded(int64_t(0), [&] {
    return allToAllStartChecked(entry, dtype, elementBytes, input, sendCounts,
                                result, recvCounts, g, layout, padTo);
  });
  if (!handle)
    zeroCounts(recvCounts);
  return handle;
}

void allToAllWait(const char *dtype, size_t elementBytes, int64_t handle,
                  moert_memref2d *input, moert_memref2d *result) {
  guarded(
      [&] { allToAllWaitChecked(dtype, elementBytes, handle, input, result); });
}

void allReduce(const char *dtype, DType type, moert_memref1d *input,
               moert_memref1d *result, Group g) {
  guarded([&] { allReduceChecked(dtype, type, input, result, g); });
}

/// A started sum: handle 0 when it failed (its wait does nothing).
int64_t allReduceStart(const char *dtype, DType type, moert_memref1d *input,
                       moert_memref1d *result, Group g) {
  return guarded(int64_t(0), [&] {
    return allReduceStartChecked(dtype, type, input, result, g);
  });
}

void allReduceWait(const char *dtype, DType type, int64_t handle,
                   moert_memref1d *input, moert_memref1d *result) {
  guarded([&] { allReduceWaitChecked(dtype, type, handle, input, result); });
}

} // namespace

extern "C" {

#define MOERT_DEFINE_ALL_TO_ALL(T, BYTES)                                      \
  void _mlir_ciface_moert_all_to_all_##T(                                      \
      moert_memref2d *input, moert_memref1d *send_counts,                      \
      moert_memref2d *result, moert_memref1d *recv_counts, int64_t group_size, \
      int64_t group_stride, int64_t grid_size) {                               \
    allToAll("moert_all_to_all_", #T, BYTES, input, send_counts, result,       \
             recv_counts, {group_size, group_stride, grid_size});              \
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
      moert_memref2d *result, moert_memref1d *recv_counts, int64_t group_size, \
      int64_t group_stride, int64_t grid_size) {                               \
    return allToAllStart("moert_all_to_all_start_", #T, BYTES, input,          \
                         send_counts, result, recv_counts,                     \
                         {group_size, group_stride, grid_size});               \
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
      moert_memref2d *result, moert_memref1d *recv_counts, int64_t group_size, \
      int64_t group_stride, int64_t grid_size, int64_t layout,                 \
      int64_t pad_to) {                                                        \
    allToAll("moert_all_to_all_slots_", #T, BYTES, input, send_counts, result, \
             recv_counts, {group_size, group_stride, grid_size}, layout,       \
             pad_to);                                                          \
  }                                                                            \
  int64_t _mlir_ciface_moert_all_to_all_slots_start_##T(                       \
      moert_memref2d *input, moert_memref1d *send_counts,                      \
      moert_memref2d *result, moert_memref1d *recv_counts, int64_t group_size, \
      int64_t group_stride, int64_t grid_size, int64_t layout,                 \
      int64_t pad_to) {                                                        \
    return allToAllStart("moert_all_to_all_slots_start_", #T, BYTES, input,    \
                         send_counts, result, recv_counts,                     \
                         {group_size, group_stride, grid_size}, layout,        \
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
      moert_memref1d *input, moert_memref1d *result, int64_t group_size,       \
      int64_t group_stride, int64_t grid_size) {                               \
    allReduce(#T, DType::TYPE, input, result,                                  \
              {group_size, group_stride, grid_size});                          \
  }
MOERT_DEFINE_ALL_REDUCE(f32, F32)
MOERT_DEFINE_ALL_REDUCE(f64, F64)
MOERT_DEFINE_ALL_REDUCE(bf16, BF16)
MOERT_DEFINE_ALL_REDUCE(f16, F16)
MOERT_DEFINE_ALL_REDUCE(i32, I32)
MOERT_DEFINE_ALL_REDUCE(i64, I64)
#undef MOERT_DEFINE_ALL_REDUCE

#define MOERT_DEFINE_ALL_REDUCE_ASYNC(T, TYPE)                                 \
  int64_t _mlir_ciface_moert_all_reduce_sum_start_##T(                         \
      moert_memref1d *input, moert_memref1d *result, int64_t group_size,       \
      int64_t group_stride, int64_t grid_size) {                               \
    return allReduceStart(#T, DType::TYPE, input, result,                      \
                          {group_size, group_stride, grid_size});              \
  }                                                                            \
  void _mlir_ciface_moert_all_reduce_sum_wait_##T(                             \
      int64_t handle, moert_memref1d *input, moert_memref1d *result) {         \
    allReduceWait(#T, DType::TYPE, handle, input, result);                     \
  }
MOERT_DEFINE_ALL_REDUCE_ASYNC(f32, F32)
MOERT_DEFINE_ALL_REDUCE_ASYNC(f64, F64)
MOERT_DEFINE_ALL_REDUCE_ASYNC(bf16, BF16)
MOERT_DEFINE_ALL_REDUCE_ASYNC(f16, F16)
MOERT_DEFINE_ALL_REDUCE_ASYNC(i32, I32)
MOERT_DEFINE_ALL_REDUCE_ASYNC(i64, I64)
#undef MOERT_DEFINE_ALL_REDUCE_ASYNC

int32_t moert_comm_rank(void) {
  return guarded(int32_t(0), [] { return int32_t(world().rank()); });
}
int32_t moert_comm_size(void) {
  return guarded(int32_t(0), [] { return int32_t(world().size()); });
}
void moert_comm_barrier(void) {
  guarded([] { world().barrier(); });
}
void moert_comm_get_stats(moert_comm_stats *s) { *s = statsSnapshot(); }
void moert_comm_reset_stats(void) { resetStats(); }
void moert_comm_abort(int32_t code, const char *message) {
  std::fflush(stdout);
  std::fprintf(stderr, "moert: %s\n", message ? message : "aborted");
  std::fflush(stderr);
  abortJob(code);
}

} // extern "C"
