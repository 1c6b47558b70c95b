//===- Gpu.h - libmoert's GPU entry points ----------------------*- C++ -*-===//
//
// Two sets of C functions:
// - the host ABI that MLIR's gpu-to-llvm lowering calls (mgpu*): modules,
//   kernel launches, streams, events, device memory;
// - moert_gpu_*: what tools and tests ask the runtime directly.
// Every CUDA driver call is checked. None of these functions has an error
// return: a failure (naming the call and the error) becomes the sticky error
// of moert/Error.h, which the caller reads with moert_last_error(); while it
// is set the calls do nothing (allocations return NULL).
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_GPU_H
#define MOERT_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// --- the MLIR GPU host ABI (LLVM 22) ---
void *mgpuModuleLoad(void *data, size_t size);
void *mgpuModuleLoadJIT(void *ptx, int optLevel);
void mgpuModuleUnload(void *module);
void *mgpuModuleGetFunction(void *module, const char *name);
void mgpuLaunchKernel(void *function, intptr_t gridX, intptr_t gridY,
                      intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                      intptr_t blockZ, int32_t sharedMemBytes, void *stream,
                      void **params, void **extra, size_t paramsCount);
void *mgpuStreamCreate(void);
void mgpuStreamDestroy(void *stream);
void mgpuStreamSynchronize(void *stream);
void mgpuStreamWaitEvent(void *stream, void *event);
void *mgpuEventCreate(void);
void mgpuEventDestroy(void *event);
void mgpuEventSynchronize(void *event);
void mgpuEventRecord(void *event, void *stream);
void *mgpuMemAlloc(uint64_t bytes, void *stream, bool hostShared);
void mgpuMemFree(void *ptr, void *stream);
void mgpuMemcpy(void *dst, void *src, size_t bytes, void *stream);
void mgpuMemset16(void *dst, unsigned short value, size_t count, void *stream);
void mgpuMemset32(void *dst, unsigned int value, size_t count, void *stream);
void mgpuMemHostRegisterMemRef(int64_t rank, void *descriptor,
                               int64_t elementBytes);
void mgpuMemHostUnregisterMemRef(int64_t rank, void *descriptor,
                                 int64_t elementBytes);
void mgpuSetDefaultDevice(int32_t device);

// --- tensor maps for the bulk tensor copy engine (TMA) ---
/// The device address of a tensor map (CUtensorMap, 128 bytes in device
/// memory, which `cp.async.bulk.tensor` reads) for a 2-D row-major array:
/// `rows` rows of `columns` elements of `elementBytes` (1, 2 or 4) bytes at
/// `base`, rows `rowStrideBytes` apart (a multiple of 16); boxes of
/// `boxColumns` x `boxRows` elements (boxColumns * elementBytes <= 128),
/// stored in shared memory with the 128-byte swizzle when a box row is 128
/// bytes, else unswizzled (rows packed); reads outside the
/// array give zeros. Maps are encoded once and cached (the same arguments
/// give the same address while cached; 4096 are kept, then the device is
/// drained and the cache starts over); a bad argument is the sticky error,
/// saying what is wrong (and the address returned is 0).
uint64_t moertTensorMap2D(uint64_t base, int64_t elementBytes, int64_t columns,
                          int64_t rows, int64_t rowStrideBytes,
                          int64_t boxColumns, int64_t boxRows);

/// The same for a 3-D array: `planes` such arrays, `planeStrideBytes` (a
/// multiple of 16) apart, in boxes of one plane each, so that a box reads
/// zeros (and a store writes nothing) past the rows of its own plane. The
/// map is of rank 3 (its copies name three coordinates), even of one plane.
uint64_t moertTensorMap3D(uint64_t base, int64_t elementBytes, int64_t columns,
                          int64_t rows, int64_t planes, int64_t rowStrideBytes,
                          int64_t planeStrideBytes, int64_t boxColumns,
                          int64_t boxRows);

// --- direct entry points ---
struct moert_gpu_memory_stats {
  size_t bytes_in_use;         ///< allocated by programs, not freed
  size_t bytes_cached;         ///< reserved by the caching allocator, free
  size_t peak_bytes_in_use;    ///< high-water mark of bytes_in_use
  uint64_t device_allocations; ///< segments reserved from the device
  uint64_t cache_reuses;       ///< allocations served from reserved memory
  /// High-water mark of the device memory the allocator holds (in use and
  /// cached: what the device has lent the process's buffers).
  size_t peak_bytes_reserved;
};

/// Initializes the driver and the device's context now (otherwise the first
/// GPU call does). No usable GPU is the sticky error, saying why.
void moert_gpu_init(void);
/// Number of GPUs, 0 when there is no driver or no device (never exits).
int moert_gpu_device_count(void);
/// The device this process uses: MOERT_DEVICE, else LOCAL_RANK, else the
/// MPI launcher's local rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
/// SLURM_LOCALID), else 0,
/// unless mgpuSetDefaultDevice chose one.
int moert_gpu_device(void);
void moert_gpu_get_memory_stats(struct moert_gpu_memory_stats *stats);
/// Gives cached device memory back to the driver.
void moert_gpu_empty_cache(void);
/// Starts new high-water marks (peak_bytes_in_use, peak_bytes_reserved) at
/// the bytes in use and reserved now.
void moert_gpu_reset_peak_memory(void);
/// Waits for all work on the device.
void moert_gpu_synchronize(void);
/// Until moert_gpu_clear_stream, programs called on this thread run on
/// `stream` (a CUstream of the caller's, such as a framework's current
/// stream; NULL is the legacy default stream) instead of a stream of their
/// own: their mgpuStreamCreate returns it, and mgpuStreamDestroy and
/// mgpuStreamSynchronize of it do nothing, so a call queues its work and
/// returns without waiting; the caller orders what reads the results after
/// it on the same stream. Only for programs whose host code reads no device
/// memory (every program without collectives: those synchronize before
/// their exchanges).
void moert_gpu_set_stream(void *stream);
void moert_gpu_clear_stream(void);

#ifdef __cplusplus
}
#endif

#endif
