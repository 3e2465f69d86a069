// Kernels and allocations together (GPU only). Each case prints what a correct program
// prints; a shim that reused memory too early would corrupt the data and change the output.
//   kernels_diff [selfcheck | fault | legacy_first_stream_nonblocking |
//   legacy_first_stream_blocking | per_thread_two_threads | pages_move | unmap_under_kernel]
#include <cuda.h>
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "common.h"

namespace {

// Spins for about `ns` nanoseconds, then fills `out` with `value`: still running when the
// host moves on, it writes late.
__global__ void late_fill(std::uint32_t* out, size_t n, std::uint32_t value,
                          unsigned long long ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

__global__ void fill(std::uint32_t* out, size_t n, std::uint32_t value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

__global__ void count_not(const std::uint32_t* in, size_t n, std::uint32_t value,
                          unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    local += in[i] != value;
  }
  if (local) atomicAdd(bad, local);
}

unsigned long long mismatches(const std::uint32_t* buf, size_t n, std::uint32_t value,
                              cudaStream_t s) {
  unsigned long long* bad = nullptr;
  CHECK_CUDA(cudaMallocHost(&bad, sizeof *bad));
  *bad = 0;
  count_not<<<264, 256, 0, s>>>(buf, n, value, bad);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaStreamSynchronize(s));
  const unsigned long long out = *bad;
  CHECK_CUDA(cudaFreeHost(bad));
  return out;
}

// Where the block freed behind a late writer is used again.
enum class Reuse { nonblocking, blocking, legacy };

// cudaFree while a kernel on another stream (non-blocking, or blocking) still writes the block:
// the free must wait (natively it synchronizes the device), or the reallocated block gets the
// late writes. The new block is written on a stream made after the cudaMalloc (non-blocking or
// blocking) or on stream 0: poolshim's legacy_reuse (mode ordered) orders each of them behind
// the legacy stream, which waits for every blocking writer.
void free_while_kernel_runs(unsigned int flags, Reuse reuse, const char* label) {
  const size_t n = size_t{16} << 20;  // 64 MiB
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, flags));
  unsigned long long corrupted = 0;
  for (int round = 0; round < 5; ++round) {
    std::uint32_t* a = nullptr;
    CHECK_CUDA(cudaMalloc(&a, n * 4));
    late_fill<<<264, 256, 0, s>>>(a, n, 0xAAAAAAAAu, 20000000ULL);  // writes after ~20 ms
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaFree(a));
    std::uint32_t* b = nullptr;
    CHECK_CUDA(cudaMalloc(&b, n * 4));
    cudaStream_t t = nullptr;  // stream 0 for Reuse::legacy
    if (reuse != Reuse::legacy) {
      CHECK_CUDA(cudaStreamCreateWithFlags(
          &t, reuse == Reuse::nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
    }
    fill<<<264, 256, 0, t>>>(b, n, 0x11111111u);
    CHECK_CUDA(cudaStreamSynchronize(t));
    CHECK_CUDA(cudaDeviceSynchronize());
    corrupted += mismatches(b, n, 0x11111111u, t);
    CHECK_CUDA(cudaFree(b));
    if (t != nullptr) CHECK_CUDA(cudaStreamDestroy(t));
  }
  std::printf("free_while_kernel_runs_%s: corrupted=%llu\n", label, corrupted);
  CHECK_CUDA(cudaStreamDestroy(s));
}

// A non-blocking stream destroyed while its kernel still writes a block, which is then freed
// and allocated again and written on a blocking stream: no non-blocking stream exists at the
// free, but the destroyed one's work must still be waited for.
void free_after_writer_stream_destroyed() {
  const size_t n = size_t{16} << 20;
  unsigned long long corrupted = 0;
  for (int round = 0; round < 5; ++round) {
    cudaStream_t w, t;
    CHECK_CUDA(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
    std::uint32_t* a = nullptr;
    CHECK_CUDA(cudaMalloc(&a, n * 4));
    late_fill<<<264, 256, 0, w>>>(a, n, 0xDDDDDDDDu, 20000000ULL);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamDestroy(w));  // returns at once; the kernel runs on
    CHECK_CUDA(cudaFree(a));
    std::uint32_t* b = nullptr;
    CHECK_CUDA(cudaMalloc(&b, n * 4));
    CHECK_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamDefault));
    fill<<<264, 256, 0, t>>>(b, n, 0x44444444u);
    CHECK_CUDA(cudaDeviceSynchronize());
    corrupted += mismatches(b, n, 0x44444444u, t);
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaStreamDestroy(t));
  }
  std::printf("free_after_writer_stream_destroyed: corrupted=%llu\n", corrupted);
}

// cudaMallocAsync/cudaFreeAsync on two streams: a block freed on s1 behind a late kernel may
// be reused on s2 only once the free is ordered (the pool's reuse policies guarantee that).
void async_two_streams() {
  const size_t n = size_t{8} << 20;
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  unsigned long long corrupted = 0;
  for (int round = 0; round < 5; ++round) {
    std::uint32_t* a = nullptr;
    CHECK_CUDA(cudaMallocAsync(&a, n * 4, s1));
    late_fill<<<264, 256, 0, s1>>>(a, n, 0xBBBBBBBBu, 10000000ULL);
    CHECK_CUDA(cudaFreeAsync(a, s1));
    std::uint32_t* b = nullptr;
    CHECK_CUDA(cudaMallocAsync(&b, n * 4, s2));
    fill<<<264, 256, 0, s2>>>(b, n, 0x22222222u);
    CHECK_CUDA(cudaStreamSynchronize(s2));
    CHECK_CUDA(cudaStreamSynchronize(s1));
    corrupted += mismatches(b, n, 0x22222222u, s2);
    CHECK_CUDA(cudaFreeAsync(b, s2));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("async_two_streams: corrupted=%llu\n", corrupted);
  CHECK_CUDA(cudaStreamDestroy(s1));
  CHECK_CUDA(cudaStreamDestroy(s2));
}

// The legacy default stream orders blocking streams: allocate, fill on stream 0, free, and
// reuse, with a checksum computed on the device.
void default_stream_checksum() {
  unsigned long long total = 0;
  for (int i = 0; i < 50; ++i) {
    const size_t n = 1000 + size_t(i) * 37777;
    std::uint32_t* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * 4));
    fill<<<64, 256>>>(p, n, 0x01010101u * (i % 200));
    total += n - mismatches(p, n, 0x01010101u * (i % 200), nullptr);
    CHECK_CUDA(cudaFree(p));
  }
  std::printf("default_stream_checksum: matching_words=%llu\n", total);
}

// An illegal access makes the context's error sticky: later calls, cudaFree included, must
// report it exactly as natively.
void sticky_error_after_fault() {
  std::uint32_t* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  fill<<<1, 32>>>(reinterpret_cast<std::uint32_t*>(0x10), 32, 1);  // invalid address
  const cudaError_t sync = cudaDeviceSynchronize();
  const cudaError_t f = cudaFree(p);
  void* q = nullptr;
  const cudaError_t m = cudaMalloc(&q, 4096);
  std::printf("sticky_error_after_fault: sync=%s free=%s malloc=%s last=%s\n",
              cudaGetErrorName(sync), cudaGetErrorName(f), cudaGetErrorName(m),
              cudaGetErrorName(cudaGetLastError()));
}

// Only the legacy stream in use (DESIGN §7, the legacy rule's first case): a block freed behind
// a late writer on stream 0 serves the next cudaMalloc at once, with no event. The first stream
// the program then makes must still be ordered behind that writer (a non-blocking one is not by
// itself), or its kernel would run while the late writes land. Run alone (no stream made before).
void legacy_only_then_first_stream(unsigned int flags, const char* label) {
  const size_t n = size_t{16} << 20;
  std::uint32_t* a = nullptr;
  CHECK_CUDA(cudaMalloc(&a, n * 4));
  late_fill<<<264, 256>>>(a, n, 0xEEEEEEEEu, 20000000ULL);  // stream 0, writes after ~20 ms
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFree(a));
  std::uint32_t* b = nullptr;
  CHECK_CUDA(cudaMalloc(&b, n * 4));
  cudaStream_t t;
  CHECK_CUDA(cudaStreamCreateWithFlags(&t, flags));
  fill<<<264, 256, 0, t>>>(b, n, 0x55555555u);
  CHECK_CUDA(cudaStreamSynchronize(t));
  CHECK_CUDA(cudaDeviceSynchronize());
  const unsigned long long corrupted = mismatches(b, n, 0x55555555u, t);
  std::printf("legacy_first_stream_%s: corrupted=%llu\n", label, corrupted);
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaStreamDestroy(t));
}

// Two threads' per-thread default streams are not ordered with each other (only with the
// legacy stream). Thread 1 frees a block behind a late writer on its per-thread stream (an
// ordered cudaFree with no non-blocking stream: the legacy rule), thread 2 takes it with
// cudaMalloc and writes it on its own per-thread stream. Under the rule's first case (no
// barrier: nothing but stream 0 in use) the late writes would land in thread 2's data; the
// shim must see the per-thread stream in use (a call on it) and order the handout behind a
// barrier. Named explicitly (cudaStreamPerThread), so the legacy build and the per-thread
// build run the same calls. `premise`: the same two writers on one buffer with no free in
// between corrupt natively, which proves the two streams unordered and the check able to fail.
void per_thread_two_threads() {
  const size_t n = size_t{16} << 20;
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;  // 1: thread 1 freed its block; 2: thread 2 wrote; 3: thread 1's writer is done
  auto wait_for = [&](int s) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stage >= s; });
  };
  auto reach = [&](int s) {
    std::lock_guard<std::mutex> lock(m);
    stage = s;
    cv.notify_all();
  };
  auto run = [&](bool premise) {
    stage = 0;
    std::uint32_t* shared_block = nullptr;
    unsigned long long corrupted = 0;
    bool reused = false;
    std::thread first([&] {
      std::uint32_t* a = nullptr;
      CHECK_CUDA(cudaMalloc(&a, n * 4));
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
      late_fill<<<264, 256, 0, cudaStreamPerThread>>>(a, n, 0xEEEEEEEEu, 20000000ULL);
      CHECK_CUDA(cudaGetLastError());
      if (!premise) CHECK_CUDA(cudaFree(a));
      shared_block = a;
      reach(1);
      wait_for(2);
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
      reach(3);
    });
    std::thread second([&] {
      wait_for(1);
      std::uint32_t* b = shared_block;
      if (!premise) CHECK_CUDA(cudaMalloc(&b, n * 4));
      reused = b == shared_block;
      fill<<<264, 256, 0, cudaStreamPerThread>>>(b, n, 0x55555555u);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
      reach(2);
      wait_for(3);
      corrupted = mismatches(b, n, 0x55555555u, cudaStreamPerThread);
      CHECK_CUDA(cudaFree(b));
    });
    first.join();
    second.join();
    if (!premise) std::fprintf(stderr, "per_thread_two_threads: block_reused=%d\n", reused);
    return corrupted;
  };
  const unsigned long long premise = run(true);
  const unsigned long long corrupted = run(false);
  std::printf("per_thread_two_threads: premise_corrupts=%d corrupted=%llu\n", premise > 0,
              corrupted);
}

// Proof that the corruption check above can fail: a buffer freed with cudaFreeAsync on a
// stream that is NOT ordered after the late kernel is reused at once on that stream, and the
// kernel's late writes land in the new buffer. This is an application bug, natively too.
void detector_self_check() {
  const size_t n = size_t{8} << 20;
  cudaStream_t s, other;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  std::uint32_t* a = nullptr;
  CHECK_CUDA(cudaMallocAsync(&a, n * 4, other));
  CHECK_CUDA(cudaStreamSynchronize(other));
  late_fill<<<264, 256, 0, s>>>(a, n, 0xCCCCCCCCu, 20000000ULL);
  CHECK_CUDA(cudaFreeAsync(a, other));  // wrong stream: nothing orders it after the kernel
  std::uint32_t* b = nullptr;
  CHECK_CUDA(cudaMallocAsync(&b, n * 4, other));
  fill<<<264, 256, 0, other>>>(b, n, 0x33333333u);
  CHECK_CUDA(cudaStreamSynchronize(other));
  CHECK_CUDA(cudaStreamSynchronize(s));
  const bool reused = b == a;
  const unsigned long long bad = mismatches(b, n, 0x33333333u, other);
  std::printf("detector_self_check: block_reused=%d corruption_detected=%d\n", reused, bad > 0);
  CHECK_CUDA(cudaFreeAsync(b, other));
  CHECK_CUDA(cudaDeviceSynchronize());
}

// The paged arena's rule (run under POOLSHIM_CACHE=0, so that any mapping past the blocks in use
// first moves free pages): a block freed behind a late writer keeps its pages while the writer
// runs. `b` (another stream, so `a`'s block is not usable for it) needs new pages with `a`'s free
// and mapped: unmapping them for `b` would fault the writer (cuMemUnmap does not wait for
// kernels). Once the writer is done, `c` (too large for `a`'s hole) takes them. Sizes are whole
// 20 MiB pages: the exit record's reserved peak is then exactly 9 pages (a and b, then c's six
// of which three are a's), 12 if a's never moved.
void pages_move_while_kernel_runs() {
  const size_t n = size_t{15} << 20;  // 60 MiB of words
  cudaStream_t s, other;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  std::uint32_t* a = nullptr;
  CHECK_CUDA(cudaMallocAsync(&a, n * 4, s));
  late_fill<<<264, 256, 0, s>>>(a, n, 0x77777777u, 20000000ULL);  // writes after ~20 ms
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFreeAsync(a, s));
  std::uint32_t* b = nullptr;
  CHECK_CUDA(cudaMallocAsync(&b, n * 4, other));
  fill<<<264, 256, 0, other>>>(b, n, 0x22222222u);
  const cudaError_t writer = cudaStreamSynchronize(s);
  unsigned long long corrupted = mismatches(b, n, 0x22222222u, other);
  std::uint32_t* c = nullptr;
  CHECK_CUDA(cudaMallocAsync(&c, 2 * n * 4, other));
  fill<<<264, 256, 0, other>>>(c, 2 * n, 0x44444444u);
  corrupted += mismatches(c, 2 * n, 0x44444444u, other);
  corrupted += mismatches(b, n, 0x22222222u, other);
  std::printf("pages_move_while_kernel_runs: writer=%s corrupted=%llu\n", cudaGetErrorName(writer),
              corrupted);
  CHECK_CUDA(cudaFreeAsync(b, other));
  CHECK_CUDA(cudaFreeAsync(c, other));
  CHECK_CUDA(cudaStreamSynchronize(other));
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaStreamDestroy(other));
}

// Proof that the check above can fail: memory unmapped while a kernel still writes it faults the
// kernel (natively, through the driver's virtual memory calls; the context is lost after it).
void unmap_under_kernel() {
  CHECK_CUDA(cudaFree(nullptr));  // the primary context
  CUdevice dev = 0;
  cuDeviceGet(&dev, 0);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t page = 0;
  cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  const size_t bytes = size_t{10} * page;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cuMemAddressReserve(&va, bytes, 0, 0, 0) != CUDA_SUCCESS ||
      cuMemCreate(&h, bytes, &prop, 0) != CUDA_SUCCESS ||
      cuMemMap(va, bytes, 0, h, 0) != CUDA_SUCCESS ||
      cuMemSetAccess(va, bytes, &access, 1) != CUDA_SUCCESS) {
    std::printf("unmap_under_kernel: setup failed\n");
    return;
  }
  auto* p = reinterpret_cast<std::uint32_t*>(va);
  late_fill<<<264, 256>>>(p, bytes / 4, 0x99999999u, 20000000ULL);
  CHECK_CUDA(cudaGetLastError());
  cuMemUnmap(va, bytes);
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("unmap_under_kernel: sync=%s\n", cudaGetErrorName(sync));
}

// CUDA 13 loads each kernel at its first launch (CUDA_MODULE_LOADING=LAZY, the default), and a
// load synchronizes the context: a kernel first launched while a late writer runs starts only
// after it, which hides every race these cases look for (on the H100, per_thread_two_threads'
// premise never corrupted until the kernels were loaded first). Each is launched once, on
// nothing, before any case.
void load_kernels() {
  late_fill<<<1, 1>>>(nullptr, 0, 0, 0);
  fill<<<1, 1>>>(nullptr, 0, 0);
  count_not<<<1, 1>>>(nullptr, 0, 0, nullptr);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view only = argc > 1 ? argv[1] : "";
  load_kernels();
  if (only == "pages_move") {
    pages_move_while_kernel_runs();
    return 0;
  }
  if (only == "unmap_under_kernel") {
    unmap_under_kernel();
    return 0;
  }
  if (only == "per_thread_two_threads") {
    per_thread_two_threads();
    return 0;
  }
  if (only == "legacy_first_stream_nonblocking" || only == "legacy_first_stream_blocking") {
    const bool nonblocking = only == "legacy_first_stream_nonblocking";
    legacy_only_then_first_stream(nonblocking ? cudaStreamNonBlocking : cudaStreamDefault,
                                  nonblocking ? "nonblocking" : "blocking");
    return 0;
  }
  free_while_kernel_runs(cudaStreamNonBlocking, Reuse::nonblocking, "nonblocking");
  free_while_kernel_runs(cudaStreamDefault, Reuse::nonblocking, "blocking");
  free_while_kernel_runs(cudaStreamDefault, Reuse::blocking, "blocking_then_blocking");
  free_while_kernel_runs(cudaStreamDefault, Reuse::legacy, "blocking_then_stream_0");
  free_after_writer_stream_destroyed();
  async_two_streams();
  default_stream_checksum();
  if (argc > 1 && std::string_view(argv[1]) == "selfcheck") detector_self_check();
  if (argc > 1 && std::string_view(argv[1]) == "fault") sticky_error_after_fault();
  return 0;
}
