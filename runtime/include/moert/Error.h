//===- Error.h - how libmoert reports errors --------------------*- C++ -*-===//
//
// libmoert never ends the process on an error: it reports it to its caller.
//
// - C++ callers (the tools, the trainer) get a moert::Error exception whose
//   what() is the message as the tools print it after "moert: ", e.g.
//   "rank 1: all_to_all #3 (f32 rows): timed out after 300 s ...", and
//   whose status() is the exit status a tool should end with (1: a usage or
//   launch error, 2: a failed or stalled peer, a collective that timed out).
// - The C entry points that compiled programs call (the mgpu* host ABI, the
//   moert_* collectives) have no error return. An error there becomes the
//   process's sticky error, like CUDA's: the first error is kept, and every
//   later call of those entry points does nothing (allocations return NULL,
//   received counts are zero) until the caller reads it and clears it. Code
//   that runs an artifact (moert::artifact::call, the Python runtime)
//   checks it after each call and reports it.
//
// The one exception to "never ends the process" is a deadline watchdog of
// the NCCL backend: a call that blocks inside NCCL beyond the deadline
// (ncclCommInitRank, connection setup) cannot be returned from, and a rank
// that hangs would hang the job; see src/NcclComm.cpp. The fault-injection
// test hook MOERT_TEST_FAIL_RANK also exits, on purpose (it simulates a
// crash; see Comm.h).
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_ERROR_H
#define MOERT_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/// The sticky error of the C entry points (without the "moert: " prefix),
/// or NULL when there is none. The text stays valid until
/// moert_clear_error().
const char *moert_last_error(void);
/// The exit status a tool should end with for the sticky error (1 or 2), 0
/// when there is none.
int moert_last_error_status(void);
/// Forgets the sticky error: the entry points work again. (A communicator
/// that failed stays failed: its collectives report that.)
void moert_clear_error(void);

#ifdef __cplusplus
}

#include <exception>
#include <stdexcept>
#include <string>

namespace moert {

/// An error libmoert reports to its caller. what() is the text after
/// "moert: " (it names the failing call and, where there is one, the rank).
class Error : public std::runtime_error {
public:
  explicit Error(const std::string &text, int status = 1)
      : std::runtime_error(text), status_(status) {}
  /// The exit status for a tool that stops on this error.
  int status() const { return status_; }

private:
  int status_;
};

/// An error before any rank is known or outside a collective:
/// "error: <message>".
[[noreturn]] void fail(const std::string &message, int status = 1);

/// Makes `e` the sticky error unless one is set already.
void setStickyError(const std::exception &e);
/// Whether a sticky error is set.
bool hasStickyError();
/// Throws the sticky error as an Error and clears it; returns when there is
/// none. For code that calls an artifact's entry points.
void throwStickyError();

/// Runs `body` for a C entry point: nothing when a sticky error is set
/// (returns `fallback`), and an exception becomes the sticky error.
template <typename R, typename F> R guarded(R fallback, F &&body) {
  if (hasStickyError())
    return fallback;
  try {
    return body();
  } catch (const std::exception &e) {
    setStickyError(e);
    return fallback;
  }
}
template <typename F> void guarded(F &&body) {
  if (hasStickyError())
    return;
  try {
    body();
  } catch (const std::exception &e) {
    setStickyError(e);
  }
}

} // namespace moert
#endif

#endif
