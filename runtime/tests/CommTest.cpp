//===- CommTest.cpp - libmoert's collectives on any number of ranks -------===//
//
// Modes (mpirun -np N moert-comm-test MODE):
//   (none)           every check; prints "rank r: K checks, 0 failed"
//   device           every check on device buffers (a GPU per rank: NCCL,
//                    or MPI through host memory)
//   groups [device]  every check within each axis of every 2-d grid over
//                    the N ranks (comm::group)
//   overflow         more rows arrive than fit (an error)
//   bad-counts       counts beyond the input (an error)
//   group G [S [N]]  a sum over G ranks S apart of a program compiled for
//                    N ranks (an error unless they fit the ranks launched)
//   wait-twice       a started exchange waited for twice (an error)
//   wait-other       ... waited for with other buffers (an error)
//   info             "rank r of N (backend)"
//
// The exchanges go through the C entry points compiled programs call
// (_mlir_ciface_moert_*), with memref descriptors.
//
//===----------------------------------------------------------------------===//

#include "moert/Comm.h"
#include "moert/Gpu.h"
#include "moert/Tool.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace moert::comm;

namespace {

int checks = 0, failed = 0;
/// The ranks the checks run over: a group of `ranks` ranks `stride` apart
/// (every rank: stride 1) of the `worldSize` launched; `rank` is this one's
/// place in it.
int rank = 0, ranks = 1, stride = 1, worldSize = 1;
#define GROUP ranks, stride, worldSize

/// Device mode: every buffer a collective gets is a device copy of the
/// vector, copied back by fetch().
bool onDevice = false;
struct Placed {
  void *host, *device;
  size_t bytes;
};
std::vector<Placed> placed;

template <typename T> T *place(std::vector<T> &v) {
  if (!onDevice)
    return v.data();
  for (Placed &p : placed)
    if (p.host == v.data())
      return static_cast<T *>(p.device);
  size_t bytes = v.size() * sizeof(T);
  void *d = mgpuMemAlloc(bytes, nullptr, false);
  mgpuMemcpy(d, v.data(), bytes, nullptr);
  moert_gpu_synchronize();
  placed.push_back({v.data(), d, bytes});
  return static_cast<T *>(d);
}

/// Copies the device buffers back to their vectors and frees them.
void fetch() {
  moert::throwStickyError(); // what the collective before reported
  if (!onDevice)
    return;
  for (Placed &p : placed) {
    mgpuMemcpy(p.host, p.device, p.bytes, nullptr);
    moert_gpu_synchronize();
    mgpuMemFree(p.device, nullptr);
  }
  moert_gpu_synchronize();
  placed.clear();
}

void expect(bool ok, const std::string &what) {
  ++checks;
  if (!ok) {
    ++failed;
    std::printf("rank %d: FAIL %s\n", rank, what.c_str());
  }
}

template <typename T> moert_memref1d vec(std::vector<T> &v) {
  T *p = place(v);
  return {p, p, 0, {int64_t(v.size())}, {1}};
}
template <typename T> moert_memref2d mat(std::vector<T> &v, int64_t cols) {
  T *p = place(v);
  return {p, p, 0, {int64_t(v.size()) / cols, cols}, {cols, 1}};
}

/// Rows rank `src` sends to `dst` for slot `j`.
int count(int src, int dst, int j) { return (src + 2 * dst + j) % 3; }
float value(int src, int dst, int j, int i, int c) {
  return float(src * 1000 + dst * 100 + j * 10 + i) + float(c) / 8;
}

/// One all_to_all's buffers: what this rank sends, room for what arrives.
struct Exchange {
  int slots, cols;
  std::vector<int32_t> send, recvCounts;
  std::vector<float> in, out;
  moert_memref2d a{}, r{};
  moert_memref1d b{}, rc{};

  Exchange(int slots, int cols, int extraRows) : slots(slots), cols(cols) {
    send.assign(size_t(ranks * slots), 0);
    recvCounts.assign(send.size(), -7);
    for (int d = 0; d < ranks; ++d)
      for (int j = 0; j < slots; ++j) {
        send[size_t(d * slots + j)] = count(rank, d, j);
        for (int i = 0; i < count(rank, d, j); ++i)
          for (int c = 0; c < cols; ++c)
            in.push_back(value(rank, d, j, i, c));
      }
    int64_t inRows = int64_t(in.size()) / cols + 1; // one spare row
    in.resize(size_t(inRows * cols), -1.0f);
    int64_t expectRows = 0;
    for (int s = 0; s < ranks; ++s)
      for (int j = 0; j < slots; ++j)
        expectRows += count(s, rank, j);
    out.assign(size_t((expectRows + extraRows) * cols), -5.0f);
    a = mat(in, cols);
    b = vec(send);
    r = mat(out, cols);
    rc = vec(recvCounts);
  }

  /// Checks what arrived (after fetch()).
  void verify(const std::string &how) {
    std::string label = how + " slots=" + std::to_string(slots) +
                        " cols=" + std::to_string(cols);
    size_t at = 0;
    bool countsOk = true, rowsOk = true;
    for (int s = 0; s < ranks; ++s)
      for (int j = 0; j < slots; ++j) {
        countsOk &= recvCounts[size_t(s * slots + j)] == count(s, rank, j);
        for (int i = 0; i < count(s, rank, j); ++i)
          for (int c = 0; c < cols; ++c)
            rowsOk &= out[at++] == value(s, rank, j, i, c);
      }
    bool zeros = true;
    for (; at < out.size(); ++at)
      zeros &= out[at] == 0.0f;
    expect(countsOk, label + ": receive counts");
    expect(rowsOk, label + ": rows by source rank, then slot");
    expect(zeros, label + ": zeros beyond the received rows");
  }
};

void allToAllCase(int slots, int cols, int extraRows) {
  Exchange e(slots, cols, extraRows);
  _mlir_ciface_moert_all_to_all_f32(&e.a, &e.b, &e.r, &e.rc, GROUP);
  fetch();
  e.verify("all_to_all");
}

/// Slot-major layouts (RowLayout): rows received grouped by slot (slot j's
/// rows from every source, padded to `pad` rows), then sent back from that
/// layout; the round trip returns every rank's rows to where they were, and
/// the started form does the same.
void slotCase(int slots, int cols, int pad, bool started) {
  Exchange e(slots, cols, 0);
  // The slot-major result: slot j starts at the padded rows of slots < j.
  std::vector<int64_t> start(size_t(slots) + 1, 0);
  for (int j = 0; j < slots; ++j) {
    int64_t n = 0;
    for (int s = 0; s < ranks; ++s)
      n += count(s, rank, j);
    start[size_t(j) + 1] = start[size_t(j)] + (n + pad - 1) / pad * pad;
  }
  int64_t capacity = start[size_t(slots)] + 3; // and a tail
  std::vector<float> grouped(size_t(capacity * cols), -5.0f);
  std::vector<int32_t> groupedCounts(e.send.size(), -7);
  moert_memref2d g = mat(grouped, cols);
  moert_memref1d gc = vec(groupedCounts);
  std::vector<float> back(e.in.size(), -5.0f);
  std::vector<int32_t> backCounts(e.send.size(), -7);
  moert_memref2d bk = mat(back, cols);
  moert_memref1d bc = vec(backCounts);
  if (started) {
    int64_t h = _mlir_ciface_moert_all_to_all_slots_start_f32(
        &e.a, &e.b, &g, &gc, GROUP, /*layout=*/2, pad);
    _mlir_ciface_moert_all_to_all_wait_f32(h, &e.a, &g);
    h = _mlir_ciface_moert_all_to_all_slots_start_f32(&g, &gc, &bk, &bc, GROUP,
                                                      /*layout=*/1, pad);
    _mlir_ciface_moert_all_to_all_wait_f32(h, &g, &bk);
  } else {
    _mlir_ciface_moert_all_to_all_slots_f32(&e.a, &e.b, &g, &gc, GROUP,
                                            /*layout=*/2, pad);
    _mlir_ciface_moert_all_to_all_slots_f32(&g, &gc, &bk, &bc, GROUP,
                                            /*layout=*/1, pad);
  }
  fetch();
  std::string label = std::string(started ? "started " : "") +
                      "slot-major slots=" + std::to_string(slots) +
                      " pad=" + std::to_string(pad);
  std::vector<float> expected(grouped.size(), 0.0f);
  for (int j = 0; j < slots; ++j) {
    int64_t at = start[size_t(j)];
    for (int s = 0; s < ranks; ++s)
      for (int i = 0; i < count(s, rank, j); ++i, ++at)
        for (int c = 0; c < cols; ++c)
          expected[size_t(at * cols + c)] = value(s, rank, j, i, c);
  }
  expect(grouped == expected,
         label + ": rows by slot, then source rank, zeros between slots");
  bool countsOk = true;
  for (int s = 0; s < ranks; ++s)
    for (int j = 0; j < slots; ++j)
      countsOk &= groupedCounts[size_t(s * slots + j)] == count(s, rank, j) &&
                  backCounts[size_t(s * slots + j)] == count(rank, s, j);
  expect(countsOk, label + ": counts both ways");
  // Back: this rank's rows in their original (peer-major) order, then zeros
  // (the spare input row).
  size_t rows = 0;
  for (int d = 0; d < ranks; ++d)
    for (int j = 0; j < slots; ++j)
      rows += size_t(count(rank, d, j));
  std::vector<float> original(e.in.begin(), e.in.begin() + long(rows * cols));
  original.resize(back.size(), 0.0f);
  expect(back == original, label + ": the reverse exchange restores the rows");
}

/// Three exchanges started back to back, a blocking sum while they travel,
/// then the waits in another order: all arrive intact.
void startedCases() {
  std::vector<Exchange> ex;
  ex.reserve(3);
  ex.emplace_back(1, 3, 0);
  ex.emplace_back(2, 5, 4);
  ex.emplace_back(4, 1, 1);
  int64_t handles[3];
  for (int i = 0; i < 3; ++i)
    handles[i] = _mlir_ciface_moert_all_to_all_start_f32(
        &ex[i].a, &ex[i].b, &ex[i].r, &ex[i].rc, GROUP);
  // A started sum among them, waited for after the blocking one.
  std::vector<double> early(3, double(rank)), earlyOut(3, -1.0);
  auto e = vec(early), eo = vec(earlyOut);
  int64_t reduction =
      _mlir_ciface_moert_all_reduce_sum_start_f64(&e, &eo, GROUP);
  std::vector<float> sum(5, float(rank + 1));
  auto s = vec(sum);
  _mlir_ciface_moert_all_reduce_sum_f32(&s, &s, GROUP);
  for (int i : {1, 2, 0})
    _mlir_ciface_moert_all_to_all_wait_f32(handles[i], &ex[i].a, &ex[i].r);
  _mlir_ciface_moert_all_reduce_sum_wait_f64(reduction, &e, &eo);
  fetch();
  bool earlyOk = true;
  for (double v : earlyOut)
    earlyOk &= v == ranks * (ranks - 1) / 2.0;
  expect(earlyOk, "started all_reduce among started exchanges");
  for (Exchange &e : ex)
    e.verify("started all_to_all");
  bool sumOk = true;
  for (float v : sum)
    sumOk &= v == float(ranks * (ranks + 1) / 2);
  expect(sumOk, "all_reduce while exchanges travel");
  expect(handles[0] != handles[1] && handles[1] != handles[2],
         "started exchanges have distinct handles");
}

void allReduceCases() {
  {
    std::vector<float> in(37), out(37);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = float(rank + 1) * float(i);
    auto a = vec(in), b = vec(out);
    _mlir_ciface_moert_all_reduce_sum_f32(&a, &b, GROUP);
    fetch();
    bool ok = true;
    for (size_t i = 0; i < in.size(); ++i)
      ok &= out[i] == float(ranks * (ranks + 1) / 2) * float(i);
    expect(ok, "all_reduce_sum f32");
  }
  {
    std::vector<double> v = {double(rank), 0.5};
    auto a = vec(v);
    _mlir_ciface_moert_all_reduce_sum_f64(&a, &a, GROUP); // in place
    fetch();
    expect(v[0] == ranks * (ranks - 1) / 2.0 && v[1] == 0.5 * ranks,
           "all_reduce_sum f64 in place");
  }
  {
    std::vector<int32_t> in = {rank, 1}, out(2);
    auto a = vec(in), b = vec(out);
    _mlir_ciface_moert_all_reduce_sum_i32(&a, &b, GROUP);
    fetch();
    expect(out[0] == ranks * (ranks - 1) / 2 && out[1] == ranks,
           "all_reduce_sum i32");
  }
  {
    std::vector<int64_t> in = {int64_t(1) << 40}, out(1);
    auto a = vec(in), b = vec(out);
    _mlir_ciface_moert_all_reduce_sum_i64(&a, &b, GROUP);
    fetch();
    expect(out[0] == (int64_t(1) << 40) * ranks, "all_reduce_sum i64");
  }
  {
    // bf16: 1 + 2^-7 on every rank; summed in f32, rounded once.
    std::vector<uint16_t> in = {0x3F81, 0xBF80}, out(2);
    auto a = vec(in), b = vec(out);
    _mlir_ciface_moert_all_reduce_sum_bf16(&a, &b, GROUP);
    fetch();
    float sum = float(ranks) * (1.0f + 1.0f / 128);
    uint32_t bits;
    std::memcpy(&bits, &sum, 4);
    uint16_t expected = uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
    float neg = -float(ranks);
    std::memcpy(&bits, &neg, 4);
    expect(out[0] == expected && out[1] == uint16_t(bits >> 16),
           "all_reduce_sum bf16");
  }
  {
    // f16: 1.5 and 2^-24 (the smallest subnormal) on every rank.
    std::vector<uint16_t> in = {0x3E00, 0x0001}, out(2);
    auto a = vec(in), b = vec(out);
    _mlir_ciface_moert_all_reduce_sum_f16(&a, &b, GROUP);
    fetch();
    // ranks * 1.5 is exact in f16 for small rank counts.
    float s = 1.5f * float(ranks);
    int e = 0;
    float m = std::frexp(s, &e); // s = m * 2^e, m in [0.5, 1)
    uint16_t expected =
        uint16_t(((e - 1 + 15) << 10) | (uint16_t(std::ldexp(m, 11)) & 0x3FF));
    expect(out[0] == expected && out[1] == uint16_t(ranks),
           "all_reduce_sum f16 (normal and subnormal)");
  }
}

} // namespace

int run(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  Communicator &comm = world();
  rank = comm.rank();
  ranks = worldSize = comm.size();
  if (mode == "info") {
    std::printf("rank %d of %d (%s)\n", rank, ranks, comm.backend());
    return 0;
  }
  if (mode == "group") {
    // argv[2] ranks, argv[3] apart (default 1), of argv[4] (default
    // argv[2] * argv[3]).
    int64_t g = argc > 2 ? std::atoll(argv[2]) : 0,
            apart = argc > 3 ? std::atoll(argv[3]) : 1,
            grid = argc > 4 ? std::atoll(argv[4]) : g * apart;
    std::vector<float> v(4);
    auto a = vec(v);
    _mlir_ciface_moert_all_reduce_sum_f32(&a, &a, g, apart, grid);
    moert::throwStickyError();
    std::printf("rank %d: no error\n", rank);
    return 0;
  }
  if (mode == "overflow" || mode == "bad-counts") {
    // Every rank sends 2 rows to every rank; the result holds fewer than
    // 2 * ranks rows (overflow) or the counts exceed the input (bad-counts).
    std::vector<float> in(size_t(2 * ranks * 4), 1.0f);
    std::vector<int32_t> send(size_t(ranks), mode == "overflow" ? 2 : 3);
    std::vector<int32_t> recv(static_cast<size_t>(ranks));
    std::vector<float> out(size_t((2 * ranks - 1) * 4));
    moert_memref2d a = mat(in, 4), r = mat(out, 4);
    moert_memref1d b = vec(send), rc = vec(recv);
    _mlir_ciface_moert_all_to_all_f32(&a, &b, &r, &rc, GROUP);
    moert::throwStickyError();
    std::printf("rank %d: no error\n", rank);
    return 0;
  }
  if (mode == "wait-twice" || mode == "wait-other") {
    // A wait for a handle already waited for, or with another result buffer.
    Exchange e(1, 2, 1), other(1, 2, 1);
    int64_t h =
        _mlir_ciface_moert_all_to_all_start_f32(&e.a, &e.b, &e.r, &e.rc, GROUP);
    if (mode == "wait-twice") {
      _mlir_ciface_moert_all_to_all_wait_f32(h, &e.a, &e.r);
      _mlir_ciface_moert_all_to_all_wait_f32(h, &e.a, &e.r);
    } else {
      _mlir_ciface_moert_all_to_all_wait_f32(h, &e.a, &other.r);
    }
    moert::throwStickyError();
    std::printf("rank %d: no error\n", rank);
    return 0;
  }
  // groups [device]: every check within each axis of every 2-d grid over
  // the ranks (a x b = N, a and b > 1): a groups of b ranks 1 apart, then b
  // groups of a ranks b apart.
  bool groups = mode == "groups";
  if (groups) {
    mode = argc > 2 ? argv[2] : "all";
    if (mode == "device") {
      onDevice = true;
      moert_gpu_init();
    }
  } else if (mode == "device") {
    onDevice = true;
    moert_gpu_init();
  } else if (mode != "all") {
    std::fprintf(stderr,
                 "usage: moert-comm-test [info|device|overflow|bad-counts|"
                 "wait-twice|wait-other|group G [STRIDE [GRID]]|"
                 "groups [device]]\n");
    return 2;
  }
  auto everyCheck = [] {
    allToAllCase(1, 3, 0);
    allToAllCase(2, 5, 4);
    allToAllCase(4, 1, 1);
    allReduceCases();
    startedCases();
    slotCase(3, 2, 1, false);
    slotCase(4, 3, 4, false);
    slotCase(2, 1, 8, true);
  };
  const int me = comm.rank();
  if (!groups) {
    everyCheck();
  } else {
    int grids = 0;
    for (int a = 2; a < worldSize; ++a) {
      if (worldSize % a)
        continue;
      int b = worldSize / a;
      ++grids;
      for (auto [size, apart] : {std::pair{b, 1}, std::pair{a, b}}) {
        ranks = size;
        stride = apart;
        rank = me / apart % size;
        everyCheck();
      }
    }
    expect(grids > 0, "groups: the ranks launched form a 2-d grid");
    rank = me;
    ranks = worldSize;
    stride = 1;
  }
  comm.barrier();
  expect(moert_comm_rank() == rank && moert_comm_size() == ranks,
         "moert_comm_rank/size");
  std::printf("rank %d: %d checks, %d failed%s\n", rank, checks, failed,
              onDevice ? (std::string(" (device buffers, ") +
                          deviceWorld().backend() + ")")
                             .c_str()
                       : "");
  std::fflush(stdout);
  int32_t total = failed;
  comm.allReduceSum(&total, &total, 1, DType::I32);
  return total ? 1 : 0;
}

int main(int argc, char **argv) {
  return moert::runTool([&] { return run(argc, argv); });
}
