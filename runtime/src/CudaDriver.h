//===- CudaDriver.h - the CUDA driver API, loaded at run time ---*- C++ -*-===//
//
// libmoert does not link against libcuda: it opens libcuda.so.1 on first use.
// Artifacts and tools then load on machines without a GPU (CI, the build
// machine) and fail with a clear message only when they touch the device.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_SRC_CUDADRIVER_H
#define MOERT_SRC_CUDADRIVER_H

#include <cuda.h>

#include <string>

namespace moert::cuda {

#define MOERT_STR_(x) #x
#define MOERT_STR(x) MOERT_STR_(x)

// Every driver entry point the runtime uses. cuda.h maps some names to
// versioned symbols (cuMemAlloc -> cuMemAlloc_v2); MOERT_STR expands them, so
// the versioned symbol is looked up.
#define MOERT_CUDA_FUNCTIONS(X)                                                \
  X(cuInit)                                                                    \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)                                                          \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetName)                                                           \
  X(cuDeviceGetAttribute)                                                      \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuCtxPushCurrent)                                                          \
  X(cuCtxPopCurrent)                                                           \
  X(cuCtxSynchronize)                                                          \
  X(cuModuleLoadData)                                                          \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleUnload)                                                            \
  X(cuModuleGetFunction)                                                       \
  X(cuFuncSetAttribute)                                                        \
  X(cuLaunchKernel)                                                            \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy)                                                           \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuEventCreate)                                                             \
  X(cuEventDestroy)                                                            \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuEventElapsedTime)                                                        \
  X(cuMemAlloc)                                                                \
  X(cuMemAllocManaged)                                                         \
  X(cuMemFree)                                                                 \
  X(cuMemGetInfo)                                                              \
  X(cuMemcpyAsync)                                                             \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemsetD8Async)                                                           \
  X(cuMemsetD16Async)                                                          \
  X(cuMemsetD32Async)                                                          \
  X(cuMemHostRegister)                                                         \
  X(cuMemHostUnregister)                                                       \
  X(cuStreamQuery)                                                             \
  X(cuEventQuery)                                                              \
  X(cuTensorMapEncodeTiled)

struct Driver {
#define MOERT_DECLARE(name) decltype(&::name) name = nullptr;
  MOERT_CUDA_FUNCTIONS(MOERT_DECLARE)
#undef MOERT_DECLARE
};

/// The driver, loaded on first use. Exits with a message naming what is
/// missing when there is no usable driver.
const Driver &driver();

/// True if libcuda.so.1 can be loaded (no exit when it cannot).
bool driverAvailable();

/// Reports a failed driver call: throws moert::Error with the call's text,
/// the error's name and description (after `before`, a line saying what
/// was being done, when given).
[[noreturn]] void fail(CUresult result, const char *call, const char *file,
                       int line, const std::string &before = "");

} // namespace moert::cuda

namespace moert::gpu {
/// The primary context of the device this process uses (MOERT_DEVICE,
/// LOCAL_RANK, the MPI launcher's local rank, else 0), created on first use;
/// throws moert::Error when there is no usable GPU.
CUcontext primaryContext();
} // namespace moert::gpu

/// Runs a driver call; a failure throws moert::Error naming it.
#define MOERT_CU(call)                                                         \
  do {                                                                         \
    CUresult moert_result_ = (call);                                           \
    if (moert_result_ != CUDA_SUCCESS)                                         \
      ::moert::cuda::fail(moert_result_, #call, __FILE__, __LINE__);           \
  } while (0)

#endif
