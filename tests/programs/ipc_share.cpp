// Legacy CUDA IPC between a parent and the child it starts (exec of this program), as
// NVIDIA's simpleIPC and MPI codes use it. Prints what each side saw, no pointers:
//   ipc_share parent_to_child   the parent exports three buffers, the child opens them (one
//                               twice), checks and rewrites them, closes; the parent checks
//   ipc_share child_to_parent   the child exports, the parent opens, checks and rewrites them,
//                               closes; the child checks
// Both also try the cases that fail: opening one's own export, and bytes that are no handle;
// the importer reopens a handle after closing it, and the parent opens a handle of its child
// after the child has exited.
//   ipc_share export_small      exports a 4096-byte block (exit status 0 when it could)
//   ipc_share self_check        the byte checker fails where it must
// The exit status is 0 when every check passed.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kBuffers = 3;
// Over 1 MiB: poolshim exports blocks of its paged arenas only (README, Limitations); one
// spans two 20 MiB pages and one three.
constexpr size_t kSizes[kBuffers] = {size_t{3} << 20, size_t{21} << 20, size_t{43} << 20};

std::string hex(const cudaIpcMemHandle_t& h) {
  std::string out;
  char byte[3];
  for (unsigned char c : h.reserved) {
    std::snprintf(byte, sizeof byte, "%02x", c);
    out += byte;
  }
  return out;
}

bool unhex(const std::string& text, cudaIpcMemHandle_t* h) {
  if (text.size() != 2 * sizeof h->reserved) return false;
  for (size_t i = 0; i < sizeof h->reserved; ++i) {
    h->reserved[i] = static_cast<char>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

#ifdef IPC_SHARE_KERNELS
// Kernels write and read the buffers (tests/gpu/ipc_kernels.cu, which includes this file).
bool fill(void* p, int i, unsigned char value);
bool holds(const void* p, int i, unsigned char value);
#else
// Fills buffer `i` with `value` in every byte.
bool fill(void* p, int i, unsigned char value) {
  return cudaMemset(p, value, kSizes[i]) == cudaSuccess;
}

// Whether buffer `i` holds `value` in every byte (read back to the host).
bool holds(const void* p, int i, unsigned char value) {
  std::vector<unsigned char> host(kSizes[i]);
  if (cudaMemcpy(host.data(), p, kSizes[i], cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (unsigned char c : host) {
    if (c != value) return false;
  }
  return true;
}
#endif

// The exporting side: three buffers filled with 0x11, 0x22, 0x33, their handles; what it saw
// goes to `report` (the child prints it after the handles, which its parent reads first).
bool export_buffers(void* buffers[kBuffers], cudaIpcMemHandle_t handles[kBuffers], const char* who,
                    std::string* report) {
  char line[160];
  for (int i = 0; i < kBuffers; ++i) {
    if (cudaMalloc(&buffers[i], kSizes[i]) != cudaSuccess ||
        !fill(buffers[i], i, static_cast<unsigned char>(0x11 * (i + 1))) ||
        cudaIpcGetMemHandle(&handles[i], buffers[i]) != cudaSuccess) {
      std::snprintf(line, sizeof line, "%s: export %d failed: %s\n", who, i,
                    cudaGetErrorName(cudaGetLastError()));
      *report += line;
      return false;
    }
  }
  cudaIpcMemHandle_t again;
  const cudaError_t e = cudaIpcGetMemHandle(&again, buffers[0]);
  std::snprintf(line, sizeof line,
                "%s: exported %d buffers; a second handle of one is the same bytes: %d\n", who,
                kBuffers, e == cudaSuccess && std::memcmp(&again, &handles[0], sizeof again) == 0);
  *report += line;
  void* own = nullptr;
  const cudaError_t self = cudaIpcOpenMemHandle(&own, handles[0], cudaIpcMemLazyEnablePeerAccess);
  std::snprintf(line, sizeof line, "%s: opening its own export: %s\n", who, cudaGetErrorName(self));
  *report += line;
  cudaGetLastError();
  return true;
}

// The importing side: opens each handle, checks the exporter's bytes, rewrites them with
// 0xA0 + i, opens the first twice (the same pointer, counted), closes every open; then bytes
// that are no handle.
bool import_buffers(const cudaIpcMemHandle_t handles[kBuffers], const char* who) {
  bool ok = true;
  void* opened[kBuffers] = {};
  for (int i = 0; i < kBuffers; ++i) {
    const cudaError_t e =
        cudaIpcOpenMemHandle(&opened[i], handles[i], cudaIpcMemLazyEnablePeerAccess);
    const bool seen =
        e == cudaSuccess && holds(opened[i], i, static_cast<unsigned char>(0x11 * (i + 1)));
    const bool written = seen && fill(opened[i], i, static_cast<unsigned char>(0xA0 + i));
    std::printf("%s: buffer %d of %zu bytes: open %s, exporter's bytes %d, rewritten %d\n", who, i,
                kSizes[i], cudaGetErrorName(e), seen, written);
    ok = ok && written;
  }
  void* twice = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&twice, handles[0], cudaIpcMemLazyEnablePeerAccess);
  std::printf("%s: opened again: %s, same pointer %d\n", who, cudaGetErrorName(e),
              twice == opened[0]);
  if (e == cudaSuccess)
    std::printf("%s: close %s\n", who, cudaGetErrorName(cudaIpcCloseMemHandle(twice)));
  for (int i = 0; i < kBuffers; ++i) {
    if (opened[i] != nullptr) {
      std::printf("%s: close %d %s\n", who, i, cudaGetErrorName(cudaIpcCloseMemHandle(opened[i])));
    }
  }
  void* again = nullptr;
  const cudaError_t reopened =
      cudaIpcOpenMemHandle(&again, handles[1], cudaIpcMemLazyEnablePeerAccess);
  std::printf("%s: reopened after its close: %s, its own bytes %d\n", who,
              cudaGetErrorName(reopened), reopened == cudaSuccess && holds(again, 1, 0xA1));
  if (reopened == cudaSuccess) {
    std::printf("%s: close %s\n", who, cudaGetErrorName(cudaIpcCloseMemHandle(again)));
  }
  cudaIpcMemHandle_t foreign;
  std::memset(&foreign, 0x5C, sizeof foreign);
  void* none = nullptr;
  std::printf(
      "%s: bytes that are no handle: %s\n", who,
      cudaGetErrorName(cudaIpcOpenMemHandle(&none, foreign, cudaIpcMemLazyEnablePeerAccess)));
  cudaGetLastError();
  return ok;
}

// Checks that the importer's rewrite reached the exporter's buffers, and frees them.
bool check_rewrites(void* buffers[kBuffers], const char* who) {
  bool ok = true;
  for (int i = 0; i < kBuffers; ++i) {
    const bool seen = holds(buffers[i], i, static_cast<unsigned char>(0xA0 + i));
    std::printf("%s: buffer %d holds the importer's bytes: %d\n", who, i, seen);
    ok = ok && seen && cudaFree(buffers[i]) == cudaSuccess;
  }
  return ok;
}

// IPC_SHARE_CHILD_WITHOUT_SHIM: the child runs without libpoolshim (the rest of LD_PRELOAD,
// say a sanitizer's runtime, stays): an importer that does not run under the shim.
void drop_shim_from_preload() {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  std::string kept, entry;
  const std::string all = std::string(preload) + ":";
  for (char c : all) {
    if (c != ':' && c != ' ') {
      entry += c;
      continue;
    }
    if (!entry.empty() && entry.find("libpoolshim") == std::string::npos)
      kept += (kept.empty() ? "" : ":") + entry;
    entry.clear();
  }
  setenv("LD_PRELOAD", kept.c_str(), 1);
}

// Runs this program as `args`, its standard input and output the pipes returned.
pid_t start_child(const std::vector<std::string>& args, int* to_child, int* from_child) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return -1;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    if (std::getenv("IPC_SHARE_CHILD_WITHOUT_SHIM") != nullptr) drop_shim_from_preload();
    dup2(down[0], 0);
    dup2(up[1], 1);
    close(down[0]), close(down[1]), close(up[0]), close(up[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  *to_child = down[1];
  *from_child = up[0];
  return pid;
}

// Everything the child writes until it closes its output.
std::string read_all(int fd) {
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;)
    out.append(buffer, static_cast<size_t>(n));
  return out;
}

std::string read_line(int fd) {
  std::string line;
  for (char c; read(fd, &c, 1) == 1 && c != '\n';) line += c;
  return line;
}

int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 99;
  return WEXITSTATUS(status);
}

int parent_to_child() {
  void* buffers[kBuffers];
  cudaIpcMemHandle_t handles[kBuffers];
  std::string report;
  const bool exported = export_buffers(buffers, handles, "parent", &report);
  std::fputs(report.c_str(), stdout);
  if (!exported) return 1;
  std::vector<std::string> args = {"ipc_share", "import"};
  for (const auto& h : handles) args.push_back(hex(h));
  int to_child = -1, from_child = -1;
  const pid_t child = start_child(args, &to_child, &from_child);
  if (child < 0) return 2;
  close(to_child);
  const std::string child_out = read_all(from_child);
  close(from_child);
  const int status = wait_child(child);
  std::fputs(child_out.c_str(), stdout);
  std::printf("parent: child exited %d\n", status);
  return check_rewrites(buffers, "parent") && status == 0 ? 0 : 3;
}

int child_to_parent() {
  int to_child = -1, from_child = -1;
  const pid_t child = start_child({"ipc_share", "export"}, &to_child, &from_child);
  if (child < 0) return 2;
  cudaIpcMemHandle_t handles[kBuffers];
  std::string child_out;
  bool got = true;
  for (auto& h : handles) {
    const std::string line = read_line(from_child);  // "handle <hex>" lines first
    got = got && line.rfind("handle ", 0) == 0 && unhex(line.substr(7), &h);
  }
  const bool ok = got && import_buffers(handles, "parent");
  if (write(to_child, "done\n", 5) != 5) return 4;  // the child checks and frees now
  close(to_child);
  child_out = read_all(from_child);
  close(from_child);
  const int status = wait_child(child);
  std::fputs(child_out.c_str(), stdout);
  std::printf("parent: child exited %d\n", status);
  void* gone = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&gone, handles[0], cudaIpcMemLazyEnablePeerAccess);
  std::printf("parent: a handle of the exited child: %s\n", cudaGetErrorName(e));
  cudaGetLastError();
  return ok && status == 0 && e != cudaSuccess ? 0 : 3;
}

// A block of one page (4096 bytes): exported natively; under poolshim, whose small blocks come
// from a cudaMemPool, the export fails (README, Limitations). Exit status 0 when it succeeded.
int export_small() {
  void* p = nullptr;
  cudaIpcMemHandle_t h;
  if (cudaMalloc(&p, 4096) != cudaSuccess) return 2;
  const cudaError_t e = cudaIpcGetMemHandle(&h, p);
  std::printf("export of 4096 bytes: %s\n", cudaGetErrorName(e));
  cudaFree(p);
  return e == cudaSuccess ? 0 : 1;
}

// The child of parent_to_child: opens the handles on its command line.
int import_child(char** hexes) {
  cudaIpcMemHandle_t handles[kBuffers];
  for (int i = 0; i < kBuffers; ++i) {
    if (hexes[i] == nullptr || !unhex(hexes[i], &handles[i])) return 5;
  }
  return import_buffers(handles, "child") ? 0 : 6;
}

// The child of child_to_parent: exports, hands the handles up, waits, checks.
int export_child() {
  void* buffers[kBuffers];
  cudaIpcMemHandle_t handles[kBuffers];
  std::string report;
  if (!export_buffers(buffers, handles, "child", &report)) {
    std::fputs(report.c_str(), stdout);
    return 5;
  }
  // The handles first: the parent reads them before anything else.
  for (const auto& h : handles) std::printf("handle %s\n", hex(h).c_str());
  std::fputs(report.c_str(), stdout);
  std::fflush(stdout);
  char done[8] = {};
  if (read(0, done, 5) != 5) return 6;
  return check_rewrites(buffers, "child") ? 0 : 7;
}

// The detector's own check: a buffer filled with one value holds it and no other, and a
// buffer one byte of which changed holds neither.
int self_check() {
  void* p = nullptr;
  if (cudaMalloc(&p, kSizes[1]) != cudaSuccess || !fill(p, 1, 0x22)) return 2;
  const bool own = holds(p, 1, 0x22), other = holds(p, 1, 0x23);
  const unsigned char poke = 0;
  const bool poked = cudaMemcpy(static_cast<unsigned char*>(p) + (kSizes[1] >> 1) + 5, &poke, 1,
                                cudaMemcpyHostToDevice) == cudaSuccess;
  const bool after = holds(p, 1, 0x22);
  std::printf("self-check: holds its bytes %d, holds other bytes %d, after one byte changed %d\n",
              own, other, after);
  cudaFree(p);
  return own && !other && poked && !after ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "parent_to_child") return parent_to_child();
  if (mode == "child_to_parent") return child_to_parent();
  if (mode == "import" && argc == 2 + kBuffers) return import_child(argv + 2);
  if (mode == "export") return export_child();
  if (mode == "export_small") return export_small();
  if (mode == "self_check") return self_check();
  std::fprintf(stderr,
               "usage: ipc_share parent_to_child | child_to_parent | export_small | self_check\n");
  return 2;
}
