// NativeLedger (issue 15): the books of allocations the real function served.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "native_ledger.h"

using poolshim::NativeLedger;

TEST_CASE("native ledger: admitted bytes count per device, peak and count follow made and freed") {
  NativeLedger l;
  CHECK(l.admit(0, 1000));
  l.made(0);
  CHECK(l.admit(0, 500));
  l.made(0);
  CHECK(l.admit(1, 7));
  l.made(1);
  CHECK(l.live_bytes(0) == 1500);
  CHECK(l.live_count(0) == 2);
  CHECK(l.live_bytes(1) == 7);
  l.release(0, 1000);
  l.freed(0);
  CHECK(l.live_bytes(0) == 500);
  CHECK(l.live_count(0) == 1);
  CHECK(l.peak_bytes(0) == 1500);
  CHECK(l.peak_bytes(1) == 7);
}

TEST_CASE("native ledger: a cap refuses what would pass it and counts nothing for it") {
  NativeLedger l;
  CHECK(l.set_cap_once(0, 100) == 100);
  CHECK(l.set_cap_once(0, 5) == 100);  // the first one stays
  CHECK(l.admit(0, 60));
  CHECK_FALSE(l.admit(0, 41));
  CHECK(l.live_bytes(0) == 60);
  CHECK(l.admit(0, 40));  // exactly to the cap
  CHECK_FALSE(l.admit(0, 1));
  CHECK_FALSE(l.admit(0, ~std::uint64_t{0}));  // no overflow past the cap
  l.release(0, 60);
  CHECK(l.admit(0, 60));
  CHECK(l.live_bytes(0) == 100);
  CHECK(l.cap(1) == 0);
  CHECK(l.admit(1, std::uint64_t{1} << 50));  // no cap on device 1
}

TEST_CASE("native ledger: threads admitting at a cap's edge never pass it together") {
  NativeLedger l;
  l.set_cap_once(0, 1000);
  std::vector<std::thread> threads;
  std::atomic<int> admitted{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        if (l.admit(0, 3)) admitted.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(admitted.load() == 333);  // floor(1000 / 3)
  CHECK(l.live_bytes(0) == 999);
}

TEST_CASE("native ledger: the first context noted stays, a reset forgets it and the bytes") {
  NativeLedger l;
  auto* a = reinterpret_cast<CUcontext>(0x10);
  auto* b = reinterpret_cast<CUcontext>(0x20);
  l.note_context(0, a);
  l.note_context(0, b);
  CHECK(l.context(0) == a);
  l.set_cap_once(0, 64);
  CHECK(l.admit(0, 64));
  l.made(0);
  l.forget_device(0);
  CHECK(l.context(0) == nullptr);
  CHECK(l.live_bytes(0) == 0);
  CHECK(l.live_count(0) == 0);
  CHECK(l.cap(0) == 64);  // the cap is the option's, not the device's state
  CHECK(l.admit(0, 64));
}

TEST_CASE("native ledger: a device beyond 63 is ignored, never refused") {
  NativeLedger l;
  CHECK(l.admit(64, 10));
  CHECK(l.admit(-1, 10));
  CHECK(l.live_bytes(64) == 0);
  CHECK(l.set_cap_once(64, 5) == 0);
}
