//===- GpuInfo.cpp - what the runtime sees --------------------------------===//
//
// `moert-gpu-info` prints the number of GPUs; `moert-gpu-info --alloc N`
// allocates and frees N bytes on the device through the mgpu ABI and prints
// the allocator's statistics. Without a driver the first prints 0 and the
// second fails with the runtime's message and exit status 1.
//
//===----------------------------------------------------------------------===//

#include "moert/Gpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char **argv) {
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
    std::printf("device allocations: %llu, reuses: %llu, cached bytes: %zu\n",
                (unsigned long long)stats.device_allocations,
                (unsigned long long)stats.cache_reuses, stats.bytes_cached);
    return 0;
  }
  std::fprintf(stderr, "usage: moert-gpu-info [--alloc BYTES]\n");
  return 2;
}
