#include "arena_claims.h"

#include <pthread.h>

#include <cstdint>

namespace poolshim {

namespace {

thread_local int t_arena = -1;

void give_back(void* value) {
  // The key's value is the arena + 1 (a null value runs no destructor).
  arena_claims().release(static_cast<int>(reinterpret_cast<std::intptr_t>(value)) - 1);
}

// Made at load time, before any hook runs. glibc keeps the values of keys below 32
// (PTHREAD_KEY_2NDLEVEL_SIZE) in the thread descriptor: pthread_setspecific of such a key
// neither allocates nor locks. With a higher key a thread's claim is never given back (its
// arena is then shared with later threads: slower, never wrong).
struct ThreadExitKey {
  pthread_key_t key{};
  bool usable = false;
  ThreadExitKey() {
    usable = pthread_key_create(&key, &give_back) == 0 && static_cast<unsigned long>(key) < 32;
  }
};
const ThreadExitKey g_thread_exit;

}  // namespace

ArenaClaims::ArenaClaims(int count) : count_(count < kMaxArenas ? count : kMaxArenas) {}

int ArenaClaims::claim() {
  if (count_ < 2) return 0;
  // Fewest holders first: try each arena at 0 holders, then at 1, and so on. A claim that
  // loses a race moves on; the loop ends because the levels rise without bound.
  for (int level = 0;; ++level) {
    for (int i = 1; i < count_; ++i) {
      int expected = level;
      if (holders_[static_cast<std::size_t>(i)].compare_exchange_strong(
              expected, level + 1, std::memory_order_acq_rel)) {
        return i;
      }
    }
  }
}

void ArenaClaims::release(int arena) {
  if (arena < 1 || arena >= count_) return;
  std::atomic<int>& h = holders_[static_cast<std::size_t>(arena)];
  int n = h.load(std::memory_order_relaxed);
  while (n > 0 && !h.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
}

int ArenaClaims::holders(int arena) const {
  if (arena < 1 || arena >= count_) return 0;
  return holders_[static_cast<std::size_t>(arena)].load(std::memory_order_acquire);
}

ArenaClaims& arena_claims() {
  static ArenaClaims claims(kHeapArenas);  // constant-initialized: no guard after the first use
  return claims;
}

int thread_arena() {
  if (t_arena >= 0) return t_arena;
  const int arena = arena_claims().claim();
  if (g_thread_exit.usable) {
    pthread_setspecific(g_thread_exit.key,
                        reinterpret_cast<void*>(static_cast<std::intptr_t>(arena) + 1));
  }
  t_arena = arena;
  return arena;
}

int thread_arena_if_claimed() {
  return t_arena;
}

}  // namespace poolshim
