//===- NotNccl.cpp - a library that is not NCCL, for libmoert's loader ----===//
//
// MOERT_NCCL_LIBRARY=libmoert-not-nccl.so: it has ncclGetVersion (an old
// NCCL's) and nothing else, so the loader must say what is missing.
extern "C" int ncclGetVersion(int *version) {
  *version = 2604; // NCCL 2.6.4: before ncclSend/ncclRecv
  return 0;
}
