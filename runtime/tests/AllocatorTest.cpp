//===- AllocatorTest.cpp - the caching allocator, without a GPU -----------===//
//
// A fake device backend records every call; the test checks sizes, reuse,
// splitting and merging of pieces, stream safety (a piece freed on stream A
// and reused on stream B makes B wait for A's free), a training step's
// pattern running without device allocations after its first iteration,
// out-of-memory recovery and the statistics, and that a call failing
// anywhere for want of host memory (operator new made to throw at its n-th
// allocation, for every n) leaves the allocator as it was: no piece lost,
// every segment back to the device in the end. Prints one line per check
// and "N checks, M failed"; exits non-zero on a failure.
//
//===----------------------------------------------------------------------===//

#include "moert/Allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <set>
#include <string>
#include <vector>

using namespace moert;

namespace {
int checks = 0, failures = 0;

/// Host allocations fail on purpose: while `injecting`, the allocation
/// that finds `failIn` at 0 throws bad_alloc (`injected` counts them).
bool injecting = false;
long failIn = -1, injected = 0;
} // namespace

void *operator new(size_t bytes) {
  if (injecting && failIn >= 0 && failIn-- == 0) {
    ++injected;
    throw std::bad_alloc();
  }
  if (void *p = std::malloc(bytes ? bytes : 1))
    return p;
  throw std::bad_alloc();
}
void *operator new[](size_t bytes) { return operator new(bytes); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }
void operator delete[](void *p, size_t) noexcept { std::free(p); }
void *operator new(size_t bytes, const std::nothrow_t &) noexcept {
  try {
    return operator new(bytes);
  } catch (const std::bad_alloc &) {
    return nullptr;
  }
}
void *operator new[](size_t bytes, const std::nothrow_t &tag) noexcept {
  return operator new(bytes, tag);
}
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept {
  std::free(p);
}

namespace {
/// No injected failures in its scope (the fake device's bookkeeping).
struct Uninjected {
  bool saved = injecting;
  Uninjected() { injecting = false; }
  ~Uninjected() { injecting = saved; }
};

void check(bool ok, const std::string &what) {
  ++checks;
  if (!ok)
    ++failures;
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
}

constexpr size_t MiB = size_t(1) << 20;

struct FakeBackend : Backend {
  size_t capacity = 64 * MiB, used = 0;
  std::set<void *> live;
  std::vector<std::string> log;
  int nextEvent = 1, eventsLive = 0;
  std::set<void *> events; ///< recorded, not destroyed
  int misusedEvents = 0;   ///< waits on or destroys of dead events
  uintptr_t next = 0x1000;

  void *allocate(size_t bytes) override {
    Uninjected guard;
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
    Uninjected guard;
    used -= sizes[p];
    live.erase(p);
    log.push_back("release");
  }
  void *recordEvent(void *stream) override {
    Uninjected guard;
    log.push_back("record s" +
                  std::to_string(reinterpret_cast<uintptr_t>(stream)));
    ++eventsLive;
    void *e = reinterpret_cast<void *>(uintptr_t(nextEvent++));
    events.insert(e);
    return e;
  }
  void waitEvent(void *stream, void *event) override {
    Uninjected guard;
    misusedEvents += !events.count(event);
    log.push_back("wait s" +
                  std::to_string(reinterpret_cast<uintptr_t>(stream)) + " e" +
                  std::to_string(reinterpret_cast<uintptr_t>(event)));
  }
  void destroyEvent(void *event) override {
    Uninjected guard;
    misusedEvents += !events.erase(event);
    --eventsLive;
    log.push_back("destroy");
  }
  void synchronize() override {
    Uninjected guard;
    log.push_back("sync");
  }
  int count(const std::string &prefix) const {
    return int(std::count_if(log.begin(), log.end(), [&](const std::string &l) {
      return l.rfind(prefix, 0) == 0;
    }));
  }
  std::map<void *, size_t> sizes;
};

void *S(int i) { return reinterpret_cast<void *>(uintptr_t(i)); }
char *at(void *p) { return static_cast<char *>(p); }
} // namespace

int main() {
  check(CachingAllocator::roundSize(0) == 512,
        "0 bytes reserve one 512-byte granule");
  check(CachingAllocator::roundSize(1000) == 1024, "1000 bytes round to 1024");
  check(CachingAllocator::roundSize(3 * MiB) == 4 * MiB,
        "3 MiB round to 4 MiB (2 MiB granules)");
  check(CachingAllocator::segmentSize(1024) == 2 * MiB &&
            CachingAllocator::segmentSize(4 * MiB) == 20 * MiB &&
            CachingAllocator::segmentSize(32 * MiB) == 32 * MiB,
        "segments: 2 MiB for small requests, at least 20 MiB for large");

  {
    FakeBackend dev;
    CachingAllocator alloc(dev);
    void *a = alloc.allocate(1000, S(1));
    check(a != nullptr && dev.log.back() == "alloc " + std::to_string(2 * MiB),
          "a small request reserves a 2 MiB segment");
    void *b = alloc.allocate(1000, S(1));
    check(at(b) == at(a) + 1024 && alloc.stats().deviceAllocations == 1,
          "the next one is split from the same segment");
    check(alloc.free(a, S(1)), "free of a known piece");
    void *c = alloc.allocate(900, S(1));
    check(c == a, "a freed piece of the size is reused (best fit)");
    check(dev.count("wait") == 0, "same-stream reuse needs no wait");
    AllocatorStats st = alloc.stats();
    check(st.deviceAllocations == 1 && st.reuses == 2,
          "stats count one device allocation and two reuses");
    check(st.bytesInUse == 2048 && st.bytesCached == 2 * MiB - 2048,
          "stats: 2048 bytes in use, the rest of the segment cached");

    alloc.free(c, S(1));
    void *d = alloc.allocate(1024, S(2));
    check(d == a, "a piece freed on stream 1 is reused on stream 2");
    check(dev.count("wait s2") == 1,
          "... after stream 2 waits for the free on stream 1");

    check(!alloc.free(reinterpret_cast<void *>(0xdead), S(1)),
          "freeing an unknown pointer is reported");
    check(alloc.free(nullptr, S(1)), "freeing null is a no-op");
    alloc.free(d, S(2));
    alloc.free(b, S(3));
    void *e = alloc.allocate(3072, S(4));
    check(e == a && dev.count("wait s4") == 2,
          "freed neighbours merge; the merged piece waits for each stream's "
          "latest free (2 and 3)");
    check(alloc.stats().peakBytesInUse == 3072, "peak bytes in use");
    check(alloc.stats().peakBytesReserved == 2 * MiB,
          "peak bytes reserved: the one segment");
    alloc.free(e, S(4));
    alloc.emptyCache();
    check(dev.live.empty() && dev.eventsLive == 0,
          "emptyCache returns the segment; every event is destroyed");
    check(dev.misusedEvents == 0,
          "no wait on, or destroy of, an event already destroyed");
  }

  {
    // A piece split from one freed on stream 1: stream 1 takes part of it
    // without waiting; stream 2, taking the rest, waits for the free.
    FakeBackend dev;
    CachingAllocator alloc(dev);
    void *a = alloc.allocate(4096, S(1));
    alloc.free(a, S(1));
    void *b = alloc.allocate(1024, S(1));
    void *c = alloc.allocate(1024, S(2));
    check(b == a && c == at(a) + 1024 && dev.count("wait s1") == 0 &&
              dev.count("wait s2") == 1 && dev.misusedEvents == 0,
          "the rest of a split piece keeps its frees for other streams");
    alloc.free(b, S(1));
    alloc.free(c, S(2));
    alloc.emptyCache();
    check(dev.eventsLive == 0 && dev.misusedEvents == 0,
          "... and every event is destroyed once");
  }

  {
    FakeBackend dev;
    CachingAllocator alloc(dev);
    void *x = alloc.allocate(24 * MiB, S(1));
    void *y = alloc.allocate(30 * MiB, S(1));
    alloc.free(y, S(1));
    alloc.free(x, S(1));
    void *z = alloc.allocate(23 * MiB, S(1));
    check(z == x, "the smallest free piece that holds a request is taken");
    alloc.free(z, S(1));
  }

  {
    // A step that needs 20 + 10, then 40 MiB at once, where a cache of one
    // piece per size (30 + 20 + 10 + 40) would not fit 64 MiB: after the
    // first step, no device allocation and no synchronization.
    FakeBackend dev;
    CachingAllocator alloc(dev);
    auto step = [&] {
      void *a = alloc.allocate(30 * MiB, S(1));
      alloc.free(a, S(1));
      void *b = alloc.allocate(20 * MiB, S(1));
      void *c = alloc.allocate(10 * MiB, S(1));
      alloc.free(b, S(1));
      alloc.free(c, S(1));
      void *d = alloc.allocate(40 * MiB, S(1));
      bool ok = a && b && c && d;
      alloc.free(d, S(1));
      return ok;
    };
    bool ok = step();
    uint64_t first = alloc.stats().deviceAllocations;
    size_t logged = dev.log.size();
    for (int i = 0; i < 3; ++i)
      ok &= step();
    bool quiet = true;
    for (size_t i = logged; i < dev.log.size(); ++i)
      quiet &= dev.log[i].rfind("alloc", 0) != 0 && dev.log[i] != "sync" &&
               dev.log[i] != "release";
    check(ok && alloc.stats().deviceAllocations == first && quiet,
          "a repeated step runs from the cache after its first iteration");
  }

  {
    FakeBackend dev;
    dev.capacity = 8 * MiB;
    CachingAllocator alloc(dev);
    void *a = alloc.allocate(3 * MiB, S(1)); // 4 MiB, no room for 20
    check(a != nullptr && dev.sizes[a] == 4 * MiB,
          "without room for a 20 MiB segment, one of the request's size");
    alloc.free(a, S(1));                     // cached
    void *b = alloc.allocate(5 * MiB, S(1)); // 6 MiB: needs the cache back
    check(b != nullptr && dev.count("sync") == 1 &&
              alloc.stats().bytesCached == 0,
          "out of memory gives free segments back (after a device sync) and "
          "retries");
    void *c = alloc.allocate(6 * MiB, S(1));
    check(c == nullptr, "a request that cannot fit returns null");
    alloc.free(b, S(1));
    alloc.emptyCache();
    check(dev.live.empty() && dev.eventsLive == 0,
          "emptyCache returns every free segment to the device");
  }

  {
    FakeBackend dev;
    CachingAllocator alloc(dev); // 64 MiB
    void *x = alloc.allocate(20 * MiB, S(1));
    void *y = alloc.allocate(30 * MiB, S(1));
    void *z = alloc.allocate(10 * MiB, S(1)); // no room for 20: 10
    alloc.free(x, S(1));
    alloc.free(y, S(1));
    void *w = alloc.allocate(32 * MiB, S(1)); // no free piece holds it
    check(w != nullptr && dev.live.size() == 3 && dev.count("release") == 1 &&
              dev.live.count(x) == 1,
          "out of memory releases only entirely free segments, largest "
          "first, as many as the request needs");
    alloc.free(w, S(1));
    alloc.free(z, S(1));
  }

  {
    // Every host allocation of a sequence that splits, merges, reuses
    // across streams and runs out of device memory fails in turn, one a
    // run: the call that fails changes nothing, so at the end every piece
    // frees and every segment goes back to the device.
    long runs = 0, failedCalls = 0;
    bool consistent = true, disjoint = true;
    for (long n = 0;; ++n) {
      FakeBackend dev;
      long thrown = 0;
      {
        CachingAllocator alloc(dev);   // 64 MiB
        std::map<char *, size_t> held; // address -> bytes
        std::vector<char *> order;
        auto take = [&](size_t bytes, int stream) {
          void *p = nullptr;
          injecting = true;
          try {
            p = alloc.allocate(bytes, S(stream));
          } catch (const std::bad_alloc &) {
            ++thrown;
          }
          injecting = false;
          if (!p)
            return;
          char *c = at(p);
          auto after = held.lower_bound(c);
          if ((after != held.end() && after->first < c + bytes) ||
              (after != held.begin() &&
               std::prev(after)->first + std::prev(after)->second > c))
            disjoint = false;
          held[c] = bytes;
          order.push_back(c);
        };
        auto give = [&](size_t i, int stream) {
          if (i >= order.size() || !held.count(order[i]))
            return;
          bool known = false;
          injecting = true;
          try {
            known = alloc.free(order[i], S(stream));
          } catch (const std::bad_alloc &) {
            ++thrown;
            injecting = false;
            return; // still held: freed below
          }
          injecting = false;
          consistent &= known;
          held.erase(order[i]);
        };
        failIn = n;
        take(1000, 1);    // 0: a small segment
        take(3000, 1);    // 1: split
        take(3 * MiB, 1); // 2: a large segment, split
        take(5 * MiB, 2); // 3
        give(1, 2);       // a free on stream 2
        give(0, 1);       // merges with it: frees of both streams
        take(1500, 3);    // 4: waits for both, split
        give(2, 1);       // large frees merging
        give(3, 2);
        take(8 * MiB, 1);  // 5: waits for stream 2
        take(40 * MiB, 1); // 6: releases free segments to fit, or none
        give(4, 1);
        take(700, 2); // 7
        give(5, 3);
        give(6, 1);
        give(7, 2);
        failIn = -1;
        for (auto [p, bytes] : std::map<char *, size_t>(held))
          consistent &= alloc.free(p, S(1));
        consistent &= alloc.stats().bytesInUse == 0;
        alloc.emptyCache();
        consistent &= dev.live.empty();
      }
      consistent &= dev.eventsLive == 0 && dev.misusedEvents == 0;
      ++runs;
      failedCalls += thrown;
      if (!thrown)
        break; // the n-th allocation is past the sequence's last
    }
    check(consistent && disjoint && failedCalls > 10,
          "a call failing at any of its host allocations changes nothing: "
          "every piece frees, every segment returns (" +
              std::to_string(runs) + " runs, " + std::to_string(failedCalls) +
              " failed calls)");
  }

  std::printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
