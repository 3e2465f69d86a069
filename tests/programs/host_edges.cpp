// What a host program may do that the shim must survive without changing its behaviour (issue
// 12). The output is the same with and without the shim; the end-to-end tests check the rest.
//
//   host_edges exit_while_allocating THREADS  threads allocate and free without pause while
//                                             main calls exit() (they start no new call once it
//                                             has begun: the real runtime tears down after the
//                                             exit handlers): the exit record must be one
//                                             snapshot (live_allocs equal to the leak count)
//   host_edges daemon_fds FILE                after its first allocation, closes every
//                                             descriptor above 2 like a daemon, opens FILE and
//                                             puts it on every descriptor number up to 1023:
//                                             FILE must get only the program's own lines, and
//                                             the shim must close none of them at exit
//   host_edges sigwait N [early]              blocks SIGUSR1 after the shim has started (with
//                                             `early`: before any CUDA call, so that the real
//                                             driver's threads block it too, as a program on a
//                                             GPU must) and takes N of them, sent to the
//                                             process, with sigwait: none may reach the shim's
//                                             thread
//   host_edges dlclose LIBRARY                dlopens LIBRARY (the shim), allocates through
//                                             it, and dlcloses it: must not hang
//   host_edges hold                           allocates 1 MiB, says "holding", waits for a
//                                             line on stdin, frees and exits: a test looks at
//                                             the shim's files while the process runs
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

void allocate_and_free(std::size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  CHECK_CUDA(cudaFree(p));
}

[[noreturn]] void exit_while_allocating(int threads) {
  allocate_and_free(4096);  // the shim is running before the threads start
  static std::atomic<int> running{0};
  static std::atomic<bool> stopping{false};
  for (int t = 0; t < threads; ++t) {
    std::thread([t] {
      std::vector<void*> live(8, nullptr);
      running.fetch_add(1);
      for (unsigned i = 0; !stopping.load(); ++i) {
        void*& slot = live[i % live.size()];
        if (slot != nullptr) cudaFree(slot);
        slot = nullptr;
        // Errors are possible once exit() tears CUDA down under the running threads.
        if (cudaMalloc(&slot, 4096 * (1 + (i + static_cast<unsigned>(t)) % 16)) != cudaSuccess) {
          slot = nullptr;
        }
      }
      for (;;) pause();  // parked: the process ends around it
    }).detach();
  }
  while (running.load() < threads) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::printf("exiting with %d threads allocating\n", threads);
  std::fflush(stdout);
  stopping.store(true);  // the calls in progress go on into exit()
  std::exit(0);
}

int g_max_fd = 1023;

// Runs after the shim's exit handler (registered before the program's first allocation).
void count_open_descriptors() {
  int open = 0;
  for (int fd = 3; fd <= g_max_fd; ++fd) open += fcntl(fd, F_GETFD) != -1;
  std::printf("descriptors still open after exit handlers: %d\n", open);
  std::fflush(stdout);
}

int daemon_fds(const char* file) {
  std::atexit(count_open_descriptors);
  allocate_and_free(1 << 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the log is open by now
  for (int fd = 3; fd <= g_max_fd; ++fd) close(fd);
  const int own = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (own < 0) return 3;
  // Whatever number the shim's log had, it is this file's now.
  for (int fd = 3; fd <= g_max_fd; ++fd) {
    if (fd != own) dup2(own, fd);
  }
  const char line[] = "the program's own line\n";
  if (write(own, line, sizeof line - 1) != static_cast<ssize_t>(sizeof line - 1)) return 4;
  for (int i = 0; i < 20; ++i) {  // samples are due meanwhile (POOLSHIM_SAMPLE_MS)
    allocate_and_free(1 << 16);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("daemon_fds done\n");
  return 0;
}

int take_signals(int n, bool early) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  if (early) pthread_sigmask(SIG_BLOCK, &set, nullptr);
  allocate_and_free(4096);  // the shim's thread exists from here on
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int taken = 0;
  for (int i = 0; i < n; ++i) {
    kill(getpid(), SIGUSR1);  // to the process: any thread that does not block it may take it
    int signal = 0;
    if (sigwait(&set, &signal) == 0 && signal == SIGUSR1) ++taken;
    allocate_and_free(4096);
  }
  std::printf("took %d of %d signals with sigwait\n", taken, n);
  return taken == n ? 0 : 1;
}

int dlopen_and_close(const char* library) {
  void* shim = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (shim == nullptr) {
    std::printf("dlopen failed\n");
    return 2;
  }
  using Malloc = cudaError_t (*)(void**, size_t);
  using Free = cudaError_t (*)(void*);
  auto shim_malloc = reinterpret_cast<Malloc>(dlsym(shim, "cudaMalloc"));
  auto shim_free = reinterpret_cast<Free>(dlsym(shim, "cudaFree"));
  if (shim_malloc == nullptr || shim_free == nullptr) return 3;
  for (int i = 0; i < 10; ++i) {
    void* p = nullptr;
    CHECK_CUDA(shim_malloc(&p, 1 << 20));
    CHECK_CUDA(shim_free(p));
  }
  std::printf("dlclose -> %d\n", dlclose(shim));
  allocate_and_free(4096);  // the program's own runtime still works
  std::printf("after dlclose\n");
  return 0;
}

int hold() {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  std::printf("holding\n");
  std::fflush(stdout);
  char line[16];
  if (std::fgets(line, sizeof line, stdin) == nullptr) return 1;
  CHECK_CUDA(cudaFree(p));
  std::printf("freed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "exit_while_allocating" && argc > 2) exit_while_allocating(std::atoi(argv[2]));
  if (mode == "daemon_fds" && argc > 2) return daemon_fds(argv[2]);
  if (mode == "sigwait" && argc > 2) {
    return take_signals(std::atoi(argv[2]), argc > 3 && std::strcmp(argv[3], "early") == 0);
  }
  if (mode == "dlclose" && argc > 2) return dlopen_and_close(argv[2]);
  if (mode == "hold") return hold();
  std::fprintf(stderr,
               "usage: host_edges exit_while_allocating THREADS | daemon_fds FILE | "
               "sigwait N [early] | dlclose LIBRARY | hold\n");
  return 2;
}
