// The runtime API's edge cases, one line each: error codes, sticky "last error", data. Run
// with and without the shim, the output must be identical (DESIGN §3: errors look native).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

size_t g_total = 0;

bool fill_and_check(void* dev, size_t bytes, unsigned char seed) {
  std::vector<unsigned char> host(bytes), back(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(seed + i * 7);
  if (cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return false;
  if (cudaMemcpy(back.data(), dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  return std::memcmp(host.data(), back.data(), bytes) == 0;
}

void malloc_zero() {
  void* p = reinterpret_cast<void*>(0x1);
  const cudaError_t e = cudaMalloc(&p, 0);
  std::printf("malloc_zero: %s ptr_is_null=%d last=%s\n", name_of(e), p == nullptr,
              name_of(cudaGetLastError()));
}

void malloc_null_out() {
  const cudaError_t e = cudaMalloc(nullptr, 256);
  std::printf("malloc_null_out: %s last=%s\n", name_of(e), name_of(cudaGetLastError()));
}

void free_null() {
  std::printf("free_null: %s\n", name_of(cudaFree(nullptr)));
}

void roundtrip() {
  void* p = nullptr;
  const cudaError_t a = cudaMalloc(&p, 1 << 20);
  const bool ok = a == cudaSuccess && fill_and_check(p, 1 << 20, 3);
  const cudaError_t f = cudaFree(p);
  std::printf("roundtrip: malloc=%s data_ok=%d free=%s\n", name_of(a), ok, name_of(f));
}

void many_sizes() {
  // Sizes around the pool's rounding and chunk boundaries.
  const size_t sizes[] = {1,
                          255,
                          256,
                          257,
                          511,
                          512,
                          513,
                          4095,
                          4096,
                          65537,
                          (2u << 20) - 1,
                          2u << 20,
                          (2u << 20) + 1,
                          5u << 20};
  bool all_ok = true;
  std::vector<void*> ptrs;
  for (size_t s : sizes) {
    void* p = nullptr;
    if (cudaMalloc(&p, s) != cudaSuccess) {
      all_ok = false;
      continue;
    }
    all_ok = all_ok && (reinterpret_cast<std::uintptr_t>(p) % 256 == 0) && fill_and_check(p, s, 11);
    ptrs.push_back(p);
  }
  cudaError_t f = cudaSuccess;
  for (void* p : ptrs) {
    const cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) f = e;
  }
  std::printf("many_sizes: all_ok=%d aligned_256=%d frees=%s\n", all_ok, all_ok, name_of(f));
}

void double_free() {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  const cudaError_t first = cudaFree(p);
  const cudaError_t second = cudaFree(p);
  std::printf("double_free: first=%s second=%s last=%s\n", name_of(first), name_of(second),
              name_of(cudaGetLastError()));
}

void free_host_pointer() {
  void* host = std::malloc(4096);
  const cudaError_t e = cudaFree(host);
  std::printf("free_host_pointer: %s last=%s\n", name_of(e), name_of(cudaGetLastError()));
  std::free(host);
}

void free_pinned_host() {
  void* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, 4096));
  const cudaError_t e = cudaFree(pinned);
  std::printf("free_pinned_host: %s last=%s\n", name_of(e), name_of(cudaGetLastError()));
  CHECK_CUDA(cudaFreeHost(pinned));
}

void free_interior() {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 16));
  const cudaError_t e = cudaFree(static_cast<char*>(p) + 256);
  const cudaError_t last = cudaGetLastError();
  const cudaError_t f = cudaFree(p);
  std::printf("free_interior: %s last=%s then_free=%s\n", name_of(e), name_of(last), name_of(f));
}

void oom_huge() {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, size_t{1} << 50);  // 1 PiB
  const cudaError_t last = cudaGetLastError();
  const cudaError_t cleared = cudaGetLastError();
  std::printf("oom_huge: %s last=%s cleared=%s\n", name_of(e), name_of(last), name_of(cleared));
}

void oom_then_recover() {
  // Hold about 3/4 of the device in 12 blocks, free them, then ask for half of it in one
  // piece. Natively the memory went back to the driver; under the shim the freed blocks must
  // serve it (merged in the paged arena) or be trimmed for a retry, and leave no error behind.
  const size_t block = g_total / 16;
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, block) == cudaSuccess) blocks.push_back(p);
  }
  for (void* p : blocks) CHECK_CUDA(cudaFree(p));
  void* big = nullptr;
  const cudaError_t e = cudaMalloc(&big, g_total / 2);
  const cudaError_t last = cudaGetLastError();
  const bool ok = e == cudaSuccess && fill_and_check(big, 1 << 20, 5);
  if (e == cudaSuccess) CHECK_CUDA(cudaFree(big));
  std::printf("oom_then_recover: held=%zu big=%s data_ok=%d last=%s\n", blocks.size(), name_of(e),
              ok, name_of(last));
}

void memgetinfo_after_free() {
  size_t free_before = 0, total = 0, free_after = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, total / 8));
  size_t free_during = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_during, &total));
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaMemGetInfo(&free_after, &total));
  const size_t slack = 64u << 20;
  const bool restored = free_after + slack >= free_before && free_after <= free_before + slack;
  const bool dropped = free_during + total / 8 <= free_before + slack;
  std::printf("memgetinfo_after_free: dropped_while_held=%d restored_after_free=%d\n", dropped,
              restored);
}

void async_roundtrip() {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  const cudaError_t a = cudaMallocAsync(&p, 1 << 20, s);
  std::vector<unsigned char> back(1 << 20, 0);
  cudaError_t m = cudaErrorUnknown, c = cudaErrorUnknown, f = cudaErrorUnknown;
  if (a == cudaSuccess) {
    m = cudaMemsetAsync(p, 0x5a, 1 << 20, s);
    c = cudaMemcpyAsync(back.data(), p, 1 << 20, cudaMemcpyDeviceToHost, s);
    f = cudaFreeAsync(p, s);
  }
  const cudaError_t sync = cudaStreamSynchronize(s);
  bool ok = true;
  for (unsigned char b : back) ok = ok && b == 0x5a;
  std::printf("async_roundtrip: malloc=%s memset=%s copy=%s free=%s sync=%s data_ok=%d\n",
              name_of(a), name_of(m), name_of(c), name_of(f), name_of(sync), ok);
  CHECK_CUDA(cudaStreamDestroy(s));
}

void async_default_stream() {
  void* p = nullptr;
  const cudaError_t a = cudaMallocAsync(&p, 4096, nullptr);
  const bool ok = a == cudaSuccess && cudaStreamSynchronize(nullptr) == cudaSuccess &&
                  fill_and_check(p, 4096, 9);
  const cudaError_t f = cudaFreeAsync(p, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("async_default_stream: malloc=%s data_ok=%d free=%s sync=%s\n", name_of(a), ok,
              name_of(f), name_of(sync));
}

void async_zero_and_null() {
  void* p = reinterpret_cast<void*>(0x1);
  const cudaError_t zero = cudaMallocAsync(&p, 0, nullptr);
  const cudaError_t zero_last = cudaGetLastError();
  const cudaError_t null_out = cudaMallocAsync(nullptr, 64, nullptr);
  const cudaError_t null_last = cudaGetLastError();
  const cudaError_t free_null = cudaFreeAsync(nullptr, nullptr);
  const cudaError_t free_null_last = cudaGetLastError();
  std::printf("async_zero_and_null: zero=%s/%s null_out=%s/%s free_null=%s/%s\n", name_of(zero),
              name_of(zero_last), name_of(null_out), name_of(null_last), name_of(free_null),
              name_of(free_null_last));
}

void free_async_foreign() {
  void* host = std::malloc(256);
  const cudaError_t e = cudaFreeAsync(host, nullptr);
  const cudaError_t last = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("free_async_foreign: %s last=%s sync=%s\n", name_of(e), name_of(last), name_of(sync));
  std::free(host);
}

void mixed_sync_async_free() {
  // Allocated with cudaMallocAsync, freed with cudaFree (allowed natively), and the reverse.
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMallocAsync(&a, 8192, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(nullptr));
  const cudaError_t fa = cudaFree(a);
  CHECK_CUDA(cudaMalloc(&b, 8192));
  const cudaError_t fb = cudaFreeAsync(b, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("mixed_sync_async_free: free_of_async=%s freeasync_of_sync=%s sync=%s\n", name_of(fa),
              name_of(fb), name_of(sync));
}

void device_reset_then_alloc() {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  const cudaError_t r = cudaDeviceReset();
  void* q = nullptr;
  const cudaError_t a = cudaMalloc(&q, 1 << 20);
  const bool ok = a == cudaSuccess && fill_and_check(q, 1 << 20, 21);
  const cudaError_t f = cudaFree(q);
  std::printf("device_reset_then_alloc: reset=%s malloc=%s data_ok=%d free=%s\n", name_of(r),
              name_of(a), ok, name_of(f));
}

void capture_global() {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const cudaError_t b = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  void* p = nullptr;
  const cudaError_t m = cudaMalloc(&p, 4096);
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &g);
  const cudaError_t last = cudaGetLastError();
  if (g != nullptr) cudaGraphDestroy(g);
  if (m == cudaSuccess) cudaFree(p);
  cudaGetLastError();
  std::printf("capture_global: begin=%s malloc=%s end=%s graph=%d last=%s\n", name_of(b),
              name_of(m), name_of(e), g != nullptr, name_of(last));
  CHECK_CUDA(cudaStreamDestroy(s));
}

void capture_relaxed() {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const cudaError_t b = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  void* p = nullptr;
  const cudaError_t m = cudaMalloc(&p, 4096);
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &g);
  const cudaError_t f = m == cudaSuccess ? cudaFree(p) : cudaErrorUnknown;
  if (g != nullptr) cudaGraphDestroy(g);
  std::printf("capture_relaxed: begin=%s malloc=%s end=%s free=%s last=%s\n", name_of(b),
              name_of(m), name_of(e), name_of(f), name_of(cudaGetLastError()));
  CHECK_CUDA(cudaStreamDestroy(s));
}

void capture_async_alloc() {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const cudaError_t b = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  void* p = nullptr;
  const cudaError_t m = cudaMallocAsync(&p, 4096, s);
  const cudaError_t f = m == cudaSuccess ? cudaFreeAsync(p, s) : cudaErrorUnknown;
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &g);
  if (g != nullptr) cudaGraphDestroy(g);
  std::printf("capture_async_alloc: begin=%s malloc=%s free=%s end=%s graph=%d last=%s\n",
              name_of(b), name_of(m), name_of(f), name_of(e), g != nullptr,
              name_of(cudaGetLastError()));
  CHECK_CUDA(cudaStreamDestroy(s));
}

void cross_device_free() {
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("cross_device_free: skipped (one device)\n");
    return;
  }
  CHECK_CUDA(cudaSetDevice(0));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  CHECK_CUDA(cudaSetDevice(1));
  const cudaError_t f = cudaFree(p);
  CHECK_CUDA(cudaSetDevice(0));
  std::printf("cross_device_free: %s last=%s\n", name_of(f), name_of(cudaGetLastError()));
}

}  // namespace

int main() {
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  size_t free = 0;
  CHECK_CUDA(cudaMemGetInfo(&free, &g_total));
  std::printf("devices: %d\n", count);
  malloc_zero();
  malloc_null_out();
  free_null();
  roundtrip();
  many_sizes();
  double_free();
  free_host_pointer();
  free_pinned_host();
  free_interior();
  oom_huge();
  oom_then_recover();
  memgetinfo_after_free();
  async_roundtrip();
  async_default_stream();
  async_zero_and_null();
  free_async_foreign();
  mixed_sync_async_free();
  capture_global();
  capture_relaxed();
  capture_async_alloc();
  cross_device_free();
  device_reset_then_alloc();
  std::printf("final_last_error: %s\n", name_of(cudaGetLastError()));
  return 0;
}
