// PageMap: physical memory behind one range of reserved device addresses, page by page (issue
// 13, DESIGN §7). A large arena of the heap places its blocks in the range as in one segment
// as long as the device (blocks and free space merge across what would be separate segments);
// only the pages under blocks in use, and a bounded slack, are backed. A free block's pages
// stay mapped, so that reuse costs nothing; when mapping would take the arena over its live
// bytes plus the slack, pages wholly inside free blocks whose work has completed are unmapped
// ("claimed") and their physical memory maps where it is needed. Memory freed at one address
// so serves a request at another: the fragmentation that pins segments in a heap of separate
// segments costs no device memory here.
//
// Locking: mapped() is lock-free (one bit per page). commit(), claim() and unmap_claimed() run
// under mutex(); claim() also under the allocator's own lock, so that a page is claimed only
// while it lies in a free block and an allocation that carves it later sees it unmapped and
// commits it again (waiting on mutex() for the unmapping to finish).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace poolshim {

/// The driver's virtual memory calls for one device (DevicePoolPages), or a test's stand-in.
class PhysicalMemory {
 public:
  virtual ~PhysicalMemory() = default;
  /// Reserves `bytes` of address space (no memory).
  virtual CUresult reserve(std::uint64_t bytes, CUdeviceptr* out) = 0;
  virtual void unreserve(CUdeviceptr base, std::uint64_t bytes) = 0;
  /// `bytes` of physical device memory (within the cap: CUDA_ERROR_OUT_OF_MEMORY past it).
  virtual CUresult create(std::uint64_t bytes, CUmemGenericAllocationHandle* out) = 0;
  virtual void destroy(CUmemGenericAllocationHandle handle, std::uint64_t bytes) = 0;
  /// Maps the whole of `handle` at `va` with read-write access for the device.
  virtual CUresult map(CUdeviceptr va, std::uint64_t bytes, CUmemGenericAllocationHandle h) = 0;
  virtual void unmap(CUdeviceptr va, std::uint64_t bytes) = 0;
};

class PageMap {
 public:
  struct Stats {
    std::uint64_t mapped = 0;  // bytes mapped now
    std::uint64_t mapped_peak = 0;
    std::uint64_t held = 0;  // physical bytes held now: mapped, claimed or spare
    std::uint64_t held_peak = 0;
    std::uint64_t maps = 0;  // running totals of pages
    std::uint64_t unmaps = 0;
    std::uint64_t creates = 0;  // physical pages made and destroyed
    std::uint64_t destroys = 0;
  };

  /// `span` bytes of addresses (rounded up to `page`, a multiple of the device's granularity).
  PageMap(PhysicalMemory& physical, std::uint64_t page, std::uint64_t span);
  /// Unmaps and destroys every page and gives the addresses back.
  ~PageMap();
  PageMap(const PageMap&) = delete;
  PageMap& operator=(const PageMap&) = delete;

  /// Reserves the address range (once; later calls return the first's answer).
  CUresult reserve();
  CUdeviceptr base() const { return base_; }
  std::uint64_t span() const { return span_; }
  std::uint64_t page() const { return page_; }
  bool contains(CUdeviceptr p) const { return base_ != 0 && p >= base_ && p - base_ < span_; }

  /// Whether every page under [p, p + n) is mapped (lock-free).
  bool mapped(CUdeviceptr p, std::uint64_t n) const;
  /// Bytes of the pages under [p, p + n) that are not mapped.
  std::uint64_t unmapped_bytes(CUdeviceptr p, std::uint64_t n) const;

  std::mutex& mutex() { return mutex_; }
  /// Maps every page under [p, p + n) that is not: with a claimed page's memory where one is
  /// spare, else with new memory. Under mutex(). On failure nothing stays mapped that was not
  /// before (what it mapped becomes spare: drop_spare() gives it back), so that a request the
  /// device cannot back leaves no memory behind it.
  CUresult commit(CUdeviceptr p, std::uint64_t n);
  /// Claims mapped pages wholly inside [p, p + n), highest first, until `want` bytes are
  /// claimed; returns the bytes claimed. Under mutex() and the allocator's lock.
  std::uint64_t claim(CUdeviceptr p, std::uint64_t n, std::uint64_t want);
  /// Unmaps the claimed pages; their memory becomes spare. Under mutex().
  void unmap_claimed();
  /// Destroys spare memory (what a commit did not use). Under mutex().
  void drop_spare();

  /// The physical memory under [p, p + n), page by page from the page holding p, into `out`
  /// (at most `max`); returns how many, 0 when a page is not mapped or more than `max` lie
  /// under it. Takes mutex() (IPC exports, ipc_share.h).
  std::size_t handles(CUdeviceptr p, std::uint64_t n, CUmemGenericAllocationHandle* out,
                      std::size_t max) const;

  std::uint64_t mapped_bytes() const { return mapped_.load(std::memory_order_relaxed); }
  /// Physical bytes held (mapped, claimed, or spare until drop_spare()): what the device
  /// counts as used, lock-free, so that cudaMemGetInfo never waits for a trim.
  std::uint64_t held_bytes() const { return held_.load(std::memory_order_relaxed); }
  std::uint64_t held_peak() const { return held_peak_.load(std::memory_order_relaxed); }
  /// The running totals (takes mutex(): never while holding it).
  Stats stats() const;
  /// Unmaps and destroys every page and gives the addresses back (before a device reset); a
  /// later reserve() reserves anew.
  void release();

 private:
  std::size_t index(CUdeviceptr p) const { return static_cast<std::size_t>((p - base_) / page_); }
  bool bit(std::size_t i) const {
    return (bits_[i / 64].load(std::memory_order_acquire) >> (i % 64)) & 1;
  }
  void set_bit(std::size_t i, bool on);
  /// Unmaps page i (its bit already clear); its memory becomes spare. Under mutex_.
  void unmap_to_spare(std::size_t i);
  void release_all();

  PhysicalMemory& physical_;
  const std::uint64_t page_;
  const std::uint64_t span_;
  const std::size_t pages_;
  CUdeviceptr base_ = 0;
  CUresult reserved_ = CUDA_ERROR_NOT_INITIALIZED;
  bool tried_ = false;
  mutable std::mutex mutex_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> bits_;
  std::vector<CUmemGenericAllocationHandle> handles_;  // by page, 0 when unmapped
  std::vector<CUmemGenericAllocationHandle> spare_;    // unmapped memory, for the next commit
  std::vector<std::size_t> claimed_;                   // pages claimed, not yet unmapped
  std::vector<std::size_t> fresh_;                     // pages the running commit mapped
  std::atomic<std::uint64_t> mapped_{0};
  std::atomic<std::uint64_t> held_{0};
  std::atomic<std::uint64_t> held_peak_{0};
  Stats stats_;  // under mutex_ (mapped, held: the atomics)
};

}  // namespace poolshim
