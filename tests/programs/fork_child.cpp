// fork() before and after the parent uses CUDA.
//   fork_child before: the parent forks first; the child allocates (it must be pooled and
//                      logged under the child's pid), then the parent allocates.
//   fork_child after:  the parent allocates first, then forks; the child must not hang on the
//                      shim's locks and only calls cudaGetDeviceCount (CUDA is not usable in
//                      such a child natively either).
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common.h"

static int use_memory(const char* who) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  CHECK_CUDA(cudaMemset(p, 7, 1 << 20));
  unsigned char b = 0;
  CHECK_CUDA(cudaMemcpy(&b, p, 1, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(p));
  std::printf("%s: byte=%d\n", who, b);
  std::fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  const bool before = argc > 1 && std::strcmp(argv[1], "before") == 0;
  if (!before) use_memory("parent");
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    if (before) {
      use_memory("child");
    } else {
      int count = -1;
      cudaGetDeviceCount(&count);  // may fail natively after fork; must not hang
      std::printf("child: returned\n");
    }
    std::fflush(stdout);
    std::exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (before) use_memory("parent");
  std::printf("child exit: %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
