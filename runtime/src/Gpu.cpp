//===- Gpu.cpp - the MLIR GPU host ABI on the CUDA driver API -------------===//

#include "moert/Gpu.h"
#include "moert/Allocator.h"

#include "CudaDriver.h"
#include "moert/Error.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

using namespace moert;
using moert::cuda::driver;

namespace {

int selectedDevice = -1;

/// Where the device number comes from: one GPU per process, the process's
/// index on its host (torchrun's LOCAL_RANK, or the MPI launcher's: Open
/// MPI, MPICH/hydra, Slurm).
const char *const deviceVars[] = {"MOERT_DEVICE", "LOCAL_RANK",
                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "MPI_LOCALRANKID", "SLURM_LOCALID"};

int chooseDevice(const char **source = nullptr) {
  if (source)
    *source = "mgpuSetDefaultDevice";
  if (selectedDevice >= 0)
    return selectedDevice;
  for (const char *var : deviceVars) {
    if (const char *value = std::getenv(var)) {
      char *end = nullptr;
      long device = std::strtol(value, &end, 10);
      if (source)
        *source = var;
      if (*value && end && !*end && device >= 0)
        return int(device);
      throw Error(std::string(var) + "=" + value + " is not a device number");
    }
  }
  if (source)
    *source = nullptr;
  return 0;
}

/// The primary context of the chosen device, retained for the life of the
/// process (so modules can still be unloaded by static destructors).
CUcontext context() {
  static CUcontext ctx = [] {
    const auto &d = driver();
    MOERT_CU(d.cuInit(0));
    int count = 0;
    MOERT_CU(d.cuDeviceGetCount(&count));
    const char *source = nullptr;
    int ordinal = chooseDevice(&source);
    if (ordinal >= count) {
      throw Error("device " + std::to_string(ordinal) + " requested" +
                  (source ? std::string(" (by ") + source + ")" : "") + ", " +
                  std::to_string(count) + " present");
    }
    CUdevice device;
    MOERT_CU(d.cuDeviceGet(&device, ordinal));
    CUcontext c;
    MOERT_CU(d.cuDevicePrimaryCtxRetain(&c, device));
    return c;
  }();
  return ctx;
}

} // namespace

CUcontext moert::gpu::primaryContext() { return context(); }

namespace {

/// Makes the runtime's context current for a scope.
struct Scoped {
  Scoped() { MOERT_CU(driver().cuCtxPushCurrent(context())); }
  ~Scoped() { MOERT_CU(driver().cuCtxPopCurrent(nullptr)); }
};

class DeviceBackend final : public Backend {
public:
  void *allocate(size_t bytes) override {
    CUdeviceptr ptr = 0;
    CUresult r = driver().cuMemAlloc(&ptr, bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
      return nullptr;
    if (r != CUDA_SUCCESS)
      cuda::fail(r, "cuMemAlloc", __FILE__, __LINE__);
    return reinterpret_cast<void *>(ptr);
  }
  void release(void *ptr) override {
    MOERT_CU(driver().cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
  }
  void *recordEvent(void *stream) override {
    CUevent event;
    MOERT_CU(driver().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    MOERT_CU(driver().cuEventRecord(event, static_cast<CUstream>(stream)));
    return event;
  }
  void waitEvent(void *stream, void *event) override {
    MOERT_CU(driver().cuStreamWaitEvent(static_cast<CUstream>(stream),
                                        static_cast<CUevent>(event), 0));
  }
  void destroyEvent(void *event) override {
    MOERT_CU(driver().cuEventDestroy(static_cast<CUevent>(event)));
  }
  void synchronize() override { MOERT_CU(driver().cuCtxSynchronize()); }
};

CachingAllocator &allocator() {
  // Never destroyed: blocks may be freed by static destructors after main.
  static DeviceBackend *backend = new DeviceBackend();
  static CachingAllocator *alloc = new CachingAllocator(*backend);
  return *alloc;
}

struct LazyModule {
  LazyModule(void *data, size_t size, bool jit, int optLevel)
      : data(data), size(size), jit(jit), optLevel(optLevel) {}
  void *data;
  size_t size;
  bool jit;
  int optLevel;
  CUmodule module = nullptr;
  std::once_flag once;
  /// Kernels looked up so far (a program looks its kernel up before every
  /// launch), by the address of the name it passes: a constant of the
  /// program, as long-lived as the module.
  std::mutex mutex;
  std::unordered_map<const char *, CUfunction> functions;
};

/// Loads (once) the module's cubin/fatbin, or JIT-compiles its PTX.
CUmodule load(LazyModule &m) {
  std::call_once(m.once, [&] {
    if (!m.jit) {
      MOERT_CU(driver().cuModuleLoadData(&m.module, m.data));
      return;
    }
    char log[8192] = {0};
    CUjit_option options[] = {CU_JIT_OPTIMIZATION_LEVEL,
                              CU_JIT_ERROR_LOG_BUFFER,
                              CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[] = {reinterpret_cast<void *>(intptr_t(m.optLevel)), log,
                      reinterpret_cast<void *>(sizeof(log))};
    CUresult r =
        driver().cuModuleLoadDataEx(&m.module, m.data, 3, options, values);
    if (r != CUDA_SUCCESS) {
      cuda::fail(r, "cuModuleLoadDataEx", __FILE__, __LINE__,
                 std::string("JIT compilation of PTX failed:\n") + log);
    }
  });
  return m.module;
}

/// The layout of a ranked MLIR memref descriptor.
struct MemRefDescriptor {
  char *allocated;
  char *aligned;
  int64_t offset;
  int64_t sizesAndStrides[];
};

} // namespace

extern "C" {

// Modules are loaded lazily, on their first kernel lookup: MLIR registers
// them from global constructors, which run inside dlopen, where initializing
// the CUDA driver is not safe.
//
// Every entry point below runs guarded (moert/Error.h): an error becomes the
// sticky error, and while it is set the calls do nothing. Loading and
// unloading modules touch no device (or only to unload): they always run.
void *mgpuModuleLoad(void *data, size_t size) {
  return new LazyModule(data, size, /*jit=*/false, 0);
}

void *mgpuModuleLoadJIT(void *ptx, int optLevel) {
  return new LazyModule(ptx, 0, /*jit=*/true, optLevel);
}

void mgpuModuleUnload(void *handle) {
  auto *m = static_cast<LazyModule *>(handle);
  try {
    if (m->module) {
      // At process exit the driver may already be shutting down.
      CUresult r = driver().cuCtxPushCurrent(context());
      if (r == CUDA_SUCCESS) {
        r = driver().cuModuleUnload(m->module);
        driver().cuCtxPopCurrent(nullptr);
      }
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED)
        cuda::fail(r, "cuModuleUnload", __FILE__, __LINE__);
    }
  } catch (const std::exception &e) {
    setStickyError(e);
  }
  delete m;
}

void *mgpuModuleGetFunction(void *handle, const char *name) {
  return guarded<void *>(nullptr, [&]() -> void * {
    auto &lazy = *static_cast<LazyModule *>(handle);
    {
      std::lock_guard<std::mutex> lock(lazy.mutex);
      auto it = lazy.functions.find(name);
      if (it != lazy.functions.end())
        return it->second;
    }
    Scoped scope;
    CUmodule module = load(lazy);
    CUfunction function = nullptr;
    CUresult r = driver().cuModuleGetFunction(&function, module, name);
    if (r != CUDA_SUCCESS) {
      cuda::fail(r, "cuModuleGetFunction", __FILE__, __LINE__,
                 std::string("kernel '") + name + "' not found in its module");
    }
    std::lock_guard<std::mutex> lock(lazy.mutex);
    lazy.functions.emplace(name, function);
    return function;
  });
}

void mgpuLaunchKernel(void *function, intptr_t gridX, intptr_t gridY,
                      intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                      intptr_t blockZ, int32_t sharedMemBytes, void *stream,
                      void **params, void **extra, size_t /*paramsCount*/) {
  guarded([&] {
    Scoped scope;
    auto f = static_cast<CUfunction>(function);
    if (sharedMemBytes > 48 * 1024) {
      // Raised once per kernel (to the most any of its launches asked).
      static std::mutex mutex;
      static std::unordered_map<CUfunction, int32_t> raised;
      std::lock_guard<std::mutex> lock(mutex);
      int32_t &limit = raised[f];
      if (limit < sharedMemBytes) {
        MOERT_CU(driver().cuFuncSetAttribute(
            f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            sharedMemBytes));
        limit = sharedMemBytes;
      }
    }
    CUresult r = driver().cuLaunchKernel(
        f, unsigned(gridX), unsigned(gridY), unsigned(gridZ), unsigned(blockX),
        unsigned(blockY), unsigned(blockZ), unsigned(sharedMemBytes),
        static_cast<CUstream>(stream), params, extra);
    if (r != CUDA_SUCCESS) {
      char what[160];
      std::snprintf(what, sizeof(what),
                    "kernel launch with grid (%ld, %ld, %ld), block (%ld, %ld, "
                    "%ld), %d bytes of shared memory failed",
                    long(gridX), long(gridY), long(gridZ), long(blockX),
                    long(blockY), long(blockZ), int(sharedMemBytes));
      cuda::fail(r, "cuLaunchKernel", __FILE__, __LINE__, what);
    }
  });
}

namespace {
/// The caller's stream the programs of this thread run on
/// (moert_gpu_set_stream), if one is set.
thread_local bool borrowing = false;
thread_local void *borrowed = nullptr;
bool isBorrowed(void *stream) { return borrowing && stream == borrowed; }
} // namespace

void moert_gpu_set_stream(void *stream) {
  borrowing = true;
  borrowed = stream;
}

void moert_gpu_clear_stream(void) {
  borrowing = false;
  borrowed = nullptr;
}

void *mgpuStreamCreate(void) {
  if (borrowing)
    return borrowed;
  return guarded<void *>(nullptr, [&]() -> void * {
    Scoped scope;
    CUstream stream = nullptr;
    MOERT_CU(driver().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    return stream;
  });
}

void mgpuStreamDestroy(void *stream) {
  if (isBorrowed(stream))
    return;
  guarded([&] {
    MOERT_CU(driver().cuStreamDestroy(static_cast<CUstream>(stream)));
  });
}

void mgpuStreamSynchronize(void *stream) {
  if (isBorrowed(stream))
    return; // the caller orders its work after the program's on its stream
  guarded([&] {
    MOERT_CU(driver().cuStreamSynchronize(static_cast<CUstream>(stream)));
  });
}

void mgpuStreamWaitEvent(void *stream, void *event) {
  guarded([&] {
    MOERT_CU(driver().cuStreamWaitEvent(static_cast<CUstream>(stream),
                                        static_cast<CUevent>(event), 0));
  });
}

void *mgpuEventCreate(void) {
  return guarded<void *>(nullptr, [&]() -> void * {
    Scoped scope;
    CUevent event = nullptr;
    MOERT_CU(driver().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    return event;
  });
}

void mgpuEventDestroy(void *event) {
  guarded(
      [&] { MOERT_CU(driver().cuEventDestroy(static_cast<CUevent>(event))); });
}

void mgpuEventSynchronize(void *event) {
  guarded([&] {
    MOERT_CU(driver().cuEventSynchronize(static_cast<CUevent>(event)));
  });
}

void mgpuEventRecord(void *event, void *stream) {
  guarded([&] {
    MOERT_CU(driver().cuEventRecord(static_cast<CUevent>(event),
                                    static_cast<CUstream>(stream)));
  });
}

void *mgpuMemAlloc(uint64_t bytes, void *stream, bool hostShared) {
  return guarded<void *>(nullptr, [&]() -> void * {
    Scoped scope;
    if (hostShared) {
      CUdeviceptr ptr = 0;
      MOERT_CU(driver().cuMemAllocManaged(&ptr, bytes, CU_MEM_ATTACH_GLOBAL));
      return reinterpret_cast<void *>(ptr);
    }
    void *ptr = allocator().allocate(bytes, stream);
    // MOERT_POISON=1: fill new buffers with 0xFF bytes (NaN in every float
    // format) so results a kernel forgot to write cannot pass as right.
    static const bool poison = [] {
      const char *v = std::getenv("MOERT_POISON");
      return v && *v && std::strcmp(v, "0") != 0;
    }();
    if (ptr && poison)
      MOERT_CU(driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(ptr),
                                        0xFF, bytes,
                                        static_cast<CUstream>(stream)));
    if (!ptr) {
      size_t freeBytes = 0, total = 0;
      driver().cuMemGetInfo(&freeBytes, &total);
      AllocatorStats s = allocator().stats();
      throw Error("out of device memory allocating " + std::to_string(bytes) +
                  " bytes (" + std::to_string(freeBytes) + " of " +
                  std::to_string(total) + " bytes free on the device; " +
                  std::to_string(s.bytesInUse) + " in use and " +
                  std::to_string(s.bytesCached) +
                  " cached by the allocator, its largest free piece " +
                  std::to_string(s.largestFree) + ")");
    }
    return ptr;
  });
}

void mgpuMemFree(void *ptr, void *stream) {
  guarded([&] {
    Scoped scope;
    if (!allocator().free(ptr, stream)) {
      // Not ours: a host-shared (managed) allocation.
      MOERT_CU(driver().cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
    }
  });
}

void mgpuMemcpy(void *dst, void *src, size_t bytes, void *stream) {
  guarded([&] {
    Scoped scope;
    MOERT_CU(driver().cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                    reinterpret_cast<CUdeviceptr>(src), bytes,
                                    static_cast<CUstream>(stream)));
  });
}

void mgpuMemset16(void *dst, unsigned short value, size_t count, void *stream) {
  guarded([&] {
    Scoped scope;
    MOERT_CU(driver().cuMemsetD16Async(reinterpret_cast<CUdeviceptr>(dst),
                                       value, count,
                                       static_cast<CUstream>(stream)));
  });
}

void mgpuMemset32(void *dst, unsigned int value, size_t count, void *stream) {
  guarded([&] {
    Scoped scope;
    MOERT_CU(driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dst),
                                       value, count,
                                       static_cast<CUstream>(stream)));
  });
}

static std::pair<char *, size_t> hostRange(int64_t rank, void *descriptor,
                                           int64_t elementBytes) {
  auto *d = static_cast<MemRefDescriptor *>(descriptor);
  int64_t elements = 1;
  for (int64_t i = 0; i < rank; ++i)
    elements *= d->sizesAndStrides[i];
  return {d->aligned + d->offset * elementBytes,
          size_t(elements) * size_t(elementBytes)};
}

void mgpuMemHostRegisterMemRef(int64_t rank, void *descriptor,
                               int64_t elementBytes) {
  guarded([&] {
    Scoped scope;
    auto [ptr, bytes] = hostRange(rank, descriptor, elementBytes);
    MOERT_CU(driver().cuMemHostRegister(ptr, bytes, 0));
  });
}

void mgpuMemHostUnregisterMemRef(int64_t rank, void *descriptor,
                                 int64_t elementBytes) {
  guarded([&] {
    Scoped scope;
    MOERT_CU(driver().cuMemHostUnregister(
        hostRange(rank, descriptor, elementBytes).first));
  });
}

void mgpuSetDefaultDevice(int32_t device) { selectedDevice = device; }

/// A tensor map of rank 2 (`planes` 1) or 3 (boxes of one plane): the
/// instructions that read it name that many coordinates.
static uint64_t tensorMap(int64_t rank, uint64_t base, int64_t elementBytes,
                          int64_t columns, int64_t rows, int64_t planes,
                          int64_t rowStrideBytes, int64_t planeStrideBytes,
                          int64_t boxColumns, int64_t boxRows) {
  return guarded<uint64_t>(0, [&]() -> uint64_t {
    auto bad = [&](const char *what) {
      char text[512];
      char planesText[96] = "";
      if (rank == 3)
        std::snprintf(planesText, sizeof(planesText),
                      "%lld planes %lld bytes apart of ", (long long)planes,
                      (long long)planeStrideBytes);
      std::snprintf(text, sizeof(text),
                    "tensor map of %s%lld x %lld elements of %lld bytes at "
                    "%#llx (rows %lld bytes apart, boxes %lld x %lld): %s",
                    planesText, (long long)rows, (long long)columns,
                    (long long)elementBytes, (unsigned long long)base,
                    (long long)rowStrideBytes, (long long)boxRows,
                    (long long)boxColumns, what);
      throw Error(text);
    };
    CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    switch (elementBytes) {
    case 1:
      type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
      break;
    case 2:
      type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
      break;
    case 4:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
      break;
    default:
      bad("elements must be 1, 2 or 4 bytes");
    }
    if (base % 16 || rowStrideBytes % 16 || columns < 1 || rows < 1 ||
        rowStrideBytes < columns * elementBytes)
      bad("the base and the row stride must be multiples of 16 bytes, the rows "
          "no longer than their stride");
    if (rank == 3 && (planes < 1 || planeStrideBytes % 16 ||
                      planeStrideBytes < rows * rowStrideBytes))
      bad("the plane stride must be a multiple of 16 bytes, the planes no "
          "longer than their stride");
    if (boxColumns < 1 || boxRows < 1 || boxRows > 256 ||
        boxColumns * elementBytes > 128 || (boxColumns * elementBytes) % 16)
      bad("a box row must be 16 to 128 bytes (a multiple of 16), at most 256 "
          "rows");
    // Maps live in slabs of device memory, keyed by their arguments: a
    // training loop asks for the same few maps (most of its buffers come back
    // from the caching allocator at the same addresses), and each is encoded
    // and copied over once. The cache holds at most `capacity` maps; when
    // full, the device is drained (kernels queued earlier may still read any
    // map) and the slabs reused.
    using Key = std::array<int64_t, 10>;
    struct KeyHash {
      size_t operator()(const Key &k) const {
        size_t h = 0;
        for (int64_t v : k)
          h = h * 1000003u ^ std::hash<int64_t>()(v);
        return h;
      }
    };
    static std::mutex mutex;
    static std::unordered_map<Key, CUdeviceptr, KeyHash> maps;
    static std::vector<CUdeviceptr> slabs;
    static size_t used = 0; // maps placed in the slabs
    constexpr size_t perSlab = 512, capacity = 8 * perSlab;
    Key key = {rank,   int64_t(base),  elementBytes,     columns,    rows,
               planes, rowStrideBytes, planeStrideBytes, boxColumns, boxRows};
    std::lock_guard<std::mutex> lock(mutex);
    auto it = maps.find(key);
    if (it != maps.end())
      return it->second;
    Scoped scope;
    CUtensorMap map;
    cuuint64_t dims[3] = {cuuint64_t(columns), cuuint64_t(rows),
                          cuuint64_t(planes)};
    cuuint64_t strides[2] = {cuuint64_t(rowStrideBytes),
                             cuuint64_t(planeStrideBytes)};
    cuuint32_t box[3] = {cuuint32_t(boxColumns), cuuint32_t(boxRows), 1};
    cuuint32_t elementStrides[3] = {1, 1, 1};
    MOERT_CU(driver().cuTensorMapEncodeTiled(
        &map, type, cuuint32_t(rank), reinterpret_cast<void *>(base), dims,
        strides, box, elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        boxColumns * elementBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                         : CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    if (used == capacity) {
      MOERT_CU(driver().cuCtxSynchronize());
      maps.clear();
      used = 0;
    }
    if (used == slabs.size() * perSlab) {
      CUdeviceptr slab = 0;
      MOERT_CU(driver().cuMemAlloc(&slab, perSlab * sizeof(map)));
      slabs.push_back(slab);
    }
    CUdeviceptr at = slabs[used / perSlab] + (used % perSlab) * sizeof(map);
    ++used;
    // Synchronous: the map is in place before any kernel that reads it runs.
    MOERT_CU(driver().cuMemcpyHtoD(at, &map, sizeof(map)));
    maps.emplace(key, at);
    return at;
  });
}

uint64_t moertTensorMap2D(uint64_t base, int64_t elementBytes, int64_t columns,
                          int64_t rows, int64_t rowStrideBytes,
                          int64_t boxColumns, int64_t boxRows) {
  return tensorMap(2, base, elementBytes, columns, rows, 1, rowStrideBytes,
                   rows * rowStrideBytes, boxColumns, boxRows);
}

uint64_t moertTensorMap3D(uint64_t base, int64_t elementBytes, int64_t columns,
                          int64_t rows, int64_t planes, int64_t rowStrideBytes,
                          int64_t planeStrideBytes, int64_t boxColumns,
                          int64_t boxRows) {
  return tensorMap(3, base, elementBytes, columns, rows, planes, rowStrideBytes,
                   planeStrideBytes, boxColumns, boxRows);
}

int moert_gpu_device_count(void) {
  if (!cuda::driverAvailable())
    return 0;
  const auto &d = driver();
  int count = 0;
  if (d.cuInit(0) != CUDA_SUCCESS || d.cuDeviceGetCount(&count) != CUDA_SUCCESS)
    return 0;
  return count;
}

int moert_gpu_device(void) {
  return guarded<int>(0, [&]() -> int { return chooseDevice(); });
}

void moert_gpu_init(void) {
  guarded([&] { (void)context(); });
}

void moert_gpu_get_memory_stats(struct moert_gpu_memory_stats *stats) {
  AllocatorStats s = allocator().stats();
  stats->bytes_in_use = s.bytesInUse;
  stats->bytes_cached = s.bytesCached;
  stats->peak_bytes_in_use = s.peakBytesInUse;
  stats->device_allocations = s.deviceAllocations;
  stats->cache_reuses = s.reuses;
  stats->peak_bytes_reserved = s.peakBytesReserved;
}

void moert_gpu_empty_cache(void) {
  guarded([&] {
    Scoped scope;
    allocator().emptyCache();
  });
}

void moert_gpu_reset_peak_memory(void) {
  guarded([&] {
    Scoped scope;
    allocator().resetPeak();
  });
}

void moert_gpu_synchronize(void) {
  guarded([&] {
    Scoped scope;
    MOERT_CU(driver().cuCtxSynchronize());
  });
}

} // extern "C"
