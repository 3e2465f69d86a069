// Allocates N blocks of 4 MiB, frees them all, then stays idle for MS milliseconds without a
// CUDA call: under the shim the pool's unused memory goes back to the device in idle trims
// (POOLSHIM_IDLE_TRIM_MS) while it waits. With BYTES, it then asks for that much and, on
// failure, prints the error and exits with status 3 (an out-of-memory error long after start).
// It marks its phases in an NVTX domain of its own, `free_then_idle`, as an application with
// its own copy of NVTX does (the shim's copy must not clash with it).
//   free_then_idle N MS [BYTES]
#include <nvtx3/nvToolsExt.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.h"

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 8;
  const long idle_ms = argc > 2 ? std::atol(argv[2]) : 1000;
  const size_t MiB = size_t{1} << 20;
  std::vector<void*> held(static_cast<size_t>(blocks), nullptr);
  for (void*& p : held) CHECK_CUDA(cudaMalloc(&p, 4 * MiB));
  for (void* p : held) CHECK_CUDA(cudaFree(p));
  const nvtxDomainHandle_t domain = nvtxDomainCreateA("free_then_idle");
  nvtxEventAttributes_t mark = {};
  mark.version = NVTX_VERSION;
  mark.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  mark.messageType = NVTX_MESSAGE_TYPE_ASCII;
  mark.message.ascii = "freed";
  nvtxDomainMarkEx(domain, &mark);
  std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
  mark.message.ascii = "idle over";
  nvtxDomainMarkEx(domain, &mark);
  std::printf("free_then_idle: %d blocks of 4 MiB freed, idle %ld ms\n", blocks, idle_ms);
  if (argc > 3) {
    const size_t bytes = std::strtoull(argv[3], nullptr, 10);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    std::printf("allocation of %zu bytes: %s\n", bytes, name_of(e));
    if (e != cudaSuccess) return 3;
  }
  return 0;
}
