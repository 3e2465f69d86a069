// The C++ half of the watching thunks (per_thread_watch.h; the thunks are per_thread_watch.S).
#include "per_thread_watch.h"

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>

#include "per_thread_names.h"
#include "real_driver.h"
#include "shim.h"

// The ex thunk reads the stream at this offset of the configuration.
static_assert(offsetof(CUlaunchConfig, hStream) == 32, "per_thread_watch.S reads hStream at 32");

namespace {

// Where a thunk finds the stream (per_thread_watch.S's kinds). kPerThread: any call counts.
// A named legacy thunk's kind is that of its exact symbol (cuda.h's last declaration of it).
enum Kind : unsigned { kPerThread, kA0, kA1, kA2, kA3, kA4, kA5, kA7, kA8, kEx, kKinds };
constexpr Kind kind_pt = kPerThread, kind_a0 = kA0, kind_a1 = kA1, kind_a2 = kA2, kind_a3 = kA3,
               kind_a4 = kA4, kind_a5 = kA5, kind_a7 = kA7, kind_a8 = kA8, kind_ex = kEx;

struct Named {
  const char* name;
  Kind kind;
};

#define POOLSHIM_WATCH_PT(name) {#name, kPerThread},
#define POOLSHIM_WATCH_LEGACY(name, kind) {#name, kind_##kind},
constexpr Named kNamed[] = {POOLSHIM_PER_THREAD_WATCHED(POOLSHIM_WATCH_PT)
                                POOLSHIM_LEGACY_STREAM_WATCHED(POOLSHIM_WATCH_LEGACY)};
#undef POOLSHIM_WATCH_PT
#undef POOLSHIM_WATCH_LEGACY
constexpr unsigned kNamedCount = sizeof(kNamed) / sizeof(kNamed[0]);

// The slot pools after the named thunks, as per_thread_watch.S lays them out.
constexpr unsigned kPoolSize[kKinds] = {64, 16, 16, 16, 16, 16, 16, 16, 16, 16};
constexpr unsigned pool_first(Kind k) {
  unsigned first = kNamedCount;
  for (unsigned i = 0; i < k; ++i) first += kPoolSize[i];
  return first;
}
constexpr unsigned kThunks = pool_first(kKinds);

std::atomic<unsigned> claimed[kKinds];

// What a named thunk runs when libcuda has no such function: the driver's answer for it.
CUresult not_found() {
  return CUDA_ERROR_NOT_FOUND;
}

}  // namespace

// Read by the thunks with plain loads (x86-64: acquire), written here with release stores.
extern "C" {
__attribute__((visibility("hidden"))) void* poolshim_watch_targets[kThunks];
__attribute__((visibility("hidden"))) unsigned char poolshim_watch_seen;
__attribute__((visibility("hidden"))) extern void* const poolshim_watch_thunks[kThunks];
__attribute__((visibility("hidden"))) void* poolshim_watch_first_use(unsigned index, int mark);
}

namespace {

void* target(unsigned index) {
  return __atomic_load_n(&poolshim_watch_targets[index], __ATOMIC_ACQUIRE);
}

void set_target(unsigned index, void* real) {
  __atomic_store_n(&poolshim_watch_targets[index], real, __ATOMIC_RELEASE);
}

void* driver_export(const char* name) {
  void* library = poolshim::shim::driver_library();
  return library != nullptr ? poolshim::shim::real_dlsym()(library, name) : nullptr;
}

// A thunk of kind `kind` for `real`: the one already standing for it, else a new slot; null
// when the pool is used up. Two threads handing out one function at once may take a slot each.
void* slot_for(Kind kind, void* real) {
  const unsigned first = pool_first(kind);
  unsigned taken = claimed[kind].load(std::memory_order_acquire);
  for (unsigned i = 0; i < std::min(taken, kPoolSize[kind]); ++i) {
    if (target(first + i) == real) return poolshim_watch_thunks[first + i];
  }
  // The count stops at the pool's size: a slot, once handed out, keeps its target.
  do {
    if (taken >= kPoolSize[kind]) return nullptr;
  } while (!claimed[kind].compare_exchange_weak(taken, taken + 1, std::memory_order_acq_rel));
  set_target(first + taken, real);
  return poolshim_watch_thunks[first + taken];
}

// Sets thunk `i`'s target to `real` unless it has one; returns the target it has.
void* settle_target(unsigned i, void* real) {
  void* expected = nullptr;
  if (__atomic_compare_exchange_n(&poolshim_watch_targets[i], &expected, real, false,
                                  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    return real;
  }
  return expected;
}

// The named thunk `i` for libcuda's export `real`, or null when it stands for another function.
void* named_for(unsigned i, void* real) {
  return settle_target(i, real) == real ? poolshim_watch_thunks[i] : nullptr;
}

// `name` is `base` or one of its versions (`base_v2`...).
bool variant_of(const char* name, const char* base, std::size_t base_length) {
  if (std::strncmp(name, base, base_length) != 0) return false;
  const char* rest = name + base_length;
  if (*rest == '\0') return true;
  if (rest[0] != '_' || rest[1] != 'v' || rest[2] == '\0') return false;
  for (const char* c = rest + 2; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  return true;
}

}  // namespace

// The slow path of thunk `index`. mark 0: the thunk had no target; resolve a named one (libcuda's
// export, or not_found) and start the thunk again, which then checks the call. mark 1: the call
// uses the per-thread default stream; mark the process (before the call reaches the driver; the
// fast path starts only once the mark is made) and go to the target.
void* poolshim_watch_first_use(unsigned index, int mark) {
  if (mark == 0) {
    if (target(index) == nullptr) {
      void* real = index < kNamedCount ? driver_export(kNamed[index].name) : nullptr;
      settle_target(index, real != nullptr ? real : reinterpret_cast<void*>(&not_found));
    }
    return poolshim_watch_thunks[index];
  }
  if (__atomic_load_n(&poolshim_watch_seen, __ATOMIC_ACQUIRE) == 0) {
    poolshim::shim::note_stream_beyond_legacy();
    __atomic_store_n(&poolshim_watch_seen, 1, __ATOMIC_RELEASE);
  }
  return target(index);
}

namespace poolshim::shim {

void* per_thread_watch(const char* symbol, void* real) {
  // libcuda's own export (`symbol`[_vN]_ptsz or _ptds): its named thunk; else a slot.
  const std::size_t length = std::strlen(symbol);
  for (unsigned i = 0; i < kNamedCount; ++i) {
    if (kNamed[i].kind != kPerThread) continue;
    const char* name = kNamed[i].name;
    const std::size_t n = std::strlen(name);
    if (n < length + 5 || std::strncmp(name, symbol, length) != 0) continue;
    const std::string base(name, n - 5);  // without _ptsz / _ptds
    if (!variant_of(base.c_str(), symbol, length) || driver_export(name) != real) continue;
    if (void* thunk = named_for(i, real)) return thunk;
  }
  return slot_for(kPerThread, real);
}

Watch legacy_stream_watch(const char* symbol, void* real) {
  const std::size_t length = std::strlen(symbol);
  unsigned variants = 0;
  Kind kind = kPerThread;
  bool one_place = true;  // every variant of the name has its stream in the same place
  for (unsigned i = 0; i < kNamedCount; ++i) {
    if (kNamed[i].kind == kPerThread || !variant_of(kNamed[i].name, symbol, length)) continue;
    if (variants++ > 0 && kNamed[i].kind != kind) one_place = false;
    kind = kNamed[i].kind;
    if (driver_export(kNamed[i].name) == real) {
      if (void* thunk = named_for(i, real)) return {Watch::watched, thunk};
    }
  }
  if (variants == 0) return {Watch::not_watched, real};
  // A variant libcuda does not export under a name: where the versions disagree on the place
  // of the stream, no thunk can check it.
  void* thunk = one_place ? slot_for(kind, real) : nullptr;
  return thunk != nullptr ? Watch{Watch::watched, thunk} : Watch{Watch::exhausted, real};
}

bool watched_name(const char* name) {
  for (const Named& n : kNamed) {
    if (std::strcmp(n.name, name) == 0) return true;
  }
  return false;
}

Watch watch_by_name(const char* name, void* real) {
  for (unsigned i = 0; i < kNamedCount; ++i) {
    if (std::strcmp(kNamed[i].name, name) != 0) continue;
    void* thunk = named_for(i, real);
    return thunk != nullptr ? Watch{Watch::watched, thunk} : Watch{Watch::exhausted, real};
  }
  return {Watch::not_watched, real};
}

}  // namespace poolshim::shim
