// VmmLedger: the books of CUDA virtual-memory-management memory that the application makes
// itself (issue 15: JAX/XLA, PyTorch expandable_segments, NCCL call cuMemCreate / cuMemMap /
// cuMemUnmap / cuMemRelease directly), so that every device byte of the process is accounted
// for. Hooks call it after the real driver call succeeded; it calls no CUDA function.
//
// The driver's rules it models (CUDA driver API, Virtual Memory Management): a handle's
// physical memory is freed when the handle is released *and* its last mapping is gone, so
// memory released while mapped stays in consumption until the last cuMemUnmap; one cuMemUnmap
// may cover several adjacent whole mappings.
//
// The record calls allocate nothing and take no process-wide lock: three ShardedMaps (handles,
// mappings, per-site bytes) with a small lock per shard, and per-device figures as relaxed
// atomics. Calls the books cannot match (handles made before the shim was loaded, imported
// handles, a device outside 0..kVmmDevices-1) change no figure and are counted instead.
//
// Calls on the same handle or address racing each other are recorded in the order the hooks
// reach the ledger, which after-the-fact hooks cannot make the driver's order; the books stay
// consistent (nothing wraps below 0) but may then free a handle early or count an unknown call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sharded_map.h"
#include "stats.h"

namespace poolshim {

/// Devices the ledger keeps books for: ordinals 0..kVmmDevices-1 (router.h's kMaxDevices).
constexpr int kVmmDevices = 64;

// X(name, meaning): per-device figures with a current value, a peak since start and a running
// total of increases (GaugeValue).
#define POOLSHIM_VMM_GAUGES(X)                                                                   \
  X(physical_bytes,                                                                              \
    "VMM physical bytes made by cuMemCreate and not yet freed (released and last mapping gone)") \
  X(mapped_bytes, "VMM bytes mapped by cuMemMap and not yet unmapped")                           \
  X(released_mapped_bytes,                                                                       \
    "of physical_bytes, those of handles released while still mapped (freed at the last "        \
    "unmap)")

// X(name, meaning): per-device totals since start.
#define POOLSHIM_VMM_COUNTERS(X)                                            \
  X(creates, "cuMemCreate calls recorded")                                  \
  X(releases, "cuMemRelease calls of handles the ledger knew")              \
  X(maps, "cuMemMap calls of handles the ledger knew")                      \
  X(unmaps, "mappings removed by cuMemUnmap (one call may remove several)") \
  X(reset_dropped, "handles forgotten by drop_device (cudaDeviceReset)")

// X(name, meaning): calls the books could not match, for the whole process (an unknown handle
// has no device).
#define POOLSHIM_VMM_UNKNOWNS(X)                                                               \
  X(unknown_releases, "cuMemRelease of a handle the ledger did not know or had seen released") \
  X(unknown_maps,                                                                              \
    "cuMemMap of a handle the ledger did not know (made before the shim, imported): the "      \
    "mapping is kept, so that its unmap is matched, but counts in no device's figures")        \
  X(unknown_unmaps, "cuMemUnmap calls whose range held memory the ledger had no mapping for")  \
  X(replaced_entries,                                                                          \
    "cuMemCreate or cuMemMap of a handle or address the ledger still held (it missed the "     \
    "release or unmap): the old entry is settled as gone")                                     \
  X(bad_devices, "cuMemCreate calls for a device outside 0..63, not recorded")

/// A copy of one device's VMM figures.
struct VmmDeviceSnapshot {
#define POOLSHIM_VMM_GAUGE_FIELD(name, meaning) GaugeValue name;
  POOLSHIM_VMM_GAUGES(POOLSHIM_VMM_GAUGE_FIELD)
#undef POOLSHIM_VMM_GAUGE_FIELD
#define POOLSHIM_VMM_COUNTER_FIELD(name, meaning) std::uint64_t name = 0;
  POOLSHIM_VMM_COUNTERS(POOLSHIM_VMM_COUNTER_FIELD)
#undef POOLSHIM_VMM_COUNTER_FIELD
};

/// A copy of the process-wide counts of unmatched calls.
struct VmmUnknownsSnapshot {
#define POOLSHIM_VMM_UNKNOWN_FIELD(name, meaning) std::uint64_t name = 0;
  POOLSHIM_VMM_UNKNOWNS(POOLSHIM_VMM_UNKNOWN_FIELD)
#undef POOLSHIM_VMM_UNKNOWN_FIELD
};

/// A call site's live VMM physical bytes on one device.
struct VmmSiteBytes {
  std::uint32_t site = 0;  // call site id (CallSiteTable), 0 = unknown
  std::uint64_t bytes = 0;
};

class VmmLedger {
 public:
  VmmLedger();
  VmmLedger(const VmmLedger&) = delete;
  VmmLedger& operator=(const VmmLedger&) = delete;

  /// cuMemCreate made `handle`: `bytes` of physical memory on `device` (prop->location.id),
  /// from call site `site` (0 = unknown).
  void record_create(std::uint64_t handle, std::uint64_t bytes, int device, std::uint32_t site);
  /// cuMemRelease released `handle`; its memory is freed now, or at its last unmap.
  void record_release(std::uint64_t handle);
  /// cuMemMap mapped `bytes` of `handle` at `va` (the handle's offset does not matter here).
  void record_map(std::uintptr_t va, std::uint64_t bytes, std::uint64_t handle);
  /// cuMemUnmap unmapped [va, va + bytes): the whole mappings that start in it.
  void record_unmap(std::uintptr_t va, std::uint64_t bytes);
  /// cudaDeviceReset: forgets every handle and mapping of `device` (counted in reset_dropped)
  /// and sets its current figures to 0; peaks, totals and counts stay.
  void drop_device(int device);

  /// The figures of `device` (all 0 outside 0..kVmmDevices-1).
  VmmDeviceSnapshot snapshot(int device) const;
  VmmUnknownsSnapshot unknowns() const;
  /// Up to `n` call sites of `device` with live physical bytes, most bytes first (equal bytes:
  /// lower site id first). Off the hot path: allocates the result, locks one shard at a time.
  std::vector<VmmSiteBytes> top_sites(int device, std::size_t n) const;

  /// Handles and mappings the ledger holds (all devices, unknown-handle mappings included).
  std::size_t live_handles() const { return handles_.size(); }
  std::size_t live_mappings() const { return mappings_.size(); }

 private:
  struct Handle {
    std::uint64_t bytes;
    std::uint64_t serial;  // the device's creates count at its creation: tells a re-made
                           // handle of the same value from the one a mapping was made of
    std::uint32_t site;
    std::uint32_t mappings;  // live mappings of it
    std::int32_t device;
    bool released;
  };
  struct Mapping {
    std::uint64_t bytes;
    std::uint64_t handle;
    std::uint64_t serial;  // Handle::serial of the handle mapped
    std::int32_t device;   // the handle's device; -1 for a handle the ledger did not know
  };
  struct Figure {  // a gauge: current, peak, total
    std::atomic<std::uint64_t> current{0};
    std::atomic<std::uint64_t> peak{0};
    std::atomic<std::uint64_t> total{0};
    void add(std::uint64_t n);
    void subtract(std::uint64_t n);
  };
  struct alignas(64) Device {
#define POOLSHIM_VMM_GAUGE_MEMBER(name, meaning) Figure name;
    POOLSHIM_VMM_GAUGES(POOLSHIM_VMM_GAUGE_MEMBER)
#undef POOLSHIM_VMM_GAUGE_MEMBER
#define POOLSHIM_VMM_COUNTER_MEMBER(name, meaning) std::atomic<std::uint64_t> name{0};
    POOLSHIM_VMM_COUNTERS(POOLSHIM_VMM_COUNTER_MEMBER)
#undef POOLSHIM_VMM_COUNTER_MEMBER
  };

  static bool valid_device(int device) {
    return device >= 0 && device < kVmmDevices;
  }
  static std::uint64_t site_key(int device, std::uint32_t site) {
    return (static_cast<std::uint64_t>(device) << 32) | site;
  }
  /// A handle's physical memory is gone: off its device's figure and its site's bytes.
  void free_physical(const Handle& h);
  /// A mapping is gone: off the mapped figure, and its handle freed if that was its last one.
  void settle_unmapped(const Mapping& m);
  void count_unknown(std::atomic<std::uint64_t>& counter) {
    counter.fetch_add(1, std::memory_order_relaxed);
  }

  ShardedMap<Handle> handles_;       // by handle value
  ShardedMap<Mapping> mappings_;     // by mapped address
  ShardedMap<std::uint64_t> sites_;  // live physical bytes by site_key(device, site)
  Device devices_[kVmmDevices];
#define POOLSHIM_VMM_UNKNOWN_MEMBER(name, meaning) std::atomic<std::uint64_t> name##_{0};
  POOLSHIM_VMM_UNKNOWNS(POOLSHIM_VMM_UNKNOWN_MEMBER)
#undef POOLSHIM_VMM_UNKNOWN_MEMBER
};

}  // namespace poolshim
