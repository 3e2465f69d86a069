// VmmLedger: the books of the application's own VMM memory (issue 15), with the driver's rules
// for cuMemCreate / cuMemMap / cuMemUnmap / cuMemRelease, exact figures per device and site.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "vmm_ledger.h"

using poolshim::VmmLedger;
using poolshim::VmmSiteBytes;

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uintptr_t kVa = 0x7f0000000000;  // VMM addresses are granularity-aligned

bool same(const std::vector<VmmSiteBytes>& got, const std::vector<VmmSiteBytes>& want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i].site != want[i].site || got[i].bytes != want[i].bytes) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("vmm ledger: creates count physical bytes on their own device") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_create(0xb, 6 * kMiB, 1, 2);
  const auto d0 = ledger.snapshot(0);
  const auto d1 = ledger.snapshot(1);
  CHECK(d0.physical_bytes.current == 4 * kMiB);
  CHECK(d0.physical_bytes.peak == 4 * kMiB);
  CHECK(d0.physical_bytes.total == 4 * kMiB);
  CHECK(d0.creates == 1);
  CHECK(d1.physical_bytes.current == 6 * kMiB);
  CHECK(d1.creates == 1);
  CHECK(d0.mapped_bytes.current == 0);
  CHECK(ledger.snapshot(2).physical_bytes.current == 0);
  CHECK(ledger.live_handles() == 2);
}

TEST_CASE("vmm ledger: map and unmap move mapped bytes and leave physical bytes") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_map(kVa, 4 * kMiB, 0xa);
  auto d0 = ledger.snapshot(0);
  CHECK(d0.mapped_bytes.current == 4 * kMiB);
  CHECK(d0.maps == 1);
  CHECK(d0.physical_bytes.current == 4 * kMiB);
  ledger.record_unmap(kVa, 4 * kMiB);
  d0 = ledger.snapshot(0);
  CHECK(d0.mapped_bytes.current == 0);
  CHECK(d0.mapped_bytes.peak == 4 * kMiB);
  CHECK(d0.unmaps == 1);
  CHECK(d0.physical_bytes.current == 4 * kMiB);
  CHECK(ledger.live_mappings() == 0);
}

TEST_CASE("vmm ledger: one unmap covering two adjacent mappings of two devices removes both") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_create(0xb, 2 * kMiB, 1, 1);
  ledger.record_map(kVa, 4 * kMiB, 0xa);
  ledger.record_map(kVa + 4 * kMiB, 2 * kMiB, 0xb);
  CHECK(ledger.snapshot(0).mapped_bytes.current == 4 * kMiB);
  CHECK(ledger.snapshot(1).mapped_bytes.current == 2 * kMiB);
  ledger.record_unmap(kVa, 6 * kMiB);
  CHECK(ledger.snapshot(0).mapped_bytes.current == 0);
  CHECK(ledger.snapshot(1).mapped_bytes.current == 0);
  CHECK(ledger.snapshot(0).unmaps == 1);
  CHECK(ledger.snapshot(1).unmaps == 1);
  CHECK(ledger.live_mappings() == 0);
  CHECK(ledger.unknowns().unknown_unmaps == 0);
}

TEST_CASE("vmm ledger: memory released while mapped stays in consumption until the last unmap") {
  VmmLedger ledger;
  ledger.record_create(0xa, 8 * kMiB, 1, 3);
  ledger.record_map(kVa, 4 * kMiB, 0xa);  // the handle mapped in two pieces
  ledger.record_map(kVa + 4 * kMiB, 4 * kMiB, 0xa);
  ledger.record_release(0xa);
  auto d1 = ledger.snapshot(1);
  CHECK(d1.releases == 1);
  CHECK(d1.physical_bytes.current == 8 * kMiB);
  CHECK(d1.released_mapped_bytes.current == 8 * kMiB);
  CHECK(ledger.live_handles() == 1);
  CHECK(same(ledger.top_sites(1, 5), {{3, 8 * kMiB}}));

  ledger.record_unmap(kVa, 4 * kMiB);
  d1 = ledger.snapshot(1);
  CHECK(d1.physical_bytes.current == 8 * kMiB);  // one mapping left
  CHECK(d1.mapped_bytes.current == 4 * kMiB);

  ledger.record_unmap(kVa + 4 * kMiB, 4 * kMiB);
  d1 = ledger.snapshot(1);
  CHECK(d1.physical_bytes.current == 0);
  CHECK(d1.physical_bytes.peak == 8 * kMiB);
  CHECK(d1.released_mapped_bytes.current == 0);
  CHECK(d1.released_mapped_bytes.peak == 8 * kMiB);
  CHECK(d1.mapped_bytes.current == 0);
  CHECK(d1.unmaps == 2);
  CHECK(ledger.live_handles() == 0);
  CHECK(ledger.top_sites(1, 5).empty());
}

TEST_CASE("vmm ledger: releasing an unmapped handle frees its memory at once") {
  VmmLedger ledger;
  ledger.record_create(0xa, 2 * kMiB, 0, 1);
  ledger.record_map(kVa, 2 * kMiB, 0xa);
  ledger.record_unmap(kVa, 2 * kMiB);
  ledger.record_release(0xa);
  const auto d0 = ledger.snapshot(0);
  CHECK(d0.physical_bytes.current == 0);
  CHECK(d0.released_mapped_bytes.peak == 0);
  CHECK(d0.releases == 1);
  CHECK(ledger.live_handles() == 0);
}

TEST_CASE("vmm ledger: peaks keep the highest physical and mapped bytes, totals every increase") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_create(0xb, 6 * kMiB, 0, 1);
  ledger.record_release(0xa);
  ledger.record_create(0xc, 2 * kMiB, 0, 1);
  ledger.record_map(kVa, 6 * kMiB, 0xb);
  ledger.record_map(kVa + 6 * kMiB, 2 * kMiB, 0xc);
  ledger.record_unmap(kVa + 6 * kMiB, 2 * kMiB);
  ledger.record_map(kVa + 6 * kMiB, 2 * kMiB, 0xc);
  ledger.record_unmap(kVa, 8 * kMiB);
  const auto d0 = ledger.snapshot(0);
  CHECK(d0.physical_bytes.current == 8 * kMiB);
  CHECK(d0.physical_bytes.peak == 10 * kMiB);
  CHECK(d0.physical_bytes.total == 12 * kMiB);
  CHECK(d0.mapped_bytes.current == 0);
  CHECK(d0.mapped_bytes.peak == 8 * kMiB);
  CHECK(d0.mapped_bytes.total == 10 * kMiB);
  CHECK(d0.creates == 3);
  CHECK(d0.releases == 1);
  CHECK(d0.maps == 3);
  CHECK(d0.unmaps == 3);
}

TEST_CASE("vmm ledger: release of an unknown handle is counted and changes no figure") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_release(0xdead);
  CHECK(ledger.unknowns().unknown_releases == 1);
  CHECK(ledger.snapshot(0).releases == 0);
  CHECK(ledger.snapshot(0).physical_bytes.current == 4 * kMiB);
  CHECK(ledger.live_handles() == 1);
}

TEST_CASE("vmm ledger: a second release of a handle still mapped counts as unknown") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_map(kVa, 4 * kMiB, 0xa);
  ledger.record_release(0xa);
  ledger.record_release(0xa);
  CHECK(ledger.unknowns().unknown_releases == 1);
  CHECK(ledger.snapshot(0).releases == 1);
  CHECK(ledger.snapshot(0).released_mapped_bytes.current == 4 * kMiB);
  ledger.record_unmap(kVa, 4 * kMiB);
  CHECK(ledger.snapshot(0).physical_bytes.current == 0);
  CHECK(ledger.snapshot(0).released_mapped_bytes.current == 0);
}

TEST_CASE("vmm ledger: unmap of an unknown address is counted and changes no figure") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_map(kVa, 4 * kMiB, 0xa);
  ledger.record_unmap(kVa + 64 * kMiB, 2 * kMiB);
  ledger.record_unmap(kVa + 2 * kMiB, 2 * kMiB);  // inside a mapping, not at its start
  CHECK(ledger.unknowns().unknown_unmaps == 2);
  const auto d0 = ledger.snapshot(0);
  CHECK(d0.unmaps == 0);
  CHECK(d0.mapped_bytes.current == 4 * kMiB);
  CHECK(ledger.live_mappings() == 1);
}

TEST_CASE(
    "vmm ledger: an unmap starting at an unknown mapping still removes the known ones after it") {
  VmmLedger ledger;
  ledger.record_create(0xa, 2 * kMiB, 0, 1);
  ledger.record_create(0xb, 2 * kMiB, 0, 1);
  // [kVa, kVa + 2 MiB) was mapped before the shim was loaded.
  ledger.record_map(kVa + 2 * kMiB, 2 * kMiB, 0xa);
  ledger.record_map(kVa + 4 * kMiB, 2 * kMiB, 0xb);
  ledger.record_map(kVa + 6 * kMiB, 2 * kMiB, 0xb);  // outside the unmapped range
  ledger.record_unmap(kVa, 6 * kMiB);
  CHECK(ledger.unknowns().unknown_unmaps == 1);
  const auto d0 = ledger.snapshot(0);
  CHECK(d0.unmaps == 2);
  CHECK(d0.mapped_bytes.current == 2 * kMiB);
  CHECK(ledger.live_mappings() == 1);
}

TEST_CASE("vmm ledger: a mapping of an unknown handle is counted once and its unmap matched") {
  VmmLedger ledger;
  ledger.record_map(kVa, 2 * kMiB, 0xdead);  // e.g. an imported handle
  CHECK(ledger.unknowns().unknown_maps == 1);
  CHECK(ledger.snapshot(0).maps == 0);
  CHECK(ledger.snapshot(0).mapped_bytes.current == 0);
  CHECK(ledger.live_mappings() == 1);
  ledger.record_unmap(kVa, 2 * kMiB);
  CHECK(ledger.unknowns().unknown_unmaps == 0);
  CHECK(ledger.snapshot(0).unmaps == 0);
  CHECK(ledger.live_mappings() == 0);
}

TEST_CASE("vmm ledger: a map of a released handle counts as unknown") {
  VmmLedger ledger;
  ledger.record_create(0xa, 2 * kMiB, 0, 1);
  ledger.record_map(kVa, 2 * kMiB, 0xa);
  ledger.record_release(0xa);
  ledger.record_map(kVa + 2 * kMiB, 2 * kMiB, 0xa);
  CHECK(ledger.unknowns().unknown_maps == 1);
  CHECK(ledger.snapshot(0).maps == 1);
  CHECK(ledger.snapshot(0).mapped_bytes.current == 2 * kMiB);
  ledger.record_unmap(kVa, 4 * kMiB);
  CHECK(ledger.snapshot(0).physical_bytes.current == 0);
  CHECK(ledger.live_handles() == 0);
  CHECK(ledger.live_mappings() == 0);
}

TEST_CASE("vmm ledger: create on a device outside 0..63 is not recorded") {
  VmmLedger ledger;
  ledger.record_create(0xa, 2 * kMiB, -1, 1);
  ledger.record_create(0xb, 2 * kMiB, 64, 1);
  CHECK(ledger.unknowns().bad_devices == 2);
  CHECK(ledger.live_handles() == 0);
  ledger.record_release(0xa);
  CHECK(ledger.unknowns().unknown_releases == 1);
  CHECK(ledger.snapshot(-1).creates == 0);
  CHECK(ledger.snapshot(64).creates == 0);
  CHECK(ledger.top_sites(64, 5).empty());
}

TEST_CASE("vmm ledger: a handle created again without its release replaces the old entry") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_map(kVa, 4 * kMiB, 0xa);
  ledger.record_create(0xa, 2 * kMiB, 1, 2);  // the books missed the release of the first
  CHECK(ledger.unknowns().replaced_entries == 1);
  CHECK(ledger.snapshot(0).physical_bytes.current == 0);
  CHECK(ledger.snapshot(1).physical_bytes.current == 2 * kMiB);
  CHECK(ledger.top_sites(0, 5).empty());
  // The old mapping's unmap leaves the new handle alone: its release frees it at once.
  ledger.record_unmap(kVa, 4 * kMiB);
  CHECK(ledger.snapshot(0).mapped_bytes.current == 0);
  ledger.record_release(0xa);
  CHECK(ledger.snapshot(1).physical_bytes.current == 0);
  CHECK(ledger.snapshot(1).releases == 1);
  CHECK(ledger.live_handles() == 0);
}

TEST_CASE("vmm ledger: a map over a mapped address settles the old mapping") {
  VmmLedger ledger;
  ledger.record_create(0xa, 2 * kMiB, 0, 1);
  ledger.record_create(0xb, 2 * kMiB, 0, 1);
  ledger.record_map(kVa, 2 * kMiB, 0xa);
  ledger.record_release(0xa);
  ledger.record_map(kVa, 2 * kMiB, 0xb);  // the books missed the unmap of 0xa
  CHECK(ledger.unknowns().replaced_entries == 1);
  const auto d0 = ledger.snapshot(0);
  CHECK(d0.physical_bytes.current == 2 * kMiB);  // 0xa's last mapping went: freed
  CHECK(d0.mapped_bytes.current == 2 * kMiB);
  CHECK(d0.unmaps == 1);
  CHECK(ledger.live_handles() == 1);
}

TEST_CASE("vmm ledger: handle 0 is an ordinary handle") {
  VmmLedger ledger;
  ledger.record_create(0, 2 * kMiB, 0, 0);
  ledger.record_map(kVa, 2 * kMiB, 0);
  CHECK(ledger.snapshot(0).maps == 1);
  ledger.record_release(0);
  ledger.record_unmap(kVa, 2 * kMiB);
  CHECK(ledger.snapshot(0).physical_bytes.current == 0);
  CHECK(ledger.unknowns().unknown_releases == 0);
  CHECK(ledger.live_handles() == 0);
}

TEST_CASE("vmm ledger: top_sites lists a device's sites by live bytes, most first") {
  VmmLedger ledger;
  ledger.record_create(1, 1 * kMiB, 0, 7);
  ledger.record_create(2, 2 * kMiB, 0, 7);  // site 7: 3 MiB in two handles
  ledger.record_create(3, 5 * kMiB, 0, 9);
  ledger.record_create(4, 1 * kMiB, 0, 0);  // unknown site
  ledger.record_create(5, 3 * kMiB, 0, 4);  // ties with site 7: lower id first
  ledger.record_create(6, 100 * kMiB, 1, 9);
  CHECK(same(ledger.top_sites(0, 3), {{9, 5 * kMiB}, {4, 3 * kMiB}, {7, 3 * kMiB}}));
  CHECK(
      same(ledger.top_sites(0, 10), {{9, 5 * kMiB}, {4, 3 * kMiB}, {7, 3 * kMiB}, {0, 1 * kMiB}}));
  CHECK(same(ledger.top_sites(1, 10), {{9, 100 * kMiB}}));
  CHECK(ledger.top_sites(2, 10).empty());
  CHECK(ledger.top_sites(0, 0).empty());

  ledger.record_release(3);
  ledger.record_release(1);
  CHECK(same(ledger.top_sites(0, 2), {{4, 3 * kMiB}, {7, 2 * kMiB}}));
}

TEST_CASE("vmm ledger: drop_device forgets one device's entries and zeroes its current figures") {
  VmmLedger ledger;
  ledger.record_create(0xa, 4 * kMiB, 0, 1);
  ledger.record_map(kVa, 4 * kMiB, 0xa);
  ledger.record_create(0xb, 6 * kMiB, 1, 5);
  ledger.record_map(kVa + 4 * kMiB, 6 * kMiB, 0xb);
  ledger.record_create(0xc, 2 * kMiB, 1, 5);
  ledger.record_release(0xb);  // released, still mapped
  ledger.drop_device(1);

  const auto d1 = ledger.snapshot(1);
  CHECK(d1.physical_bytes.current == 0);
  CHECK(d1.physical_bytes.peak == 8 * kMiB);
  CHECK(d1.mapped_bytes.current == 0);
  CHECK(d1.mapped_bytes.peak == 6 * kMiB);
  CHECK(d1.released_mapped_bytes.current == 0);
  CHECK(d1.reset_dropped == 2);
  CHECK(d1.creates == 2);
  CHECK(ledger.top_sites(1, 5).empty());
  const auto d0 = ledger.snapshot(0);
  CHECK(d0.physical_bytes.current == 4 * kMiB);
  CHECK(d0.mapped_bytes.current == 4 * kMiB);
  CHECK(ledger.live_handles() == 1);
  CHECK(ledger.live_mappings() == 1);

  // The dropped device's entries are unknown now; the device records afresh.
  ledger.record_release(0xc);
  ledger.record_unmap(kVa + 4 * kMiB, 6 * kMiB);
  CHECK(ledger.unknowns().unknown_releases == 1);
  CHECK(ledger.unknowns().unknown_unmaps == 1);
  CHECK(ledger.snapshot(1).releases == 1);
  ledger.record_create(0xd, 1 * kMiB, 1, 5);
  CHECK(ledger.snapshot(1).physical_bytes.current == 1 * kMiB);
  CHECK(same(ledger.top_sites(1, 5), {{5, 1 * kMiB}}));
}

TEST_CASE("vmm ledger: 100000 live handles grow the tables and all come back to 0") {
  VmmLedger ledger;
  constexpr std::uint64_t kHandles = 100000;
  for (std::uint64_t i = 0; i < kHandles; ++i) {
    ledger.record_create(0x1000 + i, 2 * kMiB, static_cast<int>(i % 4), 1);
    ledger.record_map(kVa + i * 2 * kMiB, 2 * kMiB, 0x1000 + i);
  }
  CHECK(ledger.live_handles() == kHandles);
  CHECK(ledger.live_mappings() == kHandles);
  for (std::uint64_t i = 0; i < kHandles; i += 10) {
    ledger.record_unmap(kVa + i * 2 * kMiB, 20 * kMiB);  // ten mappings a call
  }
  for (std::uint64_t i = 0; i < kHandles; ++i) ledger.record_release(0x1000 + i);
  for (int device = 0; device < 4; ++device) {
    const auto d = ledger.snapshot(device);
    CHECK(d.physical_bytes.current == 0);
    CHECK(d.physical_bytes.peak == kHandles / 4 * 2 * kMiB);
    CHECK(d.mapped_bytes.current == 0);
    CHECK(d.unmaps == kHandles / 4);
    CHECK(d.releases == kHandles / 4);
  }
  CHECK(ledger.live_handles() == 0);
  CHECK(ledger.live_mappings() == 0);
  CHECK(ledger.unknowns().unknown_unmaps == 0);
}

TEST_CASE(
    "vmm ledger: 4 threads making and freeing 10000 handles each end at 0 bytes, exact counts") {
  VmmLedger ledger;
  constexpr int kThreads = 4;
  constexpr std::uint64_t kHandles = 10000;
  constexpr std::uint64_t kBatch = 8;  // handles live at once in a thread
  const auto bytes_of = [](std::uint64_t i) { return 2 * kMiB * (1 + i % 3); };
  std::uint64_t batch_peak = 0;  // the most bytes one thread's batch holds
  std::uint64_t thread_total = 0;
  for (std::uint64_t b = 0; b < kHandles; b += kBatch) {
    std::uint64_t sum = 0;
    for (std::uint64_t i = b; i < b + kBatch; ++i) sum += bytes_of(i);
    batch_peak = std::max(batch_peak, sum);
    thread_total += sum;
  }

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int device = t % 2;
      const std::uint64_t handle_base = static_cast<std::uint64_t>(t + 1) << 40;
      const std::uintptr_t va_base = static_cast<std::uintptr_t>(t + 1) << 44;
      for (std::uint64_t b = 0; b < kHandles; b += kBatch) {
        // Each handle mapped in two halves, the batch's mappings end to end.
        std::uintptr_t va = va_base + b * 8 * kMiB;
        const std::uintptr_t batch_va = va;
        for (std::uint64_t i = b; i < b + kBatch; ++i) {
          ledger.record_create(handle_base + i, bytes_of(i), device,
                               static_cast<std::uint32_t>(t * 10 + i % 5 + 1));
          ledger.record_map(va, bytes_of(i) / 2, handle_base + i);
          ledger.record_map(va + bytes_of(i) / 2, bytes_of(i) / 2, handle_base + i);
          va += bytes_of(i);
        }
        // Even handles released while mapped, odd ones after one unmap of the whole batch.
        for (std::uint64_t i = b; i < b + kBatch; i += 2) ledger.record_release(handle_base + i);
        ledger.record_unmap(batch_va, va - batch_va);
        for (std::uint64_t i = b + 1; i < b + kBatch; i += 2) {
          ledger.record_release(handle_base + i);
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  for (int device = 0; device < 2; ++device) {
    const auto d = ledger.snapshot(device);
    CHECK(d.creates == 2 * kHandles);
    CHECK(d.releases == 2 * kHandles);
    CHECK(d.maps == 4 * kHandles);
    CHECK(d.unmaps == 4 * kHandles);
    CHECK(d.physical_bytes.current == 0);
    CHECK(d.physical_bytes.total == 2 * thread_total);
    CHECK(d.physical_bytes.peak >= batch_peak);  // two threads' batches may overlap
    CHECK(d.physical_bytes.peak <= 2 * batch_peak);
    CHECK(d.mapped_bytes.current == 0);
    CHECK(d.mapped_bytes.total == 2 * thread_total);
    CHECK(d.released_mapped_bytes.current == 0);
    CHECK(ledger.top_sites(device, 100).empty());
  }
  const auto unknown = ledger.unknowns();
  CHECK(unknown.unknown_releases == 0);
  CHECK(unknown.unknown_maps == 0);
  CHECK(unknown.unknown_unmaps == 0);
  CHECK(unknown.replaced_entries == 0);
  CHECK(ledger.live_handles() == 0);
  CHECK(ledger.live_mappings() == 0);
}
