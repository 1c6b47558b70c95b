//===- StagedComm.cpp - device buffers over a host communicator -----------===//
//
// The device communicator when NCCL is not used (MOERT_COMM_BACKEND=mpi, or
// one rank): device buffers are copied to host memory, exchanged by the host
// communicator (MPI, one rank) and copied back. Also the question every
// entry point asks first: is this pointer device memory?
//
//===----------------------------------------------------------------------===//

#include "CommBackends.h"
#include "CudaDriver.h"
#include "moert/Gpu.h"

#include <atomic>
#include <cstdlib>
#include <dlfcn.h>
#include <vector>

namespace moert::comm {
namespace {

using cuda::driver;

CUdeviceptr dev(const void *p) { return reinterpret_cast<CUdeviceptr>(p); }

/// Makes the runtime's context current for a scope.
struct ContextScope {
  ContextScope() { MOERT_CU(driver().cuCtxPushCurrent(gpu::primaryContext())); }
  ~ContextScope() { driver().cuCtxPopCurrent(nullptr); }
};

//===----------------------------------------------------------------------===//
// Device buffers through host memory, over a host communicator
//===----------------------------------------------------------------------===//

class StagedComm final : public Communicator {
public:
  explicit StagedComm(Communicator &host) : host(host) {}
  const char *backend() const override { return host.backend(); }
  int rank() const override { return host.rank(); }
  int size() const override { return host.size(); }

  void allToAllV(const void *send, int64_t sendRows, const int32_t *sendCounts,
                 int64_t slots, int64_t rowBytes, void *recv,
                 int64_t recvCapacity, int32_t *recvCounts, const char *what,
                 const RowLayout &layout) override {
    if (!isDevicePointer(sendCounts))
      return host.allToAllV(send, sendRows, sendCounts, slots, rowBytes, recv,
                            recvCapacity, recvCounts, what, layout);
    ContextScope scope;
    MOERT_CU(driver().cuCtxSynchronize());
    size_t count = size_t(slots * size());
    std::vector<char> in(size_t(sendRows * rowBytes)),
        out(size_t(recvCapacity * rowBytes));
    std::vector<int32_t> sc(count), rc(count);
    if (!in.empty())
      MOERT_CU(driver().cuMemcpyDtoH(in.data(), dev(send), in.size()));
    MOERT_CU(driver().cuMemcpyDtoH(sc.data(), dev(sendCounts),
                                   count * sizeof(int32_t)));
    host.allToAllV(in.data(), sendRows, sc.data(), slots, rowBytes, out.data(),
                   recvCapacity, rc.data(), what, layout);
    if (!out.empty())
      MOERT_CU(driver().cuMemcpyHtoD(dev(recv), out.data(), out.size()));
    MOERT_CU(driver().cuMemcpyHtoD(dev(recvCounts), rc.data(),
                                   count * sizeof(int32_t)));
    MOERT_CU(driver().cuCtxSynchronize());
  }

  void allReduceSum(const void *in, void *out, int64_t count,
                    DType type) override {
    if (!isDevicePointer(in) && !isDevicePointer(out))
      return host.allReduceSum(in, out, count, type);
    ContextScope scope;
    MOERT_CU(driver().cuCtxSynchronize());
    std::vector<char> buffer(size_t(count) * bytes(type));
    if (!buffer.empty())
      MOERT_CU(driver().cuMemcpyDtoH(buffer.data(), dev(in), buffer.size()));
    host.allReduceSum(buffer.data(), buffer.data(), count, type);
    if (!buffer.empty())
      MOERT_CU(driver().cuMemcpyHtoD(dev(out), buffer.data(), buffer.size()));
    MOERT_CU(driver().cuCtxSynchronize());
  }

  void barrier() override { host.barrier(); }
  void abort(int code) override { host.abort(code); }

  std::unique_ptr<Communicator> split(int color, int colors, int key,
                                      int size) override {
    return createStagedCommunicator(host.split(color, colors, key, size));
  }
  void setMembers(std::vector<int> members) override {
    if (owned)
      owned->setMembers(members);
    Communicator::setMembers(std::move(members));
  }

  /// A group's: the host communicator is its own.
  std::unique_ptr<Communicator> owned;

private:
  Communicator &host;
};

/// cuPointerGetAttribute, once libcuda is in the process.
using PointerAttribute = CUresult (*)(void *, CUpointer_attribute, CUdeviceptr);

PointerAttribute pointerAttribute() {
  static std::atomic<PointerAttribute> fn{nullptr};
  if (PointerAttribute f = fn.load(std::memory_order_acquire))
    return f;
  // Only a driver that is loaded already: no driver, no device memory.
  const char *path = std::getenv("MOERT_CUDA_DRIVER");
  void *handle = nullptr;
  if (path && *path)
    handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
  else
    for (const char *name : {"libcuda.so.1", "libcuda.so"})
      if ((handle = dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL)))
        break;
  if (!handle)
    return nullptr;
  auto f = reinterpret_cast<PointerAttribute>(
      dlsym(handle, "cuPointerGetAttribute"));
  dlclose(handle); // NOLOAD took a reference; the driver stays loaded
  if (f)
    fn.store(f, std::memory_order_release);
  return f;
}

} // namespace

bool isDevicePointer(const void *p) {
  if (!p)
    return false;
  PointerAttribute f = pointerAttribute();
  if (!f)
    return false;
  CUmemorytype type = CUmemorytype(0);
  CUresult r = f(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev(p));
  // Host memory the driver does not know is CUDA_ERROR_INVALID_VALUE; a
  // driver nobody initialized, CUDA_ERROR_NOT_INITIALIZED: host either way.
  return r == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE;
}

std::unique_ptr<Communicator> createStagedCommunicator(Communicator &host) {
  return std::make_unique<StagedComm>(host);
}

std::unique_ptr<Communicator>
createStagedCommunicator(std::unique_ptr<Communicator> host) {
  auto staged = std::make_unique<StagedComm>(*host);
  staged->owned = std::move(host);
  return staged;
}

} // namespace moert::comm
