//===- GpuInfo.cpp - what the runtime sees --------------------------------===//
//
// `moert-gpu-info` prints the number of GPUs; `moert-gpu-info --alloc N`
// allocates and frees N bytes on the device through the mgpu ABI and prints
// the allocator's statistics. Without a driver the first prints 0 and the
// second fails with the runtime's message and exit status 1.
// `moert-gpu-info --tensor-map ...` encodes a TMA tensor map twice
// (moertTensorMap2D; with PLANES and PLANE_STRIDE_BYTES, moertTensorMap3D) and
// says whether the cache answered the second time; bad arguments fail with
// the runtime's message.
//
//===----------------------------------------------------------------------===//

#include "moert/Gpu.h"
#include "moert/Tool.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int run(int argc, char **argv) {
  if (argc == 1) {
    std::printf("gpus: %d\n", moert_gpu_device_count());
    return 0;
  }
  if (argc == 3 && !std::strcmp(argv[1], "--alloc")) {
    unsigned long long bytes = std::strtoull(argv[2], nullptr, 10);
    void *stream = mgpuStreamCreate();
    void *p = mgpuMemAlloc(bytes, stream, false);
    mgpuMemFree(p, stream);
    void *q = mgpuMemAlloc(bytes, stream, false);
    mgpuMemFree(q, stream);
    mgpuStreamSynchronize(stream);
    mgpuStreamDestroy(stream);
    moert_gpu_memory_stats stats;
    moert_gpu_get_memory_stats(&stats);
    moert::throwStickyError();
    std::printf("device allocations: %llu, reuses: %llu, cached bytes: %zu\n",
                (unsigned long long)stats.device_allocations,
                (unsigned long long)stats.cache_reuses, stats.bytes_cached);
    return 0;
  }
  if ((argc == 8 || argc == 10) && !std::strcmp(argv[1], "--tensor-map")) {
    // Encoded twice: the same cached map both times. (Encoding reads no
    // memory at the address, so any 16-byte aligned one will do.)
    long long v[8];
    for (int i = 0; i < argc - 2; ++i)
      v[i] = std::strtoll(argv[2 + i], nullptr, 10);
    uint64_t base = 0x10000;
    auto encode = [&] {
      return argc == 8
                 ? moertTensorMap2D(base, v[0], v[1], v[2], v[3], v[4], v[5])
                 : moertTensorMap3D(base, v[0], v[1], v[2], v[6], v[3], v[7],
                                    v[4], v[5]);
    };
    uint64_t a = encode();
    uint64_t b = encode();
    moert::throwStickyError();
    std::printf("tensor map: %s, 64-byte aligned: %s\n",
                a == b ? "cached" : "encoded twice", a % 64 ? "no" : "yes");
    return 0;
  }
  std::fprintf(stderr, "usage: moert-gpu-info [--alloc BYTES] [--tensor-map "
                       "ELEMENT_BYTES COLUMNS ROWS ROW_STRIDE_BYTES "
                       "BOX_COLUMNS BOX_ROWS [PLANES "
                       "PLANE_STRIDE_BYTES]]\n");
  return 2;
}

int main(int argc, char **argv) {
  return moert::runTool([&] { return run(argc, argv); });
}
