#include "page_map.h"

#include "atomic_max.h"

#include <algorithm>

namespace poolshim {

namespace {

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

PageMap::PageMap(PhysicalMemory& physical, std::uint64_t page, std::uint64_t span)
    : physical_(physical),
      page_(page),
      span_(round_up(span, page)),
      pages_(static_cast<std::size_t>(span_ / page)),
      bits_(new std::atomic<std::uint64_t>[(pages_ + 63) / 64]),
      handles_(pages_, 0) {
  for (std::size_t w = 0; w < (pages_ + 63) / 64; ++w) bits_[w].store(0);
  // Reserved once here, so that no claim or commit ever allocates.
  spare_.reserve(pages_);
  claimed_.reserve(pages_);
  fresh_.reserve(pages_);
}

PageMap::~PageMap() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_all();
}

void PageMap::release_all() {
  for (std::size_t i = 0; i < pages_; ++i) {
    if (handles_[i] == 0) continue;
    physical_.unmap(base_ + i * page_, page_);
    physical_.destroy(handles_[i], page_);
    handles_[i] = 0;
    set_bit(i, false);
  }
  for (auto h : spare_) physical_.destroy(h, page_);
  spare_.clear();
  claimed_.clear();
  if (base_ != 0) physical_.unreserve(base_, span_);
  base_ = 0;
  mapped_.store(0, std::memory_order_relaxed);
  held_.store(0, std::memory_order_relaxed);
}

CUresult PageMap::reserve() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!tried_) {
    tried_ = true;
    reserved_ = physical_.reserve(span_, &base_);
    if (reserved_ != CUDA_SUCCESS) base_ = 0;
  }
  return reserved_;
}

void PageMap::set_bit(std::size_t i, bool on) {
  const std::uint64_t mask = 1ULL << (i % 64);
  if (on) {
    bits_[i / 64].fetch_or(mask, std::memory_order_release);
  } else {
    bits_[i / 64].fetch_and(~mask, std::memory_order_release);
  }
}

bool PageMap::mapped(CUdeviceptr p, std::uint64_t n) const {
  if (n == 0) return true;
  for (std::size_t i = index(p), last = index(p + n - 1); i <= last; ++i) {
    if (!bit(i)) return false;
  }
  return true;
}

std::uint64_t PageMap::unmapped_bytes(CUdeviceptr p, std::uint64_t n) const {
  std::uint64_t missing = 0;
  if (n == 0) return 0;
  for (std::size_t i = index(p), last = index(p + n - 1); i <= last; ++i) {
    if (!bit(i)) missing += page_;
  }
  return missing;
}

CUresult PageMap::commit(CUdeviceptr p, std::uint64_t n) {
  if (n == 0) return CUDA_SUCCESS;
  CUresult r = CUDA_SUCCESS;
  fresh_.clear();
  for (std::size_t i = index(p), last = index(p + n - 1); i <= last; ++i) {
    if (handles_[i] != 0) continue;
    CUmemGenericAllocationHandle h = 0;
    if (!spare_.empty()) {
      h = spare_.back();
      spare_.pop_back();
    } else {
      r = physical_.create(page_, &h);
      if (r != CUDA_SUCCESS) break;
      ++stats_.creates;
      raise_to(held_peak_, held_.fetch_add(page_, std::memory_order_relaxed) + page_);
    }
    r = physical_.map(base_ + i * page_, page_, h);
    if (r != CUDA_SUCCESS) {
      spare_.push_back(h);
      break;
    }
    handles_[i] = h;
    fresh_.push_back(i);
    ++stats_.maps;
    const std::uint64_t now = mapped_.fetch_add(page_, std::memory_order_relaxed) + page_;
    stats_.mapped_peak = std::max(stats_.mapped_peak, now);
    set_bit(i, true);
  }
  if (r == CUDA_SUCCESS) return r;
  // Undo this call's mappings, keeping their memory spare: nothing has used them (the caller
  // holds the block under them alone and has not handed it out).
  for (std::size_t i : fresh_) {
    set_bit(i, false);
    unmap_to_spare(i);
  }
  fresh_.clear();
  return r;
}

std::uint64_t PageMap::claim(CUdeviceptr p, std::uint64_t n, std::uint64_t want) {
  const CUdeviceptr first = round_up(p - base_, page_) + base_;
  const CUdeviceptr end = (p + n - base_) / page_ * page_ + base_;
  std::uint64_t claimed = 0;
  for (CUdeviceptr at = end; at > first && claimed < want;) {
    at -= page_;
    const std::size_t i = index(at);
    if (!bit(i)) continue;
    set_bit(i, false);  // from now on an allocation of it commits it again
    claimed_.push_back(i);
    claimed += page_;
  }
  return claimed;
}

void PageMap::unmap_to_spare(std::size_t i) {
  physical_.unmap(base_ + i * page_, page_);
  spare_.push_back(handles_[i]);
  handles_[i] = 0;
  ++stats_.unmaps;
  mapped_.fetch_sub(page_, std::memory_order_relaxed);
}

void PageMap::unmap_claimed() {
  for (std::size_t i : claimed_) unmap_to_spare(i);
  claimed_.clear();
}

void PageMap::drop_spare() {
  for (auto h : spare_) {
    physical_.destroy(h, page_);
    held_.fetch_sub(page_, std::memory_order_relaxed);
    ++stats_.destroys;
  }
  spare_.clear();
}

std::size_t PageMap::handles(CUdeviceptr p, std::uint64_t n, CUmemGenericAllocationHandle* out,
                             std::size_t max) const {
  if (n == 0 || !contains(p) || !contains(p + n - 1)) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t first = index(p), last = index(p + n - 1);
  if (last - first + 1 > max) return 0;
  for (std::size_t i = first; i <= last; ++i) {
    if (handles_[i] == 0) return 0;
    out[i - first] = handles_[i];
  }
  return last - first + 1;
}

PageMap::Stats PageMap::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.mapped = mapped_.load(std::memory_order_relaxed);
  s.held = held_.load(std::memory_order_relaxed);
  s.held_peak = held_peak_.load(std::memory_order_relaxed);
  return s;
}

void PageMap::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_all();
  tried_ = false;
  reserved_ = CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace poolshim
