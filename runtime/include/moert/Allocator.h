//===- Allocator.h - caching, stream-aware device allocator -----*- C++ -*-===//
//
// Device allocations are slow (cuMemAlloc synchronizes the device); a training
// step allocates the same sizes every iteration. The caching allocator keeps
// freed blocks and hands them out again. A block freed on one stream is reused
// on another only after that stream waits for the free (an event), so reuse
// never races with kernels still reading the block.
//
// The allocator is written against a small Backend interface so that it can be
// tested without a GPU.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_ALLOCATOR_H
#define MOERT_ALLOCATOR_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace moert {

/// What the allocator needs from a device.
class Backend {
public:
  virtual ~Backend() = default;
  /// Returns nullptr when the device is out of memory.
  virtual void *allocate(size_t bytes) = 0;
  virtual void release(void *ptr) = 0;
  /// Records an event on `stream` after the work queued so far; returns it.
  virtual void *recordEvent(void *stream) = 0;
  /// Makes `stream` wait for `event`, then lets the event go.
  virtual void waitEvent(void *stream, void *event) = 0;
  virtual void destroyEvent(void *event) = 0;
  /// Waits until the device is idle (before giving cached memory back).
  virtual void synchronize() = 0;
};

struct AllocatorStats {
  size_t bytesInUse = 0;  ///< handed out and not freed
  size_t bytesCached = 0; ///< freed, kept for reuse
  size_t peakBytesInUse = 0;
  uint64_t deviceAllocations = 0; ///< calls that reached the backend
  uint64_t reuses = 0;            ///< allocations served from the cache
};

class CachingAllocator {
public:
  explicit CachingAllocator(Backend &backend) : backend(backend) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator &) = delete;
  CachingAllocator &operator=(const CachingAllocator &) = delete;

  /// The size actually reserved for a request: 512-byte granules below 1 MiB,
  /// 2 MiB granules above.
  static size_t roundSize(size_t bytes);

  /// Returns nullptr only if the device is out of memory even after the cache
  /// was given back.
  void *allocate(size_t bytes, void *stream);
  /// Returns `ptr` to the cache. Unknown pointers are reported (false).
  bool free(void *ptr, void *stream);
  /// Gives every cached block back to the device.
  void emptyCache();
  /// Starts a new high-water mark at the bytes in use now.
  void resetPeak();
  AllocatorStats stats() const;

private:
  struct Block {
    size_t size;
    void *stream;
    void *event; ///< recorded when freed; null while in use
  };
  void *takeCached(size_t size, void *stream);
  void releaseCached(); ///< emptyCache with the mutex held

  Backend &backend;
  mutable std::mutex mutex;
  std::unordered_map<void *, Block> live; ///< handed out
  std::multimap<size_t, void *> cached;   ///< size -> freed block
  std::unordered_map<void *, Block> cachedBlocks;
  AllocatorStats counters;
};

} // namespace moert

#endif
