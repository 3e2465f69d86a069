#include "block_cache.h"

#include <cstring>

namespace poolshim {

BlockCache::BlockCache(std::uint64_t limit)
    : limit_(limit), classes_(limit > 0 ? new Class[kClasses] : nullptr) {}

int BlockCache::class_of(std::uint64_t capacity) {
  const int octave = 63 - __builtin_clzll(capacity | 1);
  const int sub = octave >= 2 ? static_cast<int>((capacity >> (octave - 2)) & 3) : 0;
  const int k = octave * kClassesPerOctave + sub;
  return k < kClasses ? k : kClasses - 1;
}

void BlockCache::erase(Class& c, std::uint32_t i) {
  std::memmove(&c.slots[i], &c.slots[i + 1], (c.count - i - 1) * sizeof(CachedBlock));
  --c.count;
}

void BlockCache::note_added(const CachedBlock& b, std::uint64_t now) {
  raise_to(peak_bytes_, now);
  raise_to(newest_ready_at_, b.ready_at);
}

bool BlockCache::take(std::uint64_t bytes, CUstream stream, std::uint64_t completed,
                      CachedBlock* out) {
  if (!classes_) return false;
  const std::uint64_t most = largest_fit(bytes);
  // A fitting block is in the request's own class or the next one up (largest_fit spans less
  // than two classes).
  const int first = class_of(bytes);
  const int last = class_of(most);
  for (int k = first; k <= last; ++k) {
    Class& c = classes_[k];
    c.lock.lock();
    for (std::uint32_t i = c.count; i-- > 0;) {
      const CachedBlock& b = c.slots[i];
      if (b.capacity < bytes || b.capacity > most) continue;
      if (b.ready_at > completed && (stream == nullptr || b.stream != stream)) continue;
      *out = b;
      erase(c, i);
      c.lock.unlock();
      bytes_.fetch_sub(out->capacity, std::memory_order_relaxed);
      return true;
    }
    c.lock.unlock();
  }
  return false;
}

bool BlockCache::put(const CachedBlock& block, std::uint64_t completed, CachedBlock* evicted) {
  if (!classes_) return false;
  // Counted before it is published, so that a take of it never makes the count wrap below 0.
  const std::uint64_t now =
      bytes_.fetch_add(block.capacity, std::memory_order_relaxed) + block.capacity;
  if (now > limit_) {
    bytes_.fetch_sub(block.capacity, std::memory_order_relaxed);
    return false;
  }
  Class& c = classes_[class_of(block.capacity)];
  c.lock.lock();
  evicted->ptr = 0;
  if (c.count == kSlots) {
    // Full: the oldest ready block makes room (it goes back to the pool); if none is ready,
    // the new block is not kept.
    std::uint32_t i = 0;
    while (i < c.count && c.slots[i].ready_at > completed) ++i;
    if (i == c.count) {
      c.lock.unlock();
      bytes_.fetch_sub(block.capacity, std::memory_order_relaxed);
      return false;
    }
    *evicted = c.slots[i];
    erase(c, i);
  }
  c.slots[c.count++] = block;
  c.lock.unlock();
  if (evicted->ptr != 0) bytes_.fetch_sub(evicted->capacity, std::memory_order_relaxed);
  note_added(block, evicted->ptr != 0 ? now - evicted->capacity : now);
  return true;
}

bool BlockCache::take_for_pool(std::uint64_t bytes, std::uint64_t completed, CachedBlock* out) {
  if (!classes_) return false;
  // In class k, takes the ready block that `accept`s and that `better` ranks first.
  const auto take_best = [&](int k, auto&& accept, auto&& better) {
    Class& c = classes_[k];
    c.lock.lock();
    int best = -1;
    for (std::uint32_t i = 0; i < c.count; ++i) {
      const CachedBlock& b = c.slots[i];
      if (b.ready_at > completed || !accept(b)) continue;
      if (best < 0 || better(b, c.slots[best])) best = static_cast<int>(i);
    }
    if (best >= 0) {
      *out = c.slots[best];
      erase(c, static_cast<std::uint32_t>(best));
    }
    c.lock.unlock();
    if (best >= 0) bytes_.fetch_sub(out->capacity, std::memory_order_relaxed);
    return best >= 0;
  };
  const auto smaller = [](const CachedBlock& a, const CachedBlock& b) {
    return a.capacity < b.capacity;
  };
  const auto larger = [](const CachedBlock& a, const CachedBlock& b) {
    return a.capacity > b.capacity;
  };
  // Classes hold ascending size ranges: the first class upward with a ready block large enough
  // holds the smallest such block; failing that, the top class with a ready block the largest.
  for (int k = class_of(bytes); k < kClasses; ++k) {
    if (take_best(
            k, [bytes](const CachedBlock& b) { return b.capacity >= bytes; }, smaller)) {
      return true;
    }
  }
  for (int k = kClasses; k-- > 0;) {
    if (take_best(
            k, [](const CachedBlock&) { return true; }, larger))
      return true;
  }
  return false;
}

bool BlockCache::take_pointer(CUdeviceptr ptr, CachedBlock* out) {
  bool found = false;
  remove_if([&found, ptr](const CachedBlock& b) { return !found && (found = b.ptr == ptr); },
            [out](const CachedBlock& b) { *out = b; });
  return found;
}

void BlockCache::forget_stream(CUstream stream) {
  if (!classes_ || stream == nullptr) return;
  for (int k = 0; k < kClasses; ++k) {
    Class& c = classes_[k];
    c.lock.lock();
    for (std::uint32_t i = 0; i < c.count; ++i) {
      if (c.slots[i].stream == stream) c.slots[i].stream = nullptr;
    }
    c.lock.unlock();
  }
}

void BlockCache::clear() {
  remove_if([](const CachedBlock&) { return true; }, [](const CachedBlock&) {});
}

}  // namespace poolshim
