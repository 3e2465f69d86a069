#include "vmm_ledger.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "atomic_max.h"

namespace poolshim {

namespace {

// Slots a shard at start (64 shards each): VMM users hold few handles (PyTorch's expandable
// segments map 20 MiB pages, XLA a few large chunks), so 4096 entries a table cover most
// programs without growing, and the tables stay small when the application makes none.
constexpr std::size_t kInitialHandleSlots = 64;
constexpr std::size_t kInitialSiteSlots = 16;

// Mappings settled per pass of an unmap's slow path (stack space, no allocation).
constexpr std::size_t kUnmapBatch = 16;

}  // namespace

VmmLedger::VmmLedger()
    : handles_(kInitialHandleSlots), mappings_(kInitialHandleSlots), sites_(kInitialSiteSlots) {}

// Plain atomics a device rather than sharded Gauges (stats.h): each of these calls costs the
// application microseconds in the driver, so one contended cache line is noise beside it.
void VmmLedger::Figure::add(std::uint64_t n) {
  raise_to(peak, current.fetch_add(n, std::memory_order_relaxed) + n);
  total.fetch_add(n, std::memory_order_relaxed);
}

// Never below 0: drop_device may zero a figure while a call of the device is in flight.
void VmmLedger::Figure::subtract(std::uint64_t n) {
  std::uint64_t seen = current.load(std::memory_order_relaxed);
  while (
      !current.compare_exchange_weak(seen, seen - std::min(seen, n), std::memory_order_relaxed)) {
  }
}

void VmmLedger::record_create(std::uint64_t handle, std::uint64_t bytes, int device,
                              std::uint32_t site) {
  if (!valid_device(device)) {
    count_unknown(bad_devices_);
    return;
  }
  Device& d = devices_[device];
  const std::uint64_t serial = d.creates.fetch_add(1, std::memory_order_relaxed) + 1;
  // Figures first, entry second: a call that finds the entry finds its bytes counted already.
  d.physical_bytes.add(bytes);
  sites_.upsert(site_key(device, site), [&](std::uint64_t& live, bool) { live += bytes; });
  const Handle fresh{bytes, serial, site, 0, device, false};
  std::optional<Handle> replaced;
  handles_.upsert(handle, [&](Handle& h, bool inserted) {
    if (!inserted) replaced = h;
    h = fresh;
  });
  if (replaced) {
    // The driver never hands out a live handle twice: the books missed its release. Its
    // mappings keep the old serial, so their unmaps will not touch the new entry.
    count_unknown(replaced_entries_);
    if (replaced->released)
      devices_[replaced->device].released_mapped_bytes.subtract(replaced->bytes);
    free_physical(*replaced);
  }
}

void VmmLedger::record_release(std::uint64_t handle) {
  std::optional<Handle> known;
  bool freed = false;
  handles_.update(handle, [&](Handle& h) {
    if (h.released) return true;  // released before and still mapped: nothing more to do
    known = h;
    if (h.mappings == 0) {
      freed = true;
      return false;
    }
    // Still mapped: the memory stays in consumption until the last unmap (cuMemRelease). Under
    // the shard lock, so that the last unmap cannot take these bytes off before they are on.
    h.released = true;
    devices_[h.device].released_mapped_bytes.add(h.bytes);
    return true;
  });
  if (!known) {
    count_unknown(unknown_releases_);
    return;
  }
  devices_[known->device].releases.fetch_add(1, std::memory_order_relaxed);
  if (freed) free_physical(*known);
}

void VmmLedger::record_map(std::uintptr_t va, std::uint64_t bytes, std::uint64_t handle) {
  Mapping mapping{bytes, handle, 0, -1};
  handles_.update(handle, [&](Handle& h) {
    if (h.released) return true;  // the driver refuses a released handle: not this one's mapping
    ++h.mappings;
    mapping.serial = h.serial;
    mapping.device = h.device;
    return true;
  });
  if (valid_device(mapping.device)) {
    Device& d = devices_[mapping.device];
    d.maps.fetch_add(1, std::memory_order_relaxed);
    d.mapped_bytes.add(bytes);
  } else {
    count_unknown(unknown_maps_);  // kept all the same, so that its unmap is matched
  }
  std::optional<Mapping> replaced;
  mappings_.upsert(va, [&](Mapping& m, bool inserted) {
    if (!inserted) replaced = m;
    m = mapping;
  });
  if (replaced) {
    // The driver does not map over a mapped address: the books missed its unmap.
    count_unknown(replaced_entries_);
    settle_unmapped(*replaced);
  }
}

void VmmLedger::record_unmap(std::uintptr_t va, std::uint64_t bytes) {
  const std::uint64_t start = va;
  const std::uint64_t end = bytes > std::numeric_limits<std::uint64_t>::max() - start
                                ? std::numeric_limits<std::uint64_t>::max()
                                : start + bytes;
  // The range is whole mappings end to end (cuMemUnmap): walk them by their start addresses.
  std::uint64_t cursor = start;
  while (cursor < end) {
    const std::optional<Mapping> m = mappings_.take(cursor);
    if (!m) break;
    settle_unmapped(*m);
    cursor = m->bytes >= end - cursor ? end : cursor + m->bytes;
  }
  if (cursor == end && bytes != 0) return;
  // A gap: memory mapped before the shim was loaded, or an unmap the driver would have refused.
  // The mappings after it cannot be found by address: look at every entry (rare, and one shard
  // locked at a time), settling them outside the map's locks.
  count_unknown(unknown_unmaps_);
  Mapping batch[kUnmapBatch];
  std::size_t n = 0;
  do {
    n = 0;
    mappings_.erase_if([&](std::uint64_t key, const Mapping& m) {
      if (n == kUnmapBatch || key < cursor || key >= end) return false;
      batch[n++] = m;
      return true;
    });
    for (std::size_t i = 0; i < n; ++i) settle_unmapped(batch[i]);
  } while (n == kUnmapBatch);
}

void VmmLedger::settle_unmapped(const Mapping& m) {
  if (!valid_device(m.device)) return;  // a mapping of a handle the ledger did not know
  Device& d = devices_[m.device];
  d.unmaps.fetch_add(1, std::memory_order_relaxed);
  d.mapped_bytes.subtract(m.bytes);
  std::optional<Handle> freed;
  handles_.update(m.handle, [&](Handle& h) {
    if (h.serial != m.serial || h.device != m.device) return true;  // a later handle, same value
    if (h.mappings > 0) --h.mappings;
    if (!h.released || h.mappings > 0) return true;
    d.released_mapped_bytes.subtract(h.bytes);  // released earlier: its last mapping frees it
    freed = h;
    return false;
  });
  if (freed) free_physical(*freed);
}

void VmmLedger::free_physical(const Handle& h) {
  devices_[h.device].physical_bytes.subtract(h.bytes);
  // A site with nothing live leaves the table: it then holds live sites only.
  sites_.update(site_key(h.device, h.site), [&](std::uint64_t& live) {
    live -= std::min(live, h.bytes);
    return live != 0;
  });
}

void VmmLedger::drop_device(int device) {
  if (!valid_device(device)) return;
  Device& d = devices_[device];
  const std::size_t dropped =
      handles_.erase_if([&](std::uint64_t, const Handle& h) { return h.device == device; });
  mappings_.erase_if([&](std::uint64_t, const Mapping& m) { return m.device == device; });
  const std::uint64_t device_key = static_cast<std::uint64_t>(device);
  sites_.erase_if([&](std::uint64_t key, const std::uint64_t&) { return key >> 32 == device_key; });
  d.reset_dropped.fetch_add(dropped, std::memory_order_relaxed);
#define POOLSHIM_VMM_GAUGE_ZERO(name, meaning) d.name.current.store(0, std::memory_order_relaxed);
  POOLSHIM_VMM_GAUGES(POOLSHIM_VMM_GAUGE_ZERO)
#undef POOLSHIM_VMM_GAUGE_ZERO
}

VmmDeviceSnapshot VmmLedger::snapshot(int device) const {
  VmmDeviceSnapshot s;
  if (!valid_device(device)) return s;
  const Device& d = devices_[device];
#define POOLSHIM_VMM_GAUGE_COPY(name, meaning)                     \
  s.name.current = d.name.current.load(std::memory_order_relaxed); \
  s.name.peak = d.name.peak.load(std::memory_order_relaxed);       \
  s.name.total = d.name.total.load(std::memory_order_relaxed);
  POOLSHIM_VMM_GAUGES(POOLSHIM_VMM_GAUGE_COPY)
#undef POOLSHIM_VMM_GAUGE_COPY
#define POOLSHIM_VMM_COUNTER_COPY(name, meaning) s.name = d.name.load(std::memory_order_relaxed);
  POOLSHIM_VMM_COUNTERS(POOLSHIM_VMM_COUNTER_COPY)
#undef POOLSHIM_VMM_COUNTER_COPY
  return s;
}

VmmUnknownsSnapshot VmmLedger::unknowns() const {
  VmmUnknownsSnapshot s;
#define POOLSHIM_VMM_UNKNOWN_COPY(name, meaning) s.name = name##_.load(std::memory_order_relaxed);
  POOLSHIM_VMM_UNKNOWNS(POOLSHIM_VMM_UNKNOWN_COPY)
#undef POOLSHIM_VMM_UNKNOWN_COPY
  return s;
}

std::vector<VmmSiteBytes> VmmLedger::top_sites(int device, std::size_t n) const {
  std::vector<VmmSiteBytes> top;
  if (!valid_device(device) || n == 0) return top;
  const auto better = [](const VmmSiteBytes& a, const VmmSiteBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
  };
  // A heap of the best `keep` so far, the worst of them in front. Reserved up front, so that
  // nothing allocates under a shard lock that hooks may be waiting for; sites made during the
  // walk beyond the slack are left out.
  const std::size_t keep = std::min(n, sites_.size() + 64);
  top.reserve(keep);
  const std::uint64_t device_key = static_cast<std::uint64_t>(device);
  sites_.for_each([&](std::uint64_t key, const std::uint64_t& live) {
    if (key >> 32 != device_key || live == 0) return;
    const VmmSiteBytes entry{static_cast<std::uint32_t>(key), live};
    if (top.size() < keep) {
      top.push_back(entry);
      std::push_heap(top.begin(), top.end(), better);
    } else if (better(entry, top.front())) {
      std::pop_heap(top.begin(), top.end(), better);
      top.back() = entry;
      std::push_heap(top.begin(), top.end(), better);
    }
  });
  std::sort(top.begin(), top.end(), better);
  return top;
}

}  // namespace poolshim
