// Peaks with call sites, for the log's peak samples and the exit record's peak consumers: two
// functions hold 32 MiB for 300 ms (three 8 MiB weights, one 8 MiB activation), everything is
// freed, then a third function holds 4 MiB for 100 ms before the exit. Prints each phase.
//   peak_sites
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

namespace {

constexpr size_t kMiB = size_t{1} << 20;
std::vector<void*> g_held;

__attribute__((noinline)) bool load_weights() {
  for (int i = 0; i < 3; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, 8 * kMiB) != cudaSuccess) return false;
    g_held.push_back(p);
  }
  return true;
}

__attribute__((noinline)) bool make_activations() {
  void* p = nullptr;
  if (cudaMalloc(&p, 8 * kMiB) != cudaSuccess) return false;
  g_held.push_back(p);
  return true;
}

__attribute__((noinline)) bool scratch() {
  void* p = nullptr;
  if (cudaMalloc(&p, 4 * kMiB) != cudaSuccess) return false;
  usleep(100 * 1000);
  return cudaFree(p) == cudaSuccess;
}

}  // namespace

int main() {
  if (!load_weights() || !make_activations()) {
    std::printf("allocation failed\n");
    return 1;
  }
  std::printf("holding %zu blocks\n", g_held.size());
  usleep(300 * 1000);  // several of the shim's 50 ms looks see the peak
  for (void* p : g_held) cudaFree(p);
  g_held.clear();
  if (!scratch()) return 1;
  std::printf("done\n");
  return 0;
}
