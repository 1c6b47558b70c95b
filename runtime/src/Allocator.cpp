//===- Allocator.cpp - caching, stream-aware device allocator -------------===//

#include "moert/Allocator.h"

#include <algorithm>

using namespace moert;

namespace {
constexpr size_t smallLimit = size_t(1) << 20; ///< below: small requests
constexpr size_t smallSegment = size_t(2) << 20;
constexpr size_t largeSegment = size_t(20) << 20; ///< the least large one
} // namespace

CachingAllocator::~CachingAllocator() {
  emptyCache();
  // Segments still in use stay reserved (their owners outlive us); only the
  // bookkeeping goes.
  for (FreeSet *set : {&freeSmall, &freeLarge})
    for (Piece *piece : *set)
      delete piece;
  for (auto &entry : live)
    delete entry.second;
}

bool CachingAllocator::isSmall(size_t bytes) { return bytes < smallLimit; }

size_t CachingAllocator::roundSize(size_t bytes) {
  constexpr size_t small = 512, large = size_t(2) << 20;
  if (bytes == 0)
    bytes = 1;
  size_t granule = isSmall(bytes) ? small : large;
  return (bytes + granule - 1) / granule * granule;
}

size_t CachingAllocator::segmentSize(size_t size) {
  if (size <= smallLimit)
    return smallSegment;
  return std::max(size, largeSegment);
}

CachingAllocator::FreeSet::node_type CachingAllocator::freeNode(Piece *piece) {
  FreeSet one;
  one.insert(piece);
  return one.extract(one.begin());
}

CachingAllocator::FreeSet::node_type CachingAllocator::takeFree(size_t size,
                                                                bool small) {
  FreeSet &set = pool(small);
  Piece probe{0, size, small};
  auto it = set.lower_bound(&probe); // the smallest free piece that fits
  if (it == set.end())
    return {};
  return set.extract(it);
}

CachingAllocator::Piece *CachingAllocator::reserveSegment(size_t size,
                                                          bool small) {
  auto piece = std::make_unique<Piece>(0, size, small);
  void *ptr = backend.allocate(size);
  if (!ptr)
    return nullptr;
  piece->address = reinterpret_cast<uintptr_t>(ptr);
  ++counters.deviceAllocations;
  reserved += size;
  counters.peakBytesReserved = std::max(counters.peakBytesReserved, reserved);
  return piece.release();
}

void CachingAllocator::waitPending(Piece *piece, void *stream) {
  // Work on the piece's own stream is ordered after its free already.
  for (Pending &p : piece->pending)
    if (p.stream != stream)
      backend.waitEvent(stream, p.event.get());
  piece->pending.clear(); // events no other free piece holds are destroyed
}

void CachingAllocator::mergePending(Piece *into, Piece *from) {
  for (Pending &p : from->pending) {
    auto same =
        std::find_if(into->pending.begin(), into->pending.end(),
                     [&](const Pending &q) { return q.stream == p.stream; });
    if (same == into->pending.end())
      into->pending.push_back(std::move(p));
    else if (p.order > same->order)
      *same = std::move(p);
  }
  from->pending.clear();
}

void CachingAllocator::absorb(Piece *left, Piece *right) {
  mergePending(left, right);
  left->size += right->size;
  left->next = right->next;
  if (right->next)
    right->next->prev = left;
  delete right;
}

void *CachingAllocator::allocate(size_t bytes, void *stream) {
  std::lock_guard<std::mutex> lock(mutex);
  size_t size = roundSize(bytes);
  bool small = isSmall(bytes);
  // The host memory the call may need, before anything changes: the
  // piece's entry among the live ones, and a split's rest and its node.
  LiveMap::node_type entry;
  {
    LiveMap one;
    one.emplace(0, nullptr);
    entry = one.extract(one.begin());
  }
  auto rest = std::make_unique<Piece>(0, 0, small);
  FreeSet::node_type restNode = freeNode(rest.get());
  FreeSet::node_type taken = takeFree(size, small);
  Piece *piece = taken ? taken.value() : nullptr;
  bool reused = piece != nullptr;
  if (!piece) {
    size_t segment = segmentSize(size);
    piece = reserveSegment(segment, small);
    if (!piece && segment != size)
      piece = reserveSegment(size, small);
    if (!piece)
      piece = reserveReleasing(size, small);
    if (!piece)
      return nullptr;
    // (A new segment has no frees to wait for: nothing below throws.)
  }
  std::vector<Pending> frees; // the rest's, when the piece is split
  try {
    if (piece->size > size)
      frees = piece->pending;
    waitPending(piece, stream);
  } catch (...) {
    pool(small).insert(std::move(taken)); // still free, as it was
    throw;
  }
  if (piece->size > size) {
    // Split: the rest stays free, behind the same frees (another stream
    // taking it waits for them too).
    *rest = Piece{piece->address + size, piece->size - size, small};
    rest->free = true;
    rest->pending = std::move(frees);
    rest->prev = piece;
    rest->next = piece->next;
    if (piece->next)
      piece->next->prev = rest.get();
    piece->next = rest.get();
    piece->size = size;
    pool(small).insert(std::move(restNode));
    rest.release();
  }
  piece->free = false;
  entry.key() = piece->address;
  entry.mapped() = piece;
  live.insert(std::move(entry));
  counters.reuses += reused;
  counters.bytesInUse += piece->size;
  counters.peakBytesInUse =
      std::max(counters.peakBytesInUse, counters.bytesInUse);
  return reinterpret_cast<void *>(piece->address);
}

bool CachingAllocator::free(void *ptr, void *stream) {
  if (!ptr)
    return true;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = live.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live.end())
    return false;
  Piece *piece = it->second;
  // What may throw, before anything changes: the event (the shared
  // pointer destroys it if its own allocation fails), room for it among the
  // frees of the piece it merges into, the merged piece's node.
  std::shared_ptr<void> event(backend.recordEvent(stream), [this](void *e) {
    try {
      backend.destroyEvent(e);
    } catch (...) {
      // A lost event handle is not worth ending a step over.
    }
  });
  Piece *prev = piece->prev && piece->prev->free ? piece->prev : nullptr;
  Piece *next = piece->next && piece->next->free ? piece->next : nullptr;
  piece->pending.reserve(piece->pending.size() + 1);
  Piece *merged = prev ? prev : piece;
  merged->pending.reserve((prev ? prev->pending.size() : 0) +
                          piece->pending.size() + 1 +
                          (next ? next->pending.size() : 0));
  FreeSet::node_type node = freeNode(merged);
  live.erase(it);
  counters.bytesInUse -= piece->size;
  piece->pending.push_back(Pending{stream, ++frees, std::move(event)});
  piece->free = true;
  FreeSet &set = pool(piece->small);
  if (prev) {
    set.erase(prev);
    absorb(prev, piece);
    piece = prev;
  }
  if (next) {
    set.erase(next);
    absorb(piece, next);
  }
  set.insert(std::move(node));
  return true;
}

std::vector<CachingAllocator::Piece *> CachingAllocator::freeSegments() {
  std::vector<Piece *> segments;
  for (FreeSet *set : {&freeLarge, &freeSmall})
    for (Piece *piece : *set)
      if (!piece->prev && !piece->next)
        segments.push_back(piece);
  std::stable_sort(segments.begin(), segments.end(),
                   [](Piece *a, Piece *b) { return a->size > b->size; });
  if (!segments.empty())
    backend.synchronize(); // kernels queued before the frees may still read
  return segments;
}

void CachingAllocator::release(Piece *segment) {
  backend.release(reinterpret_cast<void *>(segment->address));
  pool(segment->small).erase(segment);
  reserved -= segment->size;
  delete segment; // its events (done: freeSegments synchronized) go too
}

CachingAllocator::Piece *CachingAllocator::reserveReleasing(size_t size,
                                                            bool small) {
  for (Piece *segment : freeSegments()) {
    release(segment);
    if (Piece *piece = reserveSegment(size, small))
      return piece;
  }
  return nullptr;
}

void CachingAllocator::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex);
  counters.peakBytesInUse = counters.bytesInUse;
  counters.peakBytesReserved = reserved;
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex);
  for (Piece *segment : freeSegments())
    release(segment);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex);
  AllocatorStats s = counters;
  s.bytesCached = reserved - counters.bytesInUse;
  for (const FreeSet *set : {&freeSmall, &freeLarge})
    if (!set->empty())
      s.largestFree = std::max(s.largestFree, (*set->rbegin())->size);
  return s;
}
