// The bundled demo: a "legacy" CUDA program of the kind poolshim is for. Every time step it
// allocates its scratch buffers with cudaMalloc, uses them, and frees them with cudaFree, the
// way much older simulation code does; it also forgets to free one buffer, which the exit
// record reports as a leak. Its output (checksums) is the same with and without the shim.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common.h"

namespace {

// One step: upload a field, derive scratch buffers from it on the device (copies and sets),
// read the result back and fold it into a checksum on the host.
std::uint64_t step(int t, const std::vector<std::uint32_t>& field) {
  const size_t n = field.size();
  const size_t bytes = n * sizeof(std::uint32_t);
  void* d_field = nullptr;
  CHECK_CUDA(cudaMalloc(&d_field, bytes));
  CHECK_CUDA(cudaMemcpy(d_field, field.data(), bytes, cudaMemcpyHostToDevice));

  // Scratch buffers whose sizes vary with the step, as adaptive codes' do.
  std::vector<void*> scratch;
  std::vector<size_t> sizes;
  for (int k = 0; k < 6; ++k) {
    const size_t s = bytes / (k + 1) + static_cast<size_t>((t * 7919 + k * 104729) % 65536);
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, s));
    CHECK_CUDA(cudaMemset(p, (t + k) & 0xff, s));
    const size_t copy = (s < bytes ? s : bytes) / 2;
    CHECK_CUDA(cudaMemcpy(p, d_field, copy, cudaMemcpyDeviceToDevice));
    scratch.push_back(p);
    sizes.push_back(s);
  }
  const size_t pick = static_cast<size_t>(t) % scratch.size();
  const size_t readable = std::min(sizes[pick], bytes / 2) / 4;
  std::vector<std::uint32_t> back(readable);
  CHECK_CUDA(cudaMemcpy(back.data(), scratch[pick], readable * 4, cudaMemcpyDeviceToHost));
  std::uint64_t sum = 0;
  for (size_t i = 0; i < back.size(); i += 97) sum = sum * 1099511628211ULL + back[i];
  for (void* p : scratch) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(d_field));
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const size_t elements = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (size_t{4} << 20);
  int device_count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&device_count));
  std::vector<std::uint32_t> field(elements);
  for (size_t i = 0; i < elements; ++i) field[i] = static_cast<std::uint32_t>(i * 2654435761u);

  // The forgotten buffer: allocated once, never freed.
  void* forgotten = nullptr;
  CHECK_CUDA(cudaMalloc(&forgotten, 3u << 20));

  const auto start = std::chrono::steady_clock::now();
  std::uint64_t total = 0;
  for (int t = 0; t < steps; ++t) {
    const std::uint64_t s = step(t, field);
    total ^= s + static_cast<std::uint64_t>(t);
    if (t % 50 == 0 || t == steps - 1) {
      std::printf("step %4d checksum %016llx\n", t, static_cast<unsigned long long>(s));
    }
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("demo: %d steps, 7 allocations each, final checksum %016llx\n", steps,
              static_cast<unsigned long long>(total));
  std::fprintf(stderr, "demo: %.1f ms (%.3f ms per step)\n", ms, ms / steps);
  return 0;
}
