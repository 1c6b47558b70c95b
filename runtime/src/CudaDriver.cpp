//===- CudaDriver.cpp - the CUDA driver API, loaded at run time -----------===//

#include "CudaDriver.h"
#include "moert/Error.h"

#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <mutex>
#include <string>

namespace moert::cuda {

/// Opens the driver library: MOERT_CUDA_DRIVER names it, else the system's.
static void *openDriver(const char **error) {
  const char *names[] = {"libcuda.so.1", "libcuda.so"};
  void *handle = nullptr;
  if (const char *path = std::getenv("MOERT_CUDA_DRIVER")) {
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  } else {
    for (const char *name : names)
      if ((handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        break;
  }
  if (!handle)
    *error = dlerror();
  return handle;
}

bool driverAvailable() {
  const char *error = nullptr;
  return openDriver(&error) != nullptr;
}

const Driver &driver() {
  static Driver table;
  static std::once_flag once;
  std::call_once(once, [] {
    const char *error = "unknown error";
    void *handle = openDriver(&error);
    if (!handle)
      throw Error(std::string("cannot load the CUDA driver: ") + error +
                  "\nmoert: this program needs an NVIDIA GPU and its driver");
#define MOERT_LOAD(name)                                                       \
  table.name =                                                                 \
      reinterpret_cast<decltype(table.name)>(dlsym(handle, MOERT_STR(name)));  \
  if (!table.name)                                                             \
    throw Error(std::string("the CUDA driver has no ") + MOERT_STR(name) +     \
                "; update the driver");
    MOERT_CUDA_FUNCTIONS(MOERT_LOAD)
#undef MOERT_LOAD
  });
  return table;
}

void fail(CUresult result, const char *call, const char *file, int line,
          const std::string &before) {
  const char *name = "unknown", *text = "";
  const Driver &d = driver();
  d.cuGetErrorName(result, &name);
  d.cuGetErrorString(result, &text);
  char where[512];
  std::snprintf(where, sizeof(where), "%s failed: %s (error %d: %s) [%s:%d]",
                call, name, int(result), text ? text : "", file, line);
  throw Error(before.empty() ? std::string(where)
                             : before + "\nmoert: " + where);
}

} // namespace moert::cuda
