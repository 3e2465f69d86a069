// The cost of one call-site capture (POOLSHIM_BACKTRACE=8), in ns, from a loop at one call
// site, with the loop at the top of the stack and under ~20 more frames (deep stacks, as in
// Python): glibc's backtrace(n + 16) (what capture_frames did before), capture_frames
// (_Unwind_Backtrace, stopping at n frames), and capture_site answered from its per-thread
// cache (the loop's normal case).
//   backtrace_bench [captures_per_measure]
#include <execinfo.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "call_sites.h"

using namespace poolshim;

namespace {

constexpr int kFrames = 8;

// capture_frames as it was: backtrace(max_frames + 16), then frame 0 and skipped frames out.
__attribute__((noinline)) int old_capture_frames(std::uintptr_t* out, int max_frames) {
  void* raw[kMaxCallSiteFrames + 16];
  const int got = backtrace(raw, max_frames + 16);
  int n = 0;
  for (int i = 1; i < got && n < max_frames; ++i)
    out[n++] = reinterpret_cast<std::uintptr_t>(raw[i]);
  return n;
}

template <typename F>
double ns_per(int count, F&& capture) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    capture();
    asm volatile("" ::: "memory");
  }
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / count;
}

__attribute__((noinline)) void measure(int depth, int count, CallSiteTable& table) {
  std::uintptr_t frames[kMaxCallSiteFrames];
  std::uint32_t sink = 0;
  const double old_ns = ns_per(count, [&] { sink += old_capture_frames(frames, kFrames); });
  const double new_ns = ns_per(count, [&] { sink += capture_frames(frames, kFrames, 0, 0); });
  const SiteCacheCounts before = site_cache_counts();
  const double site_ns = ns_per(count, [&] { sink += capture_site(table, kFrames, 0, 0); });
  const SiteCacheCounts after = site_cache_counts();
  std::printf(
      "depth=%d frames=%d old_backtrace_ns=%.1f capture_frames_ns=%.1f capture_site_hit_ns=%.1f "
      "capture_site_hits=%llu capture_site_unwinds=%llu (sink %u)\n",
      depth, kFrames, old_ns, new_ns, site_ns,
      static_cast<unsigned long long>(after.hits - before.hits),
      static_cast<unsigned long long>(after.unwinds - before.unwinds), sink);
}

__attribute__((noinline)) void recurse(int left, int depth, int count, CallSiteTable& table) {
  if (left == 0) {
    measure(depth, count, table);
  } else {
    recurse(left - 1, depth, count, table);
  }
  asm volatile("" ::: "memory");
}

}  // namespace

int main(int argc, char** argv) {
  const int count = argc > 1 ? std::atoi(argv[1]) : 200000;
  if (count <= 0) return 1;
  warm_up_unwinder();
  CallSiteTable table;
  for (int depth : {0, 20}) recurse(depth, depth, count, table);
  return 0;
}
