#include "call_sites.h"

#include <execinfo.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace poolshim {

namespace {

std::uint64_t hash_frames(const std::uintptr_t* frames, int depth) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<std::uint64_t>(depth);
  for (int i = 0; i < depth; ++i) {
    h ^= static_cast<std::uint64_t>(frames[i]);
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h == 0 ? 1 : h;  // 0 marks a free slot
}

constexpr int kMaxProbes = 64;

}  // namespace

CallSiteTable::CallSiteTable(std::size_t capacity) : capacity_(capacity) {
  void* p = mmap(nullptr, capacity_ * sizeof(Slot), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    capacity_ = 0;  // every site becomes "unknown": reports lose call sites, nothing else
    return;
  }
  slots_ = static_cast<Slot*>(p);  // zero pages: every slot free
}

CallSiteTable::~CallSiteTable() {
  if (slots_ != nullptr) munmap(slots_, capacity_ * sizeof(Slot));
}

std::uint32_t CallSiteTable::intern(const std::uintptr_t* frames, int depth) {
  if (depth <= 0 || capacity_ == 0) return 0;
  if (depth > kMaxCallSiteFrames) depth = kMaxCallSiteFrames;
  const std::uint64_t h = hash_frames(frames, depth);
  const std::size_t mask = capacity_ - 1;
  for (int probe = 0; probe < kMaxProbes; ++probe) {
    const std::size_t i = (h + static_cast<std::uint64_t>(probe)) & mask;
    Slot& s = slots_[i];
    std::uint64_t seen = s.hash.load(std::memory_order_acquire);
    if (seen == 0) {
      if (s.hash.compare_exchange_strong(seen, h, std::memory_order_acq_rel)) {
        s.depth = depth;
        std::memcpy(s.frames, frames, sizeof(std::uintptr_t) * static_cast<std::size_t>(depth));
        s.ready.store(true, std::memory_order_release);
        return static_cast<std::uint32_t>(i + 1);
      }
      // Another thread claimed it: `seen` now holds its hash; look at it below.
    }
    if (seen == h) {
      // The same hash: wait (briefly) for the claimer to publish, then compare the frames.
      while (!s.ready.load(std::memory_order_acquire)) {
      }
      if (s.depth == depth &&
          std::memcmp(s.frames, frames, sizeof(std::uintptr_t) * static_cast<std::size_t>(depth)) ==
              0) {
        return static_cast<std::uint32_t>(i + 1);
      }
    }
  }
  overflowed_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

std::vector<std::uintptr_t> CallSiteTable::frames(std::uint32_t id) const {
  if (id == 0 || id > capacity_) return {};
  const Slot& s = slots_[id - 1];
  if (!s.ready.load(std::memory_order_acquire)) return {};
  return std::vector<std::uintptr_t>(s.frames, s.frames + s.depth);
}

int capture_frames(std::uintptr_t* out, int max_frames, std::uintptr_t skip_begin,
                   std::uintptr_t skip_end) {
  void* raw[kMaxCallSiteFrames + 16];
  const int wanted =
      max_frames + 16 < kMaxCallSiteFrames + 16 ? max_frames + 16 : kMaxCallSiteFrames + 16;
  const int got = backtrace(raw, wanted);
  int first = 0;
  // Frame 0 is capture_frames itself; then the shim's frames up to the application's call.
  while (first < got) {
    const auto a = reinterpret_cast<std::uintptr_t>(raw[first]);
    const bool own = (a >= skip_begin && a < skip_end) || first == 0;
    if (!own) break;
    ++first;
  }
  int n = 0;
  for (int i = first; i < got && n < max_frames; ++i)
    out[n++] = reinterpret_cast<std::uintptr_t>(raw[i]);
  return n;
}

void warm_up_unwinder() {
  void* frames[4];
  backtrace(frames, 4);
}

}  // namespace poolshim
