#include "native_ledger.h"

#include "atomic_max.h"

namespace poolshim {

std::uint64_t NativeLedger::set_cap_once(int device, std::uint64_t cap) {
  if (!valid(device)) return 0;
  Device& d = devices_[device];
  bool expected = false;
  if (d.cap_set.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
    d.cap.store(cap, std::memory_order_release);
  }
  return d.cap.load(std::memory_order_acquire);
}

std::uint64_t NativeLedger::cap(int device) const {
  return valid(device) ? devices_[device].cap.load(std::memory_order_acquire) : 0;
}

bool NativeLedger::cap_known(int device) const {
  return !valid(device) || devices_[device].cap_set.load(std::memory_order_acquire);
}

bool NativeLedger::admit(int device, std::uint64_t bytes) {
  if (!valid(device)) return true;
  Device& d = devices_[device];
  const std::uint64_t cap = d.cap.load(std::memory_order_relaxed);
  if (cap == 0) {
    d.live.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  // Under a cap two threads must not both pass its edge: the check and the count are one step.
  std::uint64_t seen = d.live.load(std::memory_order_relaxed);
  do {
    if (bytes > cap || seen > cap - bytes) return false;
  } while (!d.live.compare_exchange_weak(seen, seen + bytes, std::memory_order_relaxed));
  return true;
}

void NativeLedger::release(int device, std::uint64_t bytes) {
  if (valid(device)) devices_[device].live.fetch_sub(bytes, std::memory_order_relaxed);
}

void NativeLedger::made(int device) {
  if (!valid(device)) return;
  Device& d = devices_[device];
  d.count.fetch_add(1, std::memory_order_relaxed);
  raise_to(d.peak, d.live.load(std::memory_order_relaxed));
}

void NativeLedger::freed(int device) {
  if (valid(device)) devices_[device].count.fetch_sub(1, std::memory_order_relaxed);
}

std::uint64_t NativeLedger::live_bytes(int device) const {
  return valid(device) ? devices_[device].live.load(std::memory_order_relaxed) : 0;
}

std::uint64_t NativeLedger::peak_bytes(int device) const {
  return valid(device) ? devices_[device].peak.load(std::memory_order_relaxed) : 0;
}

std::uint64_t NativeLedger::live_count(int device) const {
  return valid(device) ? devices_[device].count.load(std::memory_order_relaxed) : 0;
}

void NativeLedger::note_context(int device, CUcontext context) {
  if (!valid(device) || context == nullptr) return;
  CUcontext none = nullptr;
  devices_[device].context.compare_exchange_strong(none, context, std::memory_order_acq_rel);
}

CUcontext NativeLedger::context(int device) const {
  return valid(device) ? devices_[device].context.load(std::memory_order_acquire) : nullptr;
}

void NativeLedger::forget_device(int device) {
  if (!valid(device)) return;
  Device& d = devices_[device];
  d.live.store(0, std::memory_order_relaxed);
  d.count.store(0, std::memory_order_relaxed);
  d.context.store(nullptr, std::memory_order_release);
}

}  // namespace poolshim
