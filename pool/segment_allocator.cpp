#include "segment_allocator.h"

#include "atomic_max.h"
#include "page_map.h"
#include "shared_slack.h"

#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <new>

namespace poolshim {

namespace {

// Bins: sizes in granules u; u < 16 one bin each, then eight per power of two (TLSF's second
// level of 3 bits). 2^48 bytes (u = 2^39) lands in bin 303.
constexpr int kExactBins = 16;
constexpr int kSubBins = 8;
constexpr int kBins = kExactBins + (39 - 4 + 1) * kSubBins;
constexpr int kWords = (kBins + 63) / 64;

int bin_of(std::uint64_t size) {
  const std::uint64_t u = size / SegmentAllocator::kGranule;
  if (u < kExactBins) return static_cast<int>(u);
  const int fl = 63 - __builtin_clzll(u);
  const int sl = static_cast<int>((u >> (fl - 3)) & (kSubBins - 1));
  return std::min(kExactBins + (fl - 4) * kSubBins + sl, kBins - 1);
}

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

struct SegmentAllocator::Node {
  CUdeviceptr ptr = 0;
  std::uint64_t size = 0;
  Node* prev_addr = nullptr;  // neighbours in the segment, by address
  Node* next_addr = nullptr;
  Node* prev_free = nullptr;  // the bin's list (free nodes); next_free also links spare nodes
  Node* next_free = nullptr;
  Segment* segment = nullptr;
  std::uintptr_t affinity = 0;
  std::uint64_t ready_at = 0;
  int bin = -1;
  bool free = false;
};

struct SegmentAllocator::Segment {
  CUdeviceptr base = 0;
  std::uint64_t size = 0;
  Node* first = nullptr;
  Segment* prev = nullptr;
  Segment* next = nullptr;
  Arena* arena = nullptr;
  bool paged = false;  // the page map's range: not held from the source, never given back

  bool wholly_free() const { return first->free && first->size == size; }
};

struct SegmentAllocator::Arena {
  Node* bins[kBins] = {};
  std::uint64_t bitmap[kWords] = {};
  Segment* segments = nullptr;
  std::uint64_t split_min = 0;  // smallest remainder split off a block
};

// Descriptors, from mmap'd chunks, recycled through free lists (never given back before the
// allocator goes): no malloc, and no allocation at all once the chunks cover the peak.
struct SegmentAllocator::Slabs {
  static constexpr std::size_t kChunk = 64 * 1024;
  struct Chunk {
    Chunk* next;
  };
  Chunk* chunks = nullptr;
  Node* spare_nodes = nullptr;
  Segment* spare_segments = nullptr;

  ~Slabs() {
    while (chunks != nullptr) {
      Chunk* next = chunks->next;
      munmap(chunks, kChunk);
      chunks = next;
    }
  }
  // Carves a new chunk into objects of T, linked through `link`; false when mmap fails.
  template <typename T, typename Link>
  bool grow(T*& spare, Link link) {
    void* p = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    auto* chunk = static_cast<Chunk*>(p);
    chunk->next = chunks;
    chunks = chunk;
    auto* first = reinterpret_cast<unsigned char*>(p) + sizeof(Chunk);
    const std::size_t stride = (sizeof(T) + alignof(T) - 1) / alignof(T) * alignof(T);
    const std::size_t count = (kChunk - sizeof(Chunk)) / stride;
    for (std::size_t i = 0; i < count; ++i) {
      T* t = new (first + i * stride) T();
      link(t) = spare;
      spare = t;
    }
    return true;
  }
  // A spare object of T, reset (nullptr when mmap fails), and back to the spares.
  template <typename T, typename Link>
  T* take(T*& spare, Link link) {
    if (spare == nullptr && !grow(spare, link)) return nullptr;
    T* t = spare;
    spare = link(t);
    *t = T();
    return t;
  }
  template <typename T, typename Link>
  void give(T*& spare, T* t, Link link) {
    link(t) = spare;
    spare = t;
  }
  static Node*& node_link(Node* n) { return n->next_free; }
  static Segment*& segment_link(Segment* s) { return s->next; }
  Node* node() { return take(spare_nodes, node_link); }
  void put(Node* n) { give(spare_nodes, n, node_link); }
  Segment* segment() { return take(spare_segments, segment_link); }
  void put(Segment* s) { give(spare_segments, s, segment_link); }
};

SegmentAllocator::SegmentAllocator(SegmentSource& source, PageMap* pages, std::uint64_t slack)
    : source_(source),
      pages_(pages),
      slack_(slack),
      small_(new Arena()),
      large_(new Arena()),
      slabs_(new Slabs()) {
  small_->split_min = kGranule;
  large_->split_min = kLargeSplitMin;
}

SegmentAllocator::~SegmentAllocator() {
  delete slabs_;
  delete large_;
  delete small_;
}

std::uint64_t SegmentAllocator::rounded(std::uint64_t bytes) {
  return round_up(std::max<std::uint64_t>(bytes, 1), kGranule);
}

std::uint64_t SegmentAllocator::segment_for(std::uint64_t bytes) {
  const std::uint64_t size = rounded(bytes);
  if (size <= kSmallRequest) return kSmallSegment;
  if (size <= kOwnSegment) return kLargeSegment;
  return round_up(size, kSegmentRounding);
}

SegmentAllocator::Arena& SegmentAllocator::arena_for(std::uint64_t size) {
  return size <= kSmallRequest ? *small_ : *large_;
}

void SegmentAllocator::insert_free(Arena& arena, Node* node) {
  const int b = bin_of(node->size);
  node->bin = b;
  node->free = true;
  node->prev_free = nullptr;
  node->next_free = arena.bins[b];
  if (node->next_free != nullptr) node->next_free->prev_free = node;
  arena.bins[b] = node;
  arena.bitmap[b / 64] |= 1ULL << (b % 64);
  ++stats_.free_blocks;
}

void SegmentAllocator::remove_free(Arena& arena, Node* node) {
  const int b = node->bin;
  if (node->prev_free != nullptr) {
    node->prev_free->next_free = node->next_free;
  } else {
    arena.bins[b] = node->next_free;
  }
  if (node->next_free != nullptr) node->next_free->prev_free = node->prev_free;
  if (arena.bins[b] == nullptr) arena.bitmap[b / 64] &= ~(1ULL << (b % 64));
  node->prev_free = node->next_free = nullptr;
  node->free = false;
  --stats_.free_blocks;
}

SegmentAllocator::Node* SegmentAllocator::search(Arena& arena, std::uint64_t size,
                                                 std::uintptr_t affinity, std::uint64_t completed,
                                                 bool mapped_only) {
  auto usable = [&](const Node* n) {
    // The fence and token test first: it is two compares, the page map's a walk of its pages.
    if (!((affinity != 0 && n->affinity == affinity) || n->ready_at <= completed)) return false;
    return !mapped_only || !n->segment->paged || pages_->mapped(n->ptr, size);
  };
  int budget = kSearchBudget;
  // The request's own bin holds blocks on both sides of it: the smallest that fits.
  const int first = bin_of(size);
  Node* best = nullptr;
  for (Node* n = arena.bins[first]; n != nullptr && budget > 0; n = n->next_free, --budget) {
    if (n->size >= size && usable(n) && (best == nullptr || n->size < best->size)) best = n;
  }
  if (best != nullptr) return best;
  // Every block of a later bin fits: the first usable one (within an eighth of the best).
  for (int b = first + 1; b < kBins && budget > 0;) {
    const int word = b / 64;
    const std::uint64_t bits = arena.bitmap[word] & (~0ULL << (b % 64));
    if (bits == 0) {
      b = (word + 1) * 64;
      continue;
    }
    b = word * 64 + __builtin_ctzll(bits);
    for (Node* n = arena.bins[b]; n != nullptr && budget > 0; n = n->next_free, --budget) {
      if (usable(n)) return n;
    }
    ++b;
  }
  return nullptr;
}

SegmentAllocator::Node* SegmentAllocator::carve(Arena& arena, Node* node, std::uint64_t size) {
  remove_free(arena, node);
  const std::uint64_t rest = node->size - size;
  if (rest >= arena.split_min) {
    if (Node* tail = slabs_->node()) {
      tail->ptr = node->ptr + size;
      tail->size = rest;
      tail->segment = node->segment;
      tail->affinity = node->affinity;
      tail->ready_at = node->ready_at;
      tail->prev_addr = node;
      tail->next_addr = node->next_addr;
      if (tail->next_addr != nullptr) tail->next_addr->prev_addr = tail;
      node->next_addr = tail;
      node->size = size;
      insert_free(arena, tail);
      ++stats_.splits;
    }
  }
  note_allocated(node->size);
  return node;
}

void SegmentAllocator::note_allocated(std::uint64_t size) {
  stats_.allocated += size;
  stats_.allocated_peak = std::max(stats_.allocated_peak, stats_.allocated);
}

std::uint64_t SegmentAllocator::reserved_now() const {
  return stats_.reserved + (pages_ != nullptr ? pages_->held_bytes() : 0);
}

void SegmentAllocator::publish() {
  const std::uint64_t reserved = reserved_now();
  stats_.reserved_peak = std::max(stats_.reserved_peak, reserved);
  // Pages may be mapped under carved blocks a moment before the lock sees them handed out.
  const std::uint64_t free = reserved > stats_.allocated ? reserved - stats_.allocated : 0;
  stats_.free_peak = std::max(stats_.free_peak, free);
  free_bytes_.store(free, std::memory_order_relaxed);
  free_peak_.store(stats_.free_peak, std::memory_order_relaxed);
  allocated_.store(stats_.allocated, std::memory_order_relaxed);
}

SegmentAllocator::Node* SegmentAllocator::add_segment(Arena& arena, CUdeviceptr base,
                                                      std::uint64_t bytes, std::uintptr_t affinity,
                                                      bool paged) {
  Segment* seg = slabs_->segment();
  Node* node = seg != nullptr ? slabs_->node() : nullptr;
  if (node == nullptr) {
    // No descriptor (mmap failed): the segment cannot be tracked, give it back.
    if (seg != nullptr) slabs_->put(seg);
    if (!paged) source_.release(base, bytes);
    return nullptr;
  }
  seg->paged = paged;
  seg->base = base;
  seg->size = bytes;
  seg->first = node;
  seg->arena = &arena;
  seg->next = arena.segments;
  if (seg->next != nullptr) seg->next->prev = seg;
  arena.segments = seg;
  node->ptr = base;
  node->size = bytes;
  node->segment = seg;
  node->affinity = affinity;  // ready for every stream, and its maker's (see free)
  insert_free(arena, node);
  ++stats_.segments;
  if (paged) return node;  // addresses only: its pages count as they are mapped
  stats_.reserved += bytes;
  ++stats_.segments_reserved;
  return node;
}

bool SegmentAllocator::allocate_from_free(std::uint64_t bytes, std::uintptr_t affinity,
                                          std::uint64_t completed, Block* out) {
  const std::uint64_t size = rounded(bytes);
  Arena& arena = arena_for(size);
  std::lock_guard<SpinLock> guard(lock_);
  // In the page map's range, only a block whose pages under the request are all mapped serves
  // here, even where one that fits better is not: mapping pages for the better fit would take
  // memory from other free blocks (once their fences complete) or the device. The rest is for
  // allocate_paged(), which takes the best fit and maps what is missing.
  Node* node = search(arena, size, affinity, completed, pages_ != nullptr);
  if (node == nullptr) return false;
  const std::uint64_t ready_at = node->ready_at;
  node = carve(arena, node, size);
  if (node->segment->paged) paged_allocated_.fetch_add(node->size, std::memory_order_relaxed);
  publish();
  *out = Block{node->ptr, node->size, node, ready_at};
  return true;
}

int SegmentAllocator::allocate_paged(std::uint64_t size, std::uintptr_t affinity,
                                     std::uint64_t completed, Block* out, CUresult* why) {
  if (pages_->reserve() != CUDA_SUCCESS) return -1;
  Node* node = nullptr;
  std::uint64_t ready_at = 0;
  std::uintptr_t was_affinity = 0;
  {
    std::lock_guard<SpinLock> guard(lock_);
    if (paged_ == nullptr) {
      Node* whole = add_segment(*large_, pages_->base(), pages_->span(), 0, true);
      if (whole == nullptr) return -1;
      paged_ = whole->segment;
    }
    node = search(*large_, size, affinity, completed);
    if (node == nullptr) return -1;
    ready_at = node->ready_at;
    was_affinity = node->affinity;
    node = carve(*large_, node, size);
    if (node->segment->paged) paged_allocated_.fetch_add(node->size, std::memory_order_relaxed);
    publish();
  }
  if (node->segment->paged) {
    const CUresult r = back(node, completed);
    if (r != CUDA_SUCCESS) {
      // Back to the free list as it was (its mapped pages stay, for the next request).
      free(Block{node->ptr, node->size, node, ready_at}, was_affinity, ready_at, completed);
      if (why != nullptr) *why = r;
      // Out of memory for whole pages (a cap below a page, say), a segment of the request's
      // own size from the source may still fit.
      return r == CUDA_ERROR_OUT_OF_MEMORY ? -1 : 0;
    }
    std::lock_guard<SpinLock> guard(lock_);
    publish();
  }
  *out = Block{node->ptr, node->size, node, ready_at};
  return 1;
}

std::uint64_t SegmentAllocator::paged_excess() const {
  if (pages_ == nullptr) return 0;
  const std::uint64_t mapped = pages_->mapped_bytes();
  const std::uint64_t used = paged_allocated_.load(std::memory_order_relaxed);
  return mapped > used ? mapped - used : 0;
}

CUresult SegmentAllocator::back(const Node* node, std::uint64_t completed) {
  std::lock_guard<std::mutex> guard(pages_->mutex());
  const std::uint64_t missing = pages_->unmapped_bytes(node->ptr, node->size);
  if (missing == 0) return CUDA_SUCCESS;
  // Free pages elsewhere in the range serve first, beyond the slack: memory follows the
  // blocks in use instead of growing with the range's fragmentation.
  const std::uint64_t mapped = pages_->mapped_bytes();
  const std::uint64_t slack = share_ != nullptr ? share_->allowance(share_member_) : slack_;
  const std::uint64_t budget = paged_allocated_.load(std::memory_order_relaxed) + slack;
  if (mapped + missing > budget) harvest(std::min(missing, mapped + missing - budget), completed);
  // Out of memory, the caller's retry (trim(0) after a synchronization) frees every free page.
  const CUresult r = pages_->commit(node->ptr, node->size);
  pages_->drop_spare();
  return r;
}

std::uint64_t SegmentAllocator::harvest(std::uint64_t want, std::uint64_t completed) {
  std::uint64_t got = 0;
  {
    std::lock_guard<SpinLock> guard(lock_);
    if (paged_ == nullptr) return 0;
    Node* last = paged_->first;
    while (last->next_addr != nullptr) last = last->next_addr;
    for (Node* n = last; n != nullptr && got < want; n = n->prev_addr) {
      if (n->free && n->ready_at <= completed) got += pages_->claim(n->ptr, n->size, want - got);
    }
  }
  pages_->unmap_claimed();
  return got;
}

bool SegmentAllocator::allocate(std::uint64_t bytes, std::uintptr_t affinity,
                                std::uint64_t completed, Block* out, CUresult* why) {
  if (allocate_from_free(bytes, affinity, completed, out)) return true;
  const std::uint64_t size = rounded(bytes);
  if (pages_ != nullptr && size > kSmallRequest) {
    const int paged = allocate_paged(size, affinity, completed, out, why);
    if (paged >= 0) return paged == 1;
  }
  std::uint64_t segment = segment_for(size);
  CUdeviceptr base = 0;
  CUresult r = CUDA_SUCCESS;
  bool reserved = source_.reserve(segment, &base, &r);  // outside the lock: a driver call
  // Near the device's end (or a cap) a shared segment may not fit where the request alone
  // does: a segment of the request's own size then serves it.
  const std::uint64_t own = round_up(size, kSegmentRounding);
  if (!reserved && r == CUDA_ERROR_OUT_OF_MEMORY && own < segment) {
    segment = own;
    reserved = source_.reserve(segment, &base, &r);
  }
  if (!reserved) {
    if (why != nullptr) *why = r;
    return false;
  }
  Arena& arena = arena_for(size);
  std::lock_guard<SpinLock> guard(lock_);
  Node* node = add_segment(arena, base, segment, affinity);
  if (node == nullptr) {  // no descriptor for it
    if (why != nullptr) *why = CUDA_ERROR_OUT_OF_MEMORY;
    return false;
  }
  node = carve(arena, node, size);
  publish();
  *out = Block{node->ptr, node->size, node, 0};
  return true;
}

bool SegmentAllocator::mergeable(const Node* a, const Node* b, std::uint64_t completed) {
  return a->affinity == b->affinity || (a->ready_at <= completed && b->ready_at <= completed);
}

void SegmentAllocator::absorb(Node* into, Node* gone) {
  // Same token: the merged block serves that stream at once, every stream after both fences.
  // Both ready: it serves every stream; it keeps a token only when both had it.
  if (into->affinity != gone->affinity) into->affinity = 0;
  into->ready_at = std::max(into->ready_at, gone->ready_at);
  into->size += gone->size;
  into->next_addr = gone->next_addr;
  if (into->next_addr != nullptr) into->next_addr->prev_addr = into;
  slabs_->put(gone);
  ++stats_.merges;
}

void SegmentAllocator::merge_neighbours(Arena& arena, Node*& node, std::uint64_t completed) {
  if (Node* next = node->next_addr;
      next != nullptr && next->free && mergeable(node, next, completed)) {
    remove_free(arena, next);
    absorb(node, next);
  }
  if (Node* prev = node->prev_addr;
      prev != nullptr && prev->free && mergeable(prev, node, completed)) {
    remove_free(arena, prev);
    absorb(prev, node);
    node = prev;
  }
}

void SegmentAllocator::free(const Block& block, std::uintptr_t affinity, std::uint64_t ready_at,
                            std::uint64_t completed) {
  auto* node = static_cast<Node*>(block.node);
  std::lock_guard<SpinLock> guard(lock_);
  Arena& arena = *node->segment->arena;
  stats_.allocated -= node->size;
  if (node->segment->paged) paged_allocated_.fetch_sub(node->size, std::memory_order_relaxed);
  node->affinity = affinity;
  node->ready_at = ready_at;
  raise_to(newest_ready_at_, ready_at, std::memory_order_relaxed);
  merge_neighbours(arena, node, completed);
  insert_free(arena, node);
  publish();
}

std::uint64_t SegmentAllocator::coalesce(std::uint64_t completed) {
  std::lock_guard<SpinLock> guard(lock_);
  const std::uint64_t before = stats_.merges;
  for (Arena* arena : {small_, large_}) {
    for (Segment* s = arena->segments; s != nullptr; s = s->next) {
      for (Node* n = s->first; n != nullptr; n = n->next_addr) {
        if (!n->free) continue;
        Node* next = n->next_addr;
        while (next != nullptr && next->free && mergeable(n, next, completed)) {
          remove_free(*arena, n);
          remove_free(*arena, next);
          absorb(n, next);
          insert_free(*arena, n);
          next = n->next_addr;
        }
      }
    }
  }
  return stats_.merges - before;
}

std::uint64_t SegmentAllocator::trim(std::uint64_t keep, std::uint64_t completed) {
  std::uint64_t released = 0;
  for (;;) {
    CUdeviceptr base = 0;
    std::uint64_t size = 0;
    {
      std::lock_guard<SpinLock> guard(lock_);
      if (reserved_now() <= keep) break;
      Segment* largest = nullptr;
      for (Arena* arena : {small_, large_}) {
        for (Segment* s = arena->segments; s != nullptr; s = s->next) {
          if (!s->paged && s->wholly_free() && s->first->ready_at <= completed &&
              (largest == nullptr || s->size > largest->size)) {
            largest = s;
          }
        }
      }
      if (largest == nullptr) break;
      Arena& arena = *largest->arena;
      remove_free(arena, largest->first);
      slabs_->put(largest->first);
      if (largest->prev != nullptr) {
        largest->prev->next = largest->next;
      } else {
        arena.segments = largest->next;
      }
      if (largest->next != nullptr) largest->next->prev = largest->prev;
      base = largest->base;
      size = largest->size;
      slabs_->put(largest);
      stats_.reserved -= size;
      --stats_.segments;
      ++stats_.segments_released;
      publish();
    }
    source_.release(base, size);  // outside the lock: a driver call
    released += size;
  }
  if (pages_ != nullptr) {
    // Then the free pages of the range, highest first.
    std::lock_guard<std::mutex> guard(pages_->mutex());
    std::uint64_t reserved = 0;
    {
      std::lock_guard<SpinLock> lock(lock_);
      reserved = reserved_now();
    }
    if (reserved > keep) {
      const std::uint64_t unmapped = harvest(reserved - keep, completed);
      pages_->drop_spare();
      released += unmapped;
      std::lock_guard<SpinLock> lock(lock_);
      publish();
    }
  }
  return released;
}

void SegmentAllocator::forget_affinity(std::uintptr_t affinity) {
  if (affinity == 0) return;
  std::lock_guard<SpinLock> guard(lock_);
  for (Arena* arena : {small_, large_}) {
    for (Segment* s = arena->segments; s != nullptr; s = s->next) {
      for (Node* n = s->first; n != nullptr; n = n->next_addr) {
        if (n->free && n->affinity == affinity) n->affinity = 0;
      }
    }
  }
}

void SegmentAllocator::clear() {
  std::lock_guard<SpinLock> guard(lock_);
  for (Arena* arena : {small_, large_}) {
    for (Segment* s = arena->segments; s != nullptr;) {
      for (Node* n = s->first; n != nullptr;) {
        Node* next = n->next_addr;
        slabs_->put(n);
        n = next;
      }
      Segment* next = s->next;
      slabs_->put(s);
      s = next;
    }
    const std::uint64_t split_min = arena->split_min;
    *arena = Arena();
    arena->split_min = split_min;
  }
  paged_ = nullptr;
  paged_allocated_.store(0, std::memory_order_relaxed);
  stats_.reserved = stats_.allocated = stats_.segments = stats_.free_blocks = 0;
  publish();
}

SegmentAllocator::Stats SegmentAllocator::stats() const {
  std::lock_guard<SpinLock> guard(lock_);
  Stats s = stats_;
  s.reserved = reserved_now();
  // The largest free block: the top bin's; in the page map's range only its mapped runs count
  // (a free block there holds memory only where it is mapped).
  auto top_bin = [&](const Arena& arena) {
    for (int w = kWords - 1; w >= 0; --w) {
      if (arena.bitmap[w] == 0) continue;
      const int b = w * 64 + 63 - __builtin_clzll(arena.bitmap[w]);
      for (const Node* n = arena.bins[b]; n != nullptr; n = n->next_free) {
        s.largest_free = std::max(s.largest_free, n->size);
      }
      return;
    }
  };
  top_bin(*small_);
  if (paged_ == nullptr) {
    top_bin(*large_);
    return s;
  }
  const std::uint64_t page = pages_->page();
  for (const Segment* seg = large_->segments; seg != nullptr; seg = seg->next) {
    for (const Node* n = seg->first; n != nullptr; n = n->next_addr) {
      if (!n->free) continue;
      if (!seg->paged) {
        s.largest_free = std::max(s.largest_free, n->size);
        continue;
      }
      std::uint64_t run = 0;
      for (CUdeviceptr at = n->ptr; at < n->ptr + n->size;) {
        const CUdeviceptr page_end = pages_->base() + ((at - pages_->base()) / page + 1) * page;
        const CUdeviceptr end = std::min<CUdeviceptr>(page_end, n->ptr + n->size);
        if (!pages_->mapped(at, 1)) {
          if (pages_->mapped_bytes() == 0) break;
          run = 0;
        } else {
          run += end - at;
          s.largest_free = std::max(s.largest_free, run);
        }
        at = end;
      }
    }
  }
  return s;
}

}  // namespace poolshim
