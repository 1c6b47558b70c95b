//===- Allocator.cpp - caching, stream-aware device allocator -------------===//

#include "moert/Allocator.h"

#include <algorithm>

using namespace moert;

CachingAllocator::~CachingAllocator() { emptyCache(); }

size_t CachingAllocator::roundSize(size_t bytes) {
  constexpr size_t small = 512, large = size_t(2) << 20,
                   limit = size_t(1) << 20;
  if (bytes == 0)
    bytes = 1;
  size_t granule = bytes < limit ? small : large;
  return (bytes + granule - 1) / granule * granule;
}

void *CachingAllocator::takeCached(size_t size, void *stream) {
  auto range = cached.equal_range(size);
  // Prefer a block freed on the same stream: stream order makes it safe.
  auto pick = std::find_if(range.first, range.second, [&](auto &entry) {
    return cachedBlocks.at(entry.second).stream == stream;
  });
  if (pick == range.second)
    pick = range.first;
  if (pick == range.second)
    return nullptr;
  void *ptr = pick->second;
  cached.erase(pick);
  Block block = cachedBlocks.at(ptr);
  cachedBlocks.erase(ptr);
  if (block.event) {
    if (block.stream != stream)
      backend.waitEvent(stream, block.event);
    else
      backend.destroyEvent(block.event);
  }
  counters.bytesCached -= size;
  return ptr;
}

void *CachingAllocator::allocate(size_t bytes, void *stream) {
  std::lock_guard<std::mutex> lock(mutex);
  size_t size = roundSize(bytes);
  void *ptr = takeCached(size, stream);
  if (ptr) {
    ++counters.reuses;
  } else {
    ptr = backend.allocate(size);
    if (!ptr && !cached.empty()) {
      // Out of memory: give the cache back and try once more.
      releaseCached();
      ptr = backend.allocate(size);
    }
    if (!ptr)
      return nullptr;
    ++counters.deviceAllocations;
  }
  live[ptr] = Block{size, stream, nullptr};
  counters.bytesInUse += size;
  counters.peakBytesInUse =
      std::max(counters.peakBytesInUse, counters.bytesInUse);
  return ptr;
}

bool CachingAllocator::free(void *ptr, void *stream) {
  if (!ptr)
    return true;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = live.find(ptr);
  if (it == live.end())
    return false;
  Block block = it->second;
  live.erase(it);
  block.stream = stream;
  block.event = backend.recordEvent(stream);
  counters.bytesInUse -= block.size;
  counters.bytesCached += block.size;
  cached.emplace(block.size, ptr);
  cachedBlocks[ptr] = block;
  return true;
}

void CachingAllocator::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex);
  counters.peakBytesInUse = counters.bytesInUse;
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex);
  releaseCached();
}

void CachingAllocator::releaseCached() {
  if (cached.empty())
    return;
  backend.synchronize();
  for (auto &[ptr, block] : cachedBlocks) {
    if (block.event)
      backend.destroyEvent(block.event);
    backend.release(ptr);
  }
  cached.clear();
  cachedBlocks.clear();
  counters.bytesCached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex);
  return counters;
}
