//===- Tool.h - the error path of libmoert's tools --------------*- C++ -*-===//
//
// libmoert reports errors to its caller (moert/Error.h); tools are where
// the process ends. runTool runs a tool's body and turns an error into the
// message ("moert: <what>") and the exit status, after stopping the other
// ranks of a multi-rank job (comm::abortJob: MPI_Abort under MPI, so that
// no rank waits for this one).
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_TOOL_H
#define MOERT_TOOL_H

#include "moert/Comm.h"
#include "moert/Error.h"

#include <cstdio>
#include <exception>

namespace moert {

/// Prints `e` the way libmoert's messages read, stops the job's other ranks
/// and returns the exit status for it.
inline int reportError(const std::exception &e) {
  const auto *error = dynamic_cast<const Error *>(&e);
  int status = error ? error->status() : 1;
  std::fflush(stdout);
  std::fprintf(stderr, "moert: %s\n", e.what());
  std::fflush(stderr);
  comm::abortJob(status);
  return status;
}

/// Runs a tool's body (returning its exit status); errors are reported
/// (reportError). A sticky error the body left unread is reported too.
template <typename F> int runTool(F &&body) {
  try {
    int status = body();
    throwStickyError();
    return status;
  } catch (const std::exception &e) {
    return reportError(e);
  }
}

} // namespace moert

#endif
