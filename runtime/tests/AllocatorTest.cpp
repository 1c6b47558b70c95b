//===- AllocatorTest.cpp - the caching allocator, without a GPU -----------===//
//
// A fake device backend records every call; the test checks sizes, reuse,
// stream safety (a block freed on stream A and reused on stream B makes B
// wait for A's free), out-of-memory recovery and the statistics. Prints one
// line per check and "N checks, M failed"; exits non-zero on a failure.
//
//===----------------------------------------------------------------------===//

#include "moert/Allocator.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace moert;

namespace {
int checks = 0, failures = 0;

void check(bool ok, const std::string &what) {
  ++checks;
  if (!ok)
    ++failures;
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
}

struct FakeBackend : Backend {
  size_t capacity = 64 << 20, used = 0;
  std::set<void *> live;
  std::vector<std::string> log;
  int nextEvent = 1;
  uintptr_t next = 0x1000;

  void *allocate(size_t bytes) override {
    if (used + bytes > capacity) {
      log.push_back("oom");
      return nullptr;
    }
    used += bytes;
    void *p = reinterpret_cast<void *>(next);
    next += bytes;
    live.insert(p);
    sizes[p] = bytes;
    log.push_back("alloc " + std::to_string(bytes));
    return p;
  }
  void release(void *p) override {
    used -= sizes[p];
    live.erase(p);
    log.push_back("release");
  }
  void *recordEvent(void *stream) override {
    log.push_back("record s" +
                  std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return reinterpret_cast<void *>(uintptr_t(nextEvent++));
  }
  void waitEvent(void *stream, void *event) override {
    log.push_back("wait s" +
                  std::to_string(reinterpret_cast<uintptr_t>(stream)) + " e" +
                  std::to_string(reinterpret_cast<uintptr_t>(event)));
  }
  void destroyEvent(void *) override { log.push_back("destroy"); }
  void synchronize() override { log.push_back("sync"); }
  std::map<void *, size_t> sizes;
};

void *S(int i) { return reinterpret_cast<void *>(uintptr_t(i)); }
} // namespace

int main() {
  check(CachingAllocator::roundSize(0) == 512,
        "0 bytes reserve one 512-byte granule");
  check(CachingAllocator::roundSize(1000) == 1024, "1000 bytes round to 1024");
  check(CachingAllocator::roundSize(3 << 20) == (4u << 20),
        "3 MiB round to 4 MiB (2 MiB granules)");

  {
    FakeBackend dev;
    CachingAllocator alloc(dev);
    void *a = alloc.allocate(1000, S(1));
    check(a != nullptr && dev.live.size() == 1,
          "first allocation reaches the device");
    check(alloc.free(a, S(1)), "free of a known block");
    void *b = alloc.allocate(900, S(1));
    check(b == a, "same size class on the same stream reuses the block");
    check(dev.log.back() == "destroy", "same-stream reuse needs no wait");
    AllocatorStats st = alloc.stats();
    check(st.deviceAllocations == 1 && st.reuses == 1,
          "stats count one device allocation and one reuse");
    check(st.bytesInUse == 1024 && st.bytesCached == 0,
          "stats: 1024 bytes in use, nothing cached");

    alloc.free(b, S(1));
    void *c = alloc.allocate(1024, S(2));
    check(c == a, "a block freed on stream 1 is reused on stream 2");
    check(dev.log.back().rfind("wait s2", 0) == 0,
          "... after stream 2 waits for the free on stream 1");

    check(!alloc.free(reinterpret_cast<void *>(0xdead), S(1)),
          "freeing an unknown pointer is reported");
    check(alloc.free(nullptr, S(1)), "freeing null is a no-op");
    alloc.free(c, S(2));
    check(alloc.stats().peakBytesInUse == 1024, "peak bytes in use");
  }

  {
    FakeBackend dev;
    dev.capacity = 8 << 20;
    CachingAllocator alloc(dev);
    void *a = alloc.allocate(3 << 20, S(1)); // 4 MiB
    alloc.free(a, S(1));                     // cached
    void *b = alloc.allocate(5 << 20, S(1)); // 6 MiB: needs the cache back
    bool synced = false;
    for (auto &l : dev.log)
      synced |= l == "sync";
    check(
        b != nullptr && synced && alloc.stats().bytesCached == 0,
        "out of memory gives the cache back (after a device sync) and retries");
    void *c = alloc.allocate(6 << 20, S(1));
    check(c == nullptr, "a request that cannot fit returns null");
    alloc.free(b, S(1));
    alloc.emptyCache();
    check(dev.live.empty(),
          "emptyCache returns every cached block to the device");
  }

  std::printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
