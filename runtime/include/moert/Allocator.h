//===- Allocator.h - caching, stream-aware device allocator -----*- C++ -*-===//
//
// Device allocations are slow (cuMemAlloc and cuMemFree synchronize the
// device). The caching allocator reserves device memory in segments and
// hands out pieces of them: a request takes the smallest free piece that
// holds it (best fit), splitting off the rest; a freed piece merges with the
// free pieces beside it. A training step allocates the same sizes in the
// same order every iteration, so after the first step it runs without
// device allocations, even when the step's many sizes together would not
// fit the device one cache entry per size.
//
// Small requests (below 1 MiB) are carved from 2 MiB segments, large ones
// from segments of their own size (at least 20 MiB), so small pieces do not
// fragment the large segments. Out of memory, the allocator waits for the
// device and gives back entirely free segments, largest first, until a
// segment of the request's size can be reserved.
//
// A piece freed on one stream is reused on another only after that stream
// waits for the free (an event); pieces that merge keep the latest free of
// each stream, so reuse never races with kernels still reading the memory.
//
// A call that fails (the backend's error, or the host out of memory for
// the allocator's own bookkeeping) loses nothing: the host memory a call
// needs is allocated before it changes any piece, so every piece stays
// handed out or free, and a failed free leaves the piece handed out.
//
// The allocator is written against a small Backend interface so that it can
// be tested without a GPU.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_ALLOCATOR_H
#define MOERT_ALLOCATOR_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

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
  /// Makes `stream` wait for `event` (the event stays valid).
  virtual void waitEvent(void *stream, void *event) = 0;
  virtual void destroyEvent(void *event) = 0;
  /// Waits until the device is idle (before giving cached memory back).
  virtual void synchronize() = 0;
};

struct AllocatorStats {
  size_t bytesInUse = 0;  ///< handed out and not freed
  size_t bytesCached = 0; ///< reserved from the device and free
  size_t peakBytesInUse = 0;
  size_t peakBytesReserved = 0;   ///< high-water mark of the segments' bytes
  size_t largestFree = 0;         ///< the largest free piece of a segment
  uint64_t deviceAllocations = 0; ///< segments reserved from the device
  uint64_t reuses = 0;            ///< allocations served from the cache
};

class CachingAllocator {
public:
  explicit CachingAllocator(Backend &backend) : backend(backend) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator &) = delete;
  CachingAllocator &operator=(const CachingAllocator &) = delete;

  /// Requests below 1 MiB are small: carved from 2 MiB segments.
  static bool isSmall(size_t bytes);
  /// The size actually reserved for a request: 512-byte granules below 1 MiB,
  /// 2 MiB granules above.
  static size_t roundSize(size_t bytes);
  /// The size of the segment reserved from the device when no free piece
  /// holds a request of `size` (a roundSize result).
  static size_t segmentSize(size_t size);

  /// Returns nullptr only if the device is out of memory even after the
  /// cache's free segments were given back.
  void *allocate(size_t bytes, void *stream);
  /// Returns `ptr` to the cache. Unknown pointers are reported (false).
  bool free(void *ptr, void *stream);
  /// Gives every entirely free segment back to the device.
  void emptyCache();
  /// Starts new high-water marks at the bytes in use and reserved now.
  void resetPeak();
  AllocatorStats stats() const;

private:
  /// The latest free of a piece on one stream.
  struct Pending {
    void *stream;
    uint64_t order; ///< when it was recorded (later frees supersede)
    std::shared_ptr<void> event;
  };
  /// A piece of a segment; pieces of a segment are linked by address.
  struct Piece {
    Piece(uintptr_t address, size_t size, bool small)
        : address(address), size(size), small(small) {}
    uintptr_t address;
    size_t size;
    bool small; ///< in a small-request segment
    bool free = false;
    Piece *prev = nullptr, *next = nullptr;
    std::vector<Pending> pending; ///< while free
  };
  struct BySize {
    bool operator()(const Piece *a, const Piece *b) const {
      return a->size != b->size ? a->size < b->size : a->address < b->address;
    }
  };
  using FreeSet = std::set<Piece *, BySize>;
  /// The pieces handed out, by address. (Node-based, as FreeSet: a node
  /// made ahead of a change goes in without allocating.)
  using LiveMap = std::map<uintptr_t, Piece *>;

  FreeSet &pool(bool small) { return small ? freeSmall : freeLarge; }
  /// A free set's node holding `piece`, in no set (may throw bad_alloc).
  static FreeSet::node_type freeNode(Piece *piece);
  /// The free node of the smallest free piece that holds `size` (taken out
  /// of its set), or an empty node.
  FreeSet::node_type takeFree(size_t size, bool small);
  Piece *reserveSegment(size_t size, bool small);
  void markFree(Piece *piece);
  void mergePending(Piece *into, Piece *from);
  /// Merges `right`, the free piece after `left`, into it (neither in a
  /// free set).
  void absorb(Piece *left, Piece *right);
  void waitPending(Piece *piece, void *stream);
  /// The entirely free segments, largest first, after a device sync (none:
  /// no sync). The mutex is held in these three.
  std::vector<Piece *> freeSegments();
  void release(Piece *segment);
  /// Gives free segments back, largest first, until `size` can be reserved.
  Piece *reserveReleasing(size_t size, bool small);

  Backend &backend;
  mutable std::mutex mutex;
  LiveMap live;
  FreeSet freeSmall, freeLarge;
  uint64_t frees = 0;
  size_t reserved = 0; ///< segments' bytes
  AllocatorStats counters;
};

} // namespace moert

#endif
