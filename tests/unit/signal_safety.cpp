// Issue 12, defect 9: call-site capture (POOLSHIM_BACKTRACE) on a thread's first use must be
// async-signal-safe, because a hook can run in a signal handler: it must not allocate (a
// signal that interrupted malloc would deadlock on its lock). This program replaces malloc and
// its relatives with counting wrappers, so it is an executable of its own; it is not built for
// sanitizer jobs, whose runtimes own malloc (TSan's signal-unsafe-call check covers it there).
//
// Exit status 0 and one line "first captures allocated 0 times ..." when it holds.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "call_sites.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
__thread int t_counting __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<int> g_allocations{0};
void note() {
  if (t_counting != 0) g_allocations.fetch_add(1);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) {
  note();
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) {
  note();
  return __libc_realloc(p, n);
}
void* memalign(size_t alignment, size_t n) {
  note();
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, size_t alignment, size_t n) {
  note();
  *out = __libc_memalign(alignment, n);
  return *out == nullptr ? ENOMEM : 0;
}
void* aligned_alloc(size_t alignment, size_t n) {
  note();
  return __libc_memalign(alignment, n);
}
void free(void* p) {
  __libc_free(p);
}
}

namespace {

poolshim::CallSiteTable* g_table = nullptr;
std::uint32_t g_ids[2] = {};
poolshim::SiteCacheCounts g_counts[2];

// The capture the shim makes in a hook, counted; the second one must be a cache hit.
void capture_twice(int slot) {
  t_counting = 1;
  std::uint32_t ids[2] = {};
#pragma GCC unroll 1
  for (volatile int i = 0; i < 2; ++i) ids[i] = poolshim::capture_site(*g_table, 6, 0, 0);
  t_counting = 0;
  g_ids[slot] = ids[0] == ids[1] ? ids[0] : 0;
  g_counts[slot] = poolshim::site_cache_counts();
}

void on_signal(int) {
  capture_twice(1);
}

void* first_capture_in_a_signal_handler(void*) {
  // The thread's very first capture is in the handler (raise runs it on this thread).
  raise(SIGUSR1);
  return nullptr;
}

void* first_capture(void*) {
  capture_twice(0);
  return nullptr;
}

}  // namespace

int main() {
  poolshim::warm_up_unwinder();  // as the shim does at start, outside any hook
  poolshim::CallSiteTable table(1024);
  g_table = &table;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGUSR1, &sa, nullptr);
  pthread_t t;
  pthread_create(&t, nullptr, first_capture, nullptr);
  pthread_join(t, nullptr);
  pthread_create(&t, nullptr, first_capture_in_a_signal_handler, nullptr);
  pthread_join(t, nullptr);
  const int allocations = g_allocations.load();
  std::printf(
      "first captures allocated %d times; ids %u %u; thread 1: %llu hits %llu unwinds; "
      "thread 2: %llu hits %llu unwinds\n",
      allocations, g_ids[0], g_ids[1], static_cast<unsigned long long>(g_counts[0].hits),
      static_cast<unsigned long long>(g_counts[0].unwinds),
      static_cast<unsigned long long>(g_counts[1].hits),
      static_cast<unsigned long long>(g_counts[1].unwinds));
  // The cache must have been set up (a hit), not merely skipped.
  const bool ok = allocations == 0 && g_ids[0] != 0 && g_ids[1] != 0 && g_counts[0].hits == 1 &&
                  g_counts[0].unwinds == 1 && g_counts[1].unwinds >= 1;
  return ok ? 0 : 1;
}
