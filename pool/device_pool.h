// DevicePool: the one owner of a device's cudaMemPool (as rmm's cuda_async_memory_resource is).
// It creates and configures the pool, holds a reference on the device's primary context so the
// pool outlives the runtime's teardown at exit, owns the private stream that cudaMalloc and
// cudaFree are served on, and is the only place that sets pool attributes.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_api.h"
#include "device_heap.h"
#include "fence_clock.h"
#include "segment_allocator.h"
#include "units.h"

namespace poolshim {

class DevicePoolSegments;
class DevicePoolPages;

struct PoolSettings {
  bool reuse_follow_event_deps = true;
  bool reuse_opportunistic = true;
  bool reuse_internal_deps = false;
  SizeValue cap;              // 0 bytes: no cap
  SizeValue cache;            // free segments the heap keeps beyond what is in use
  SizeValue page;             // the paged large arenas' page (0: large blocks from pool segments)
  bool single_device = true;  // pages are mapped for their own device only (no peer access)
  bool ipc = true;            // pages made exportable for legacy IPC (ipc_share.h)
};

/// The pool's own figures (cudaMemPoolAttr*MemCurrent/High), with the heap's mapped pages
/// added to reserved and used (the high mark adds the pages' peak).
struct PoolUsage {
  std::uint64_t reserved = 0;
  std::uint64_t reserved_high = 0;
  std::uint64_t used = 0;
  std::uint64_t used_high = 0;
  bool valid = false;
};

/// What the application holds of the pool's used memory: free blocks of the heap (`cached`
/// bytes) are used to the driver but free to the application.
inline std::uint64_t handed_out(const PoolUsage& u, std::uint64_t cached) {
  return u.used > cached ? u.used - cached : 0;
}

class DevicePool {
 public:
  /// Creates the pool of device `ordinal` in its primary context. nullptr and `error` set
  /// when any step fails (nothing is left half-made).
  static std::unique_ptr<DevicePool> create(const DriverApi& driver, int ordinal,
                                            const PoolSettings& settings, std::string* error);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  DevicePool(DevicePool&&) = delete;
  DevicePool& operator=(DevicePool&&) = delete;

  int ordinal() const { return ordinal_; }
  CUmemoryPool handle() const { return pool_; }
  CUstream stream() const { return stream_; }
  /// Where `ordered` frees are enqueued, behind waits on the application's streams. Apart
  /// from stream(), so that cudaMalloc's wait for its own stream never waits for them.
  CUstream free_stream() const { return free_stream_; }
  /// Recorded on the legacy default stream by `ordered` frees.
  CUevent legacy_event() const { return legacy_event_; }
  CUcontext context() const { return context_; }
  std::uint64_t device_total() const { return device_total_; }
  /// A real allocation of the shim's own (cuMemAlloc, 512 bytes), made before a stream capture
  /// begins; 0 when there is none. Where the real free function must answer for a block of the
  /// heap during a capture, it is asked to free this instead (Fallback in router.h).
  CUdeviceptr proxy() const { return proxy_.load(std::memory_order_acquire); }
  /// Makes the proxy (anew after the real function freed it); 0 when that fails.
  void renew_proxy();
  /// The pool's cap in bytes (its maximum size; POOLSHIM_LIMIT), 0 when there is none.
  std::uint64_t cap() const { return cap_; }
  /// Physical bytes of the heap's paged arenas (0 without them).
  std::uint64_t pages_held() const;
  /// The paged arenas' page size, 0 when large blocks come from pool segments.
  std::uint64_t page() const { return page_; }

  /// Whether the paged arenas' pages can be exported (PoolSettings::ipc, and the device
  /// accepted the handle type).
  bool pages_exportable() const;
  /// The user-space allocator over the pool (segments split and merged), and the fences that
  /// make its free blocks reusable by any stream.
  DeviceHeap& heap() { return *heap_; }
  const DeviceHeap& heap() const { return *heap_; }
  /// Bytes of free segments the heap keeps beyond what is in use (the `cache` option).
  std::uint64_t heap_keep() const { return heap_keep_; }
  /// Whether `ptr` is the base of one of the heap's segments (see pool_segments.h).
  bool is_segment_base(CUdeviceptr ptr) const;
  FenceClock& fences() { return fences_; }
  /// Recorded on the free stream behind every stream of the device: the event fence.
  CUevent fence_event() const { return fence_event_; }
  /// Held (try-lock) by the one thread that polls or starts the event fence.
  std::mutex& fence_mutex() { return fence_mutex_; }
  /// The number of the event fence in flight, 0 when none (under fence_mutex()).
  std::uint64_t fence_in_flight = 0;
  /// A cudaMalloc has been served a block by the legacy stream's order (Router::
  /// legacy_reuse_allowed): non-blocking streams made from now on first wait for that stream.
  /// Never cleared.
  std::atomic<bool> legacy_handouts{false};
  /// Frees that gave their block the legacy stream's token, and how many of them the last
  /// barrier (an event recorded on the legacy stream) was recorded after.
  std::atomic<std::uint64_t> legacy_frees{0};
  /// A synchronization or a stream query of the device failed (a kernel fault, say): until a
  /// query of the idle private stream succeeds again, calls the heap would serve without a
  /// driver call go to the real function, so that they return the sticky error natively.
  std::atomic<bool> faulted{false};
  std::atomic<std::uint64_t> barrier_covers{0};
  /// Legacy handouts recording a barrier or synchronizing now (Router::order_legacy_handout):
  /// a capture about to begin waits for none to be left (Router::capture_counted).
  std::atomic<int> legacy_orderings{0};
  /// cudaFree'd blocks may take the legacy stream's shortcut only once this fence has
  /// completed: a non-blocking stream destroyed before it may still run work on them (the
  /// free stream waits for that work, so the next fence covers it).
  std::atomic<std::uint64_t> legacy_reuse_after{0};

  PoolUsage usage() const;
  /// The pool's reserved bytes now (one attribute query; 0 when it fails).
  std::uint64_t reserved() const;
  /// Gives unused memory back until the pool holds fewer than `keep_reserved` bytes
  /// (cuMemPoolTrimTo). Returns the bytes released (by the pool's reserved figure).
  std::uint64_t trim_to(std::uint64_t keep_reserved) const;

  /// Destroys the pool and the stream and drops the context reference now (before a
  /// cudaDeviceReset). The object stays valid; its calls then fail and callers pass through.
  void release();

 private:
  /// One attribute of the pool (cuMemPoolGetAttribute); false when it cannot be read.
  bool attribute(CUmemPool_attribute attribute, std::uint64_t* out) const;
  DevicePool(const DriverApi& driver, int ordinal);

  const DriverApi& driver_;
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  CUstream free_stream_ = nullptr;
  CUevent legacy_event_ = nullptr;
  CUevent fence_event_ = nullptr;
  CUmemoryPool pool_ = nullptr;
  std::unique_ptr<DevicePoolSegments> source_;
  std::unique_ptr<DevicePoolPages> pages_;
  std::unique_ptr<DeviceHeap> heap_;
  std::uint64_t page_ = 0;
  std::uint64_t heap_keep_ = 0;
  std::atomic<CUdeviceptr> proxy_{0};
  FenceClock fences_;
  std::mutex fence_mutex_;
  std::uint64_t device_total_ = 0;
  std::uint64_t cap_ = 0;
  bool retained_ = false;
};

}  // namespace poolshim
