// Frees and allocations on one thread while another thread captures a stream (DESIGN §3:
// never break a capture, and look native). Under a global-mode capture a synchronous free is
// refused natively (and the capture invalidated); in relaxed mode it is allowed.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <thread>

#include "common.h"

namespace {

void run(cudaStreamCaptureMode capture_mode, cudaStreamCaptureMode freeing_thread_mode,
         const char* label) {
  void* block = nullptr;
  CHECK_CUDA(cudaMalloc(&block, 1 << 20));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const cudaError_t begin = cudaStreamBeginCapture(s, capture_mode);
  cudaError_t free_result = cudaErrorUnknown;
  cudaError_t malloc_result = cudaErrorUnknown;
  std::thread other([&] {
    cudaStreamCaptureMode mode = freeing_thread_mode;
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    malloc_result = cudaMalloc(&p, 4096);
    if (malloc_result == cudaSuccess) cudaFree(p);
    free_result = cudaFree(block);
    cudaGetLastError();
  });
  other.join();
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  if (g != nullptr) cudaGraphDestroy(g);
  cudaGetLastError();
  if (free_result != cudaSuccess) CHECK_CUDA(cudaFree(block));  // still live: free it now
  std::printf("%s: begin=%s malloc=%s free=%s end=%s graph=%d\n", label, name_of(begin),
              name_of(malloc_result), name_of(free_result), name_of(end), g != nullptr);
  CHECK_CUDA(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  run(cudaStreamCaptureModeGlobal, cudaStreamCaptureModeGlobal, "global_capture_global_thread");
  run(cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed, "global_capture_relaxed_thread");
  run(cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal,
      "threadlocal_capture_other_thread");
  run(cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeGlobal, "relaxed_capture_other_thread");
  std::printf("final_last_error: %s\n", name_of(cudaGetLastError()));
  return 0;
}
