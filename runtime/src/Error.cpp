//===- Error.cpp - the sticky error of the C entry points -----------------===//

#include "moert/Error.h"

#include <mutex>

namespace moert {
namespace {

struct Sticky {
  std::mutex mu;
  bool set = false;
  std::string text;
  int status = 0;
};

Sticky &sticky() {
  static Sticky *s = new Sticky(); // never destroyed: exit handlers may ask
  return *s;
}

} // namespace

void fail(const std::string &message, int status) {
  throw Error("error: " + message, status);
}

void setStickyError(const std::exception &e) {
  Sticky &s = sticky();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.set)
    return;
  s.set = true;
  s.text = e.what();
  const auto *error = dynamic_cast<const Error *>(&e);
  s.status = error ? error->status() : 1;
}

bool hasStickyError() {
  Sticky &s = sticky();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.set;
}

void throwStickyError() {
  Sticky &s = sticky();
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.set)
    return;
  Error error(s.text, s.status);
  s.set = false;
  s.text.clear();
  s.status = 0;
  lock.unlock();
  throw error;
}

} // namespace moert

using namespace moert;

extern "C" {

const char *moert_last_error(void) {
  Sticky &s = sticky();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.set ? s.text.c_str() : nullptr;
}

int moert_last_error_status(void) {
  Sticky &s = sticky();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.set ? s.status : 0;
}

void moert_clear_error(void) {
  Sticky &s = sticky();
  std::lock_guard<std::mutex> lock(s.mu);
  s.set = false;
  s.text.clear();
  s.status = 0;
}

} // extern "C"
