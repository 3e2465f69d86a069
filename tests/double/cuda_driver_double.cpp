// CPU test double of the CUDA driver, built as libcuda.so.1.
//
// Devices are simulated in host memory: allocations and pool chunks are anonymous mappings
// (MAP_NORESERVE, so a large capacity costs nothing until touched), every operation completes
// at once, and the only asynchrony modelled is the one the pool core depends on: memory freed
// with cuMemFreeAsync stays "pending" on its stream until that stream or the device is
// synchronized. The figures tests assert are documented in cudadouble.h.
//
// One mutex guards all state; the double never calls out of itself while holding it.

#include "cudadouble.h"

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

// cuda.h maps these names to their _v2 forms. The double exports the old names as well, as the
// real driver does (the CUDA 13 runtime still looks up the primary context ones at 7.0), so they
// have to be spelled without the macros.
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDeviceGetUuid

#define CUDADOUBLE_API extern "C" __attribute__((visibility("default")))

// Every driver entry point the double exports, by exported name. Generates the call counters
// and the table cuGetProcAddress resolves from, so the three can never disagree.
// clang-format off
#define CUDADOUBLE_ENTRY_POINTS(X) \
  X(cuInit)                            \
  X(cuDriverGetVersion)                \
  X(cuGetErrorString)                  \
  X(cuGetErrorName)                    \
  X(cuGetProcAddress_v2)               \
  X(cuGetProcAddress)                  \
  X(cuGetExportTable)                  \
  X(cuDeviceGetCount)                  \
  X(cuDeviceGet)                       \
  X(cuDeviceGetName)                   \
  X(cuDeviceTotalMem_v2)               \
  X(cuDeviceGetAttribute)              \
  X(cuDeviceGetUuid)                   \
  X(cuDeviceGetUuid_v2)                \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxRelease)         \
  X(cuDevicePrimaryCtxRelease_v2)      \
  X(cuDevicePrimaryCtxReset)           \
  X(cuDevicePrimaryCtxReset_v2)        \
  X(cuDevicePrimaryCtxGetState)        \
  X(cuDevicePrimaryCtxSetFlags_v2)     \
  X(cuCtxGetCurrent)                   \
  X(cuCtxSetCurrent)                   \
  X(cuCtxPushCurrent_v2)               \
  X(cuCtxPopCurrent_v2)                \
  X(cuCtxGetDevice)                    \
  X(cuCtxGetDevice_v2)                 \
  X(cuCtxSynchronize)                  \
  X(cuCtxSynchronize_v2)               \
  X(cuMemGetInfo_v2)                   \
  X(cuMemAlloc_v2)                     \
  X(cuMemFree_v2)                      \
  X(cuMemAllocHost_v2)                 \
  X(cuMemHostAlloc)                    \
  X(cuMemFreeHost)                     \
  X(cuMemPoolCreate)                   \
  X(cuMemPoolDestroy)                  \
  X(cuDeviceGetDefaultMemPool)         \
  X(cuDeviceGetMemPool)                \
  X(cuDeviceSetMemPool)                \
  X(cuMemPoolTrimTo)                   \
  X(cuMemPoolSetAttribute)             \
  X(cuMemPoolGetAttribute)             \
  X(cuMemPoolSetAccess)                \
  X(cuMemPoolGetAccess)                \
  X(cuMemAllocFromPoolAsync)           \
  X(cuMemAllocFromPoolAsync_ptsz)      \
  X(cuMemAllocAsync)                   \
  X(cuMemAllocAsync_ptsz)              \
  X(cuMemFreeAsync)                    \
  X(cuMemFreeAsync_ptsz)               \
  X(cuStreamCreate)                    \
  X(cuStreamCreateWithPriority)        \
  X(cuStreamDestroy_v2)                \
  X(cuStreamSynchronize)               \
  X(cuStreamSynchronize_ptsz)          \
  X(cuStreamQuery)                     \
  X(cuStreamQuery_ptsz)                \
  X(cuLaunchKernel)                    \
  X(cuLaunchKernel_ptsz)               \
  X(cuStreamGetDevice)                 \
  X(cuStreamGetDevice_ptsz)            \
  X(cuStreamGetCtx)                    \
  X(cuStreamGetCtx_ptsz)               \
  X(cuStreamGetCtx_v2)                 \
  X(cuStreamGetCtx_v2_ptsz)            \
  X(cuStreamGetFlags)                  \
  X(cuStreamGetFlags_ptsz)             \
  X(cuStreamWaitEvent)                 \
  X(cuStreamWaitEvent_ptsz)            \
  X(cuEventCreate)                     \
  X(cuEventRecord)                     \
  X(cuEventRecord_ptsz)                \
  X(cuEventSynchronize)                \
  X(cuEventQuery)                      \
  X(cuEventDestroy_v2)                 \
  X(cuStreamBeginCapture_v2)           \
  X(cuStreamBeginCapture_v2_ptsz)      \
  X(cuStreamEndCapture)                \
  X(cuStreamEndCapture_ptsz)           \
  X(cuStreamIsCapturing)               \
  X(cuStreamIsCapturing_ptsz)          \
  X(cuStreamGetCaptureInfo_v3)         \
  X(cuStreamGetCaptureInfo_v3_ptsz)    \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuGraphDestroy)                    \
  X(cuMemcpy)                          \
  X(cuMemcpy_ptds)                     \
  X(cuMemcpyHtoD_v2)                   \
  X(cuMemcpyHtoD_v2_ptds)              \
  X(cuMemcpyDtoH_v2)                   \
  X(cuMemcpyDtoH_v2_ptds)              \
  X(cuMemcpyDtoD_v2)                   \
  X(cuMemcpyDtoD_v2_ptds)              \
  X(cuMemcpyAsync)                     \
  X(cuMemcpyAsync_ptsz)                \
  X(cuMemcpyHtoDAsync_v2)              \
  X(cuMemcpyHtoDAsync_v2_ptsz)         \
  X(cuMemcpyDtoHAsync_v2)              \
  X(cuMemcpyDtoHAsync_v2_ptsz)         \
  X(cuMemcpyDtoDAsync_v2)              \
  X(cuMemcpyDtoDAsync_v2_ptsz)         \
  X(cuMemsetD8_v2)                     \
  X(cuMemsetD8_v2_ptds)                \
  X(cuMemsetD32_v2)                    \
  X(cuMemsetD32_v2_ptds)               \
  X(cuMemsetD8Async)                   \
  X(cuMemsetD8Async_ptsz)              \
  X(cuMemsetD32Async)                  \
  X(cuMemsetD32Async_ptsz)             \
  X(cuPointerGetAttribute)            \
  X(cuMemGetAllocationGranularity)     \
  X(cuMemAddressReserve)               \
  X(cuMemAddressFree)                  \
  X(cuMemCreate)                       \
  X(cuMemRelease)                      \
  X(cuMemExportToShareableHandle)      \
  X(cuIpcGetMemHandle)                 \
  X(cuIpcOpenMemHandle_v2)             \
  X(cuIpcCloseMemHandle)               \
  X(cuMemImportFromShareableHandle)    \
  X(cuMemMap)                          \
  X(cuMemUnmap)                        \
  X(cuMemSetAccess)
// clang-format on

namespace entry {
#define CUDADOUBLE_ENUMERATOR(name) name,
enum Id : size_t { CUDADOUBLE_ENTRY_POINTS(CUDADOUBLE_ENUMERATOR) kCount };
#undef CUDADOUBLE_ENUMERATOR
}  // namespace entry

namespace {

constexpr int kMaxDevices = 8;
constexpr size_t kAllocationGranularity = 512;
constexpr size_t kChunkGranularity = size_t{2} << 20;
constexpr size_t kDefaultCapacity = size_t{1} << 30;
constexpr int kDriverVersion = 13000;

#define CUDADOUBLE_NAME_STRING(name) #name,
constexpr const char* kEntryNames[] = {CUDADOUBLE_ENTRY_POINTS(CUDADOUBLE_NAME_STRING)};
#undef CUDADOUBLE_NAME_STRING

std::array<std::atomic<unsigned long long>, entry::kCount> g_calls{};

void countCall(entry::Id id) {
  g_calls[id].fetch_add(1, std::memory_order_relaxed);
}

bool roundUp(size_t n, size_t granularity, size_t* out) {
  if (n > SIZE_MAX - (granularity - 1)) return false;
  *out = (n + granularity - 1) / granularity * granularity;
  return true;
}

uintptr_t address(CUdeviceptr p) {
  return static_cast<uintptr_t>(p);
}
uintptr_t hostAddress(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

void* mapMemory(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// A range of a pool chunk that is not handed out: free, or freed on `stream` and waiting for
// that stream to be synchronized.
struct Range {
  size_t size;
  bool pending;
  uint64_t stream;
};

struct Chunk {
  char* base;
  size_t size;
  std::map<size_t, Range> unallocated;  // by offset

  bool fullyFree() const {
    if (unallocated.size() != 1) return false;
    const auto& [offset, range] = *unallocated.begin();
    return offset == 0 && !range.pending && range.size == size;
  }
};

struct Capture {
  bool active = false;
  bool invalidated = false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  uint64_t id = 0;
  CUgraph graph = nullptr;
};

}  // namespace

// The handle types of cuda.h are pointers to these incomplete structs; the double completes
// them, so handles are typed without casts.
struct CUctx_st {
  int device = 0;
  unsigned refcount = 0;
  unsigned flags = 0;
};

struct CUstream_st {
  uint64_t id = 0;
  int device = 0;
  unsigned flags = 0;
  int priority = 0;
  Capture capture;
};

struct CUevent_st {
  int device = 0;
  unsigned flags = 0;
};

struct CUgraph_st {
  uint64_t capture_id = 0;
};

struct CUmemPoolHandle_st {
  int device = 0;
  bool is_default = false;
  bool destroyed = false;  // by cuMemPoolDestroy while allocations were outstanding
  size_t max_size = 0;     // 0: bounded by the device only
  std::vector<std::unique_ptr<Chunk>> chunks;  // creation order
  cuuint64_t release_threshold = 0;
  int reuse_follow_event_dependencies = 1;
  int reuse_allow_opportunistic = 1;
  int reuse_allow_internal_dependencies = 1;
  size_t reserved = 0;
  size_t reserved_high = 0;
  size_t used = 0;
  size_t used_high = 0;
  size_t live_allocations = 0;
  std::map<int, CUmemAccess_flags> peer_access;  // by device ordinal
};

namespace {

using Pool = CUmemPoolHandle_st;

struct PlainAllocation {
  int device;
  size_t requested;
  size_t size;              // rounded: what counts toward consumption and may be touched
  int ipc_fd = -1;          // once exported (cuIpcGetMemHandle): the memfd now behind it
  uint64_t ipc_serial = 0;  // and its number, in the handle and the memfd's name
};

// Another process's exported allocation, opened here (cuIpcOpenMemHandle).
struct IpcOpened {
  int device;
  size_t size;
  pid_t pid;
  uint64_t serial;
  int count;  // opens not yet closed
};

// The bytes of a legacy IPC handle (64, CU_IPC_HANDLE_SIZE).
struct IpcHandleBytes {
  char magic[8];  // "CUDADBL1"
  int32_t pid;
  int32_t fd;
  uint64_t serial;
  uint64_t size;
  int32_t device;
  char unused[28];
};
static_assert(sizeof(IpcHandleBytes) == CU_IPC_HANDLE_SIZE, "a legacy IPC handle is 64 bytes");
constexpr char kIpcMagic[8] = {'C', 'U', 'D', 'A', 'D', 'B', 'L', '1'};

struct PoolAllocation {
  Pool* pool;
  Chunk* chunk;
  size_t offset;
  size_t requested;
  size_t size;  // rounded: what counts as "used"
};

struct HostAllocation {
  int device;
  size_t requested;
};

struct Device {
  size_t capacity = 0;
  size_t vmm_bytes = 0;  // cuMemCreate'd, not yet released
  size_t plain_bytes = 0;
  size_t plain_count = 0;
  Pool* default_pool = nullptr;
  Pool* current_pool = nullptr;
  CUstream_st default_stream;  // what the handles 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean
};

// Virtual memory management (cuMemCreate and friends): a physical allocation is a memfd of its
// size; mapping it maps the file at the address (MAP_SHARED, so its contents survive an unmap
// and a map elsewhere, as device memory does); an address reservation is PROT_NONE host
// address space.
struct Physical {
  int device;
  size_t size;
  int fd;
  int mappings = 0;
  bool released = false;    // freed when its last mapping goes, as the driver does
  bool exportable = false;  // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  bool imported = false;    // cuMemImportFromShareableHandle: the exporter's memory, not counted
};

struct Mapping {
  size_t size;
  CUmemGenericAllocationHandle handle;
  bool accessible = false;
};

struct State {
  bool configured = false;
  bool initialized = false;
  bool faulted = false;     // cudadouble_fault: a kernel faulted, the error is sticky
  uint64_t generation = 1;  // bumped by cudadouble_reset so thread-local state goes stale
  int device_count = 1;
  std::array<Device, kMaxDevices> devices;
  std::array<CUctx_st, kMaxDevices> contexts;  // primary contexts; addresses never change
  std::vector<std::unique_ptr<Pool>> pools;    // default, app-created and destroyed-but-busy
  std::map<uintptr_t, PlainAllocation> plain;
  std::map<uintptr_t, IpcOpened> ipc_opened;  // by address
  uint64_t next_ipc_serial = 1;
  std::map<uintptr_t, PoolAllocation> pool_allocations;
  std::map<uintptr_t, Chunk*> chunks;  // by base address, to validate copies
  std::map<uintptr_t, HostAllocation> host;
  std::map<uintptr_t, size_t> reservations;  // cuMemAddressReserve: base -> size
  std::map<CUmemGenericAllocationHandle, Physical> physical;
  std::map<uintptr_t, Mapping> mappings;  // by address
  CUmemGenericAllocationHandle next_handle = 1;
  std::unordered_map<CUstream, std::unique_ptr<CUstream_st>> streams;
  std::unordered_map<CUevent, std::unique_ptr<CUevent_st>> events;
  std::unordered_map<CUgraph, std::unique_ptr<CUgraph_st>> graphs;
  uint64_t next_stream_id = 1;
  uint64_t next_capture_id = 1;
};

std::mutex g_mutex;

// Never destroyed: threads of the program under test may still call in while exit handlers run.
State& rawState() {
  static State* state = new State;
  return *state;
}

struct ThreadState {
  uint64_t generation = 0;
  std::vector<CUctx_st*> context_stack;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
};

thread_local ThreadState t_thread;

ThreadState& threadState(const State& s) {
  if (t_thread.generation != s.generation) {
    t_thread.context_stack.clear();
    t_thread.capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    t_thread.generation = s.generation;
  }
  return t_thread;
}

// ---- configuration and reset ------------------------------------------------------------------

bool parseSize(const char* text, size_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || errno != 0) return false;
  unsigned shift = 0;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case '\0':
      break;
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'G':
      shift = 30;
      ++end;
      break;
    default:
      return false;
  }
  if (*end != '\0' || value > (SIZE_MAX >> shift)) return false;
  *out = static_cast<size_t>(value) << shift;
  return true;
}

void releaseEverything(State& s) {
  for (auto& [base, allocation] : s.plain) {
    munmap(reinterpret_cast<void*>(base), allocation.size);
    if (allocation.ipc_fd >= 0) close(allocation.ipc_fd);
  }
  for (auto& [base, opened] : s.ipc_opened) munmap(reinterpret_cast<void*>(base), opened.size);
  s.ipc_opened.clear();
  for (auto& [base, chunk] : s.chunks) munmap(reinterpret_cast<void*>(base), chunk->size);
  for (auto& [base, allocation] : s.host) std::free(reinterpret_cast<void*>(base));
  for (auto& [base, size] : s.reservations) munmap(reinterpret_cast<void*>(base), size);
  for (auto& [handle, physical] : s.physical) close(physical.fd);
  s.reservations.clear();
  s.physical.clear();
  s.mappings.clear();
  s.plain.clear();
  s.pool_allocations.clear();
  s.chunks.clear();
  s.host.clear();
  s.pools.clear();
  s.streams.clear();
  s.events.clear();
  s.graphs.clear();
}

std::unique_ptr<Pool> makeDefaultPool(int device) {
  auto pool = std::make_unique<Pool>();
  pool->device = device;
  pool->is_default = true;
  return pool;
}

void start(State& s, int devices, size_t capacity) {
  releaseEverything(s);
  s.initialized = false;
  s.faulted = false;
  s.configured = true;
  ++s.generation;
  s.device_count = std::clamp(devices, 1, kMaxDevices);
  s.next_stream_id = 1;
  s.next_capture_id = 1;
  for (int d = 0; d < kMaxDevices; ++d) {
    s.contexts[d] = CUctx_st{d, 0, 0};
    Device& device = s.devices[d];
    device.capacity = capacity;
    device.plain_bytes = 0;
    device.plain_count = 0;
    device.default_stream = CUstream_st{};
    device.default_stream.id = s.next_stream_id++;
    device.default_stream.device = d;
    device.default_pool = nullptr;
    device.current_pool = nullptr;
    if (d < s.device_count) {
      s.pools.push_back(makeDefaultPool(d));
      device.default_pool = device.current_pool = s.pools.back().get();
    }
  }
}

void configureFromEnvironment(State& s) {
  int devices = 1;
  size_t capacity = kDefaultCapacity;
  if (const char* text = std::getenv("CUDADOUBLE_DEVICES")) {
    char* end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && value >= 1 && value <= kMaxDevices) {
      devices = static_cast<int>(value);
    } else {
      std::fprintf(stderr, "cuda double: CUDADOUBLE_DEVICES=%s is not 1..%d, using 1\n", text,
                   kMaxDevices);
    }
  }
  if (const char* text = std::getenv("CUDADOUBLE_MEM")) {
    if (!parseSize(text, &capacity)) {
      std::fprintf(stderr, "cuda double: CUDADOUBLE_MEM=%s is not a size, using 1G\n", text);
      capacity = kDefaultCapacity;
    }
  }
  start(s, devices, capacity);
}

// The state, configured from the environment at first use. Call with g_mutex held.
State& lockedState() {
  State& s = rawState();
  if (!s.configured) configureFromEnvironment(s);
  return s;
}

// Counts the call, takes the lock and refuses to work before cuInit, as the real driver does.
template <class Body>
CUresult guarded(entry::Id id, Body&& body) {
  countCall(id);
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = lockedState();
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  // After a fault, what waits for or touches the device reports it (as the real driver does);
  // bookkeeping calls do not.
  if (s.faulted) {
    switch (id) {
      case entry::cuCtxSynchronize:
      case entry::cuStreamSynchronize:
      case entry::cuStreamQuery:
      case entry::cuMemAlloc_v2:
      case entry::cuMemFree_v2:
      case entry::cuMemAllocAsync:
      case entry::cuMemFreeAsync:
      case entry::cuMemAllocFromPoolAsync:
      case entry::cuEventQuery:
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      default:
        break;
    }
  }
  return body(s);
}

// ---- devices, contexts and streams --------------------------------------------------------------

bool validDevice(const State& s, CUdevice device) {
  return device >= 0 && device < s.device_count;
}

CUctx_st* contextFromHandle(State& s, CUcontext handle) {
  for (int d = 0; d < s.device_count; ++d) {
    if (handle == &s.contexts[d]) return handle;
  }
  return nullptr;
}

// The calling thread's current context, if it is one that can be used (retained).
CUresult requireContext(State& s, CUctx_st** out) {
  ThreadState& thread = threadState(s);
  if (thread.context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  CUctx_st* ctx = thread.context_stack.back();
  if (ctx == nullptr || ctx->refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *out = ctx;
  return CUDA_SUCCESS;
}

bool isSpecialStream(CUstream handle) {
  return handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
}

// Legacy and per-thread default streams are one and the same here: work completes at once,
// so the difference in implicit synchronization cannot be observed.
CUresult resolveStream(State& s, CUstream handle, CUstream_st** out) {
  if (isSpecialStream(handle)) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    *out = &s.devices[ctx->device].default_stream;
    return CUDA_SUCCESS;
  }
  auto it = s.streams.find(handle);
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second.get();
  return CUDA_SUCCESS;
}

CUresult resolveEvent(State& s, CUevent handle, CUevent_st** out) {
  auto it = s.events.find(handle);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second.get();
  return CUDA_SUCCESS;
}

// ---- memory pools -------------------------------------------------------------------------------

size_t consumption(const State& s, int device) {
  size_t total = s.devices[device].plain_bytes + s.devices[device].vmm_bytes;
  for (const auto& pool : s.pools) {
    if (pool->device == device) total += pool->reserved;
  }
  return total;
}

Pool* livePool(State& s, CUmemoryPool handle) {
  for (const auto& pool : s.pools) {
    if (pool.get() == handle) return pool->destroyed ? nullptr : pool.get();
  }
  return nullptr;
}

size_t takeRange(Chunk& chunk, std::map<size_t, Range>::iterator it, size_t size) {
  const size_t offset = it->first;
  const Range range = it->second;
  chunk.unallocated.erase(it);
  if (range.size > size) {
    chunk.unallocated.emplace(offset + size, Range{range.size - size, range.pending, range.stream});
  }
  return offset;
}

void insertFreeRange(Chunk& chunk, size_t offset, size_t size) {
  auto next = chunk.unallocated.lower_bound(offset);
  if (next != chunk.unallocated.end() && !next->second.pending && offset + size == next->first) {
    size += next->second.size;
    next = chunk.unallocated.erase(next);
  }
  if (next != chunk.unallocated.begin()) {
    auto previous = std::prev(next);
    if (!previous->second.pending && previous->first + previous->second.size == offset) {
      previous->second.size += size;
      return;
    }
  }
  chunk.unallocated.emplace_hint(next, offset, Range{size, false, 0});
}

template <class Predicate>
void settlePendingFrees(Pool& pool, Predicate&& matches) {
  for (auto& chunk : pool.chunks) {
    std::vector<std::pair<size_t, size_t>> settled;
    for (const auto& [offset, range] : chunk->unallocated) {
      if (range.pending && matches(range.stream)) settled.emplace_back(offset, range.size);
    }
    for (const auto& [offset, size] : settled) {
      chunk->unallocated.erase(offset);
      insertFreeRange(*chunk, offset, size);
    }
  }
}

void releaseChunk(State& s, Pool& pool, size_t index) {
  Chunk& chunk = *pool.chunks[index];
  munmap(chunk.base, chunk.size);
  s.chunks.erase(reinterpret_cast<uintptr_t>(chunk.base));
  pool.reserved -= chunk.size;
  pool.chunks.erase(pool.chunks.begin() + static_cast<std::ptrdiff_t>(index));
}

// Newest chunk first, as a pool gives back the memory it grew by last.
template <class MayRelease>
void releaseFullyFreeChunks(State& s, Pool& pool, MayRelease&& mayRelease) {
  for (size_t i = pool.chunks.size(); i-- > 0;) {
    const Chunk& chunk = *pool.chunks[i];
    if (chunk.fullyFree() && mayRelease(pool.reserved, chunk.size)) releaseChunk(s, pool, i);
  }
}

void applyReleaseThreshold(State& s, Pool& pool) {
  releaseFullyFreeChunks(s, pool, [&](size_t reserved, size_t chunk_size) {
    return reserved - chunk_size >= pool.release_threshold;
  });
}

// Forgets a pool with everything it holds; outstanding pointers into it become invalid.
void discardPool(State& s, Pool* pool) {
  for (auto& chunk : pool->chunks) {
    munmap(chunk->base, chunk->size);
    s.chunks.erase(reinterpret_cast<uintptr_t>(chunk->base));
  }
  for (auto it = s.pool_allocations.begin(); it != s.pool_allocations.end();) {
    it = it->second.pool == pool ? s.pool_allocations.erase(it) : std::next(it);
  }
  for (Device& device : s.devices) {
    if (device.current_pool == pool) device.current_pool = device.default_pool;
  }
  s.pools.erase(std::find_if(s.pools.begin(), s.pools.end(),
                             [&](const auto& owned) { return owned.get() == pool; }));
}

void synchronizeStream(State& s, const CUstream_st& stream) {
  for (auto& pool : s.pools) {
    if (pool->device != stream.device) continue;
    settlePendingFrees(*pool, [&](uint64_t id) { return id == stream.id; });
  }
  for (auto& pool : s.pools) {
    if (pool->device == stream.device) applyReleaseThreshold(s, *pool);
  }
}

void synchronizeDevice(State& s, int device) {
  for (auto& pool : s.pools) {
    if (pool->device != device) continue;
    settlePendingFrees(*pool, [](uint64_t) { return true; });
    applyReleaseThreshold(s, *pool);
  }
}

CUresult poolAllocate(State& s, Pool& pool, const CUstream_st& stream, size_t requested,
                      CUdeviceptr* out) {
  if (requested == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t size = 0;
  if (!roundUp(requested, kAllocationGranularity, &size)) return CUDA_ERROR_OUT_OF_MEMORY;

  Chunk* chunk = nullptr;
  size_t offset = 0;
  auto firstFit = [&](auto&& usable) {
    for (auto& candidate : pool.chunks) {
      for (auto it = candidate->unallocated.begin(); it != candidate->unallocated.end(); ++it) {
        if (it->second.size >= size && usable(it->second)) {
          chunk = candidate.get();
          offset = takeRange(*chunk, it, size);
          return true;
        }
      }
    }
    return false;
  };
  // Memory freed earlier on the same stream is safe to reuse in stream order, so it goes first.
  const bool placed =
      firstFit([&](const Range& r) { return r.pending && r.stream == stream.id; }) ||
      firstFit([](const Range& r) { return !r.pending; });
  if (!placed) {
    size_t chunk_size = 0;
    if (!roundUp(std::max(size, kChunkGranularity), kChunkGranularity, &chunk_size)) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const Device& device = s.devices[pool.device];
    const size_t consumed = consumption(s, pool.device);
    if (chunk_size > device.capacity || consumed > device.capacity - chunk_size) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (pool.max_size != 0 && pool.reserved + chunk_size > pool.max_size) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void* base = mapMemory(chunk_size);
    if (base == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    auto fresh = std::make_unique<Chunk>();
    fresh->base = static_cast<char*>(base);
    fresh->size = chunk_size;
    fresh->unallocated.emplace(0, Range{chunk_size, false, 0});
    chunk = fresh.get();
    offset = takeRange(*chunk, chunk->unallocated.begin(), size);
    s.chunks.emplace(reinterpret_cast<uintptr_t>(base), chunk);
    pool.chunks.push_back(std::move(fresh));
    pool.reserved += chunk_size;
    pool.reserved_high = std::max(pool.reserved_high, pool.reserved);
  }
  pool.used += size;
  pool.used_high = std::max(pool.used_high, pool.used);
  ++pool.live_allocations;
  const uintptr_t p = reinterpret_cast<uintptr_t>(chunk->base) + offset;
  s.pool_allocations.emplace(p, PoolAllocation{&pool, chunk, offset, requested, size});
  *out = static_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

// Takes the allocation out of the table; the caller decides what its range becomes.
void forgetPoolAllocation(State& s, std::map<uintptr_t, PoolAllocation>::iterator it) {
  Pool& pool = *it->second.pool;
  pool.used -= it->second.size;
  --pool.live_allocations;
  s.pool_allocations.erase(it);
}

void discardPoolIfDone(State& s, Pool& pool) {
  if (pool.destroyed && pool.live_allocations == 0) discardPool(s, &pool);
}

// ---- stream capture -----------------------------------------------------------------------------

// cuThreadExchangeStreamCaptureMode: a thread in GLOBAL mode is prohibited from unsafe calls by
// its own non-relaxed captures and by GLOBAL captures of any thread; in THREAD_LOCAL mode only by
// its own non-relaxed captures; in RELAXED mode never. A prohibited call invalidates the captures
// that prohibit it. Returns whether the call is prohibited.
bool prohibitedDuringCapture(State& s) {
  const CUstreamCaptureMode mode = threadState(s).capture_mode;
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  const std::thread::id self = std::this_thread::get_id();
  bool prohibited = false;
  for (auto& [handle, stream] : s.streams) {
    Capture& capture = stream->capture;
    if (!capture.active) continue;
    const bool own = capture.thread == self && capture.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool foreign = capture.thread != self && capture.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                         mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || foreign) {
      capture.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited;
}

// ---- device memory ranges -----------------------------------------------------------------------

enum class Memory { Device, Host, Invalid };

// Whether [p, p + n) lies inside one live plain allocation or one pool chunk (Device), touches
// none of them (Host: host memory under unified addressing), or starts in one and overruns it.
Memory classify(const State& s, uintptr_t p, size_t n) {
  if (p == 0 || p + n < p) return Memory::Invalid;
  auto within = [&](uintptr_t base, size_t size) { return p >= base && p - base < size; };
  auto fits = [&](uintptr_t base, size_t size) { return n <= size - (p - base); };
  auto plain = s.plain.upper_bound(p);
  if (plain != s.plain.begin()) {
    --plain;
    if (within(plain->first, plain->second.size)) {
      return fits(plain->first, plain->second.size) ? Memory::Device : Memory::Invalid;
    }
  }
  auto opened = s.ipc_opened.upper_bound(p);
  if (opened != s.ipc_opened.begin()) {
    --opened;
    if (within(opened->first, opened->second.size)) {
      return fits(opened->first, opened->second.size) ? Memory::Device : Memory::Invalid;
    }
  }
  auto chunk = s.chunks.upper_bound(p);
  if (chunk != s.chunks.begin()) {
    --chunk;
    if (within(chunk->first, chunk->second->size)) {
      return fits(chunk->first, chunk->second->size) ? Memory::Device : Memory::Invalid;
    }
  }
  // A VMM range: device memory while every byte of it is mapped with access, in mappings that
  // follow each other.
  auto mapping = s.mappings.upper_bound(p);
  if (mapping != s.mappings.begin()) {
    --mapping;
    if (within(mapping->first, mapping->second.size)) {
      uintptr_t at = p;
      const uintptr_t end = p + n;
      while (mapping != s.mappings.end() && mapping->first <= at && mapping->second.accessible) {
        at = mapping->first + mapping->second.size;
        if (at >= end) return Memory::Device;
        ++mapping;
      }
      return Memory::Invalid;
    }
  }
  for (const auto& [base, size] : s.reservations) {
    if (within(base, size)) return Memory::Invalid;  // reserved, not mapped
  }
  return Memory::Host;
}

CUresult requireDeviceRange(const State& s, uintptr_t p, size_t n) {
  return classify(s, p, n) == Memory::Device ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult requireUnifiedRange(const State& s, uintptr_t p, size_t n) {
  return classify(s, p, n) == Memory::Invalid ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult requireHostPointer(const void* p) {
  return p == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

enum class End { Host, Device, Unified };

CUresult checkEnd(const State& s, End end, uintptr_t p, size_t n) {
  switch (end) {
    case End::Host:
      return requireHostPointer(reinterpret_cast<const void*>(p));
    case End::Device:
      return requireDeviceRange(s, p, n);
    case End::Unified:
      return requireUnifiedRange(s, p, n);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult copy(State& s, uintptr_t dst, End dst_end, uintptr_t src, End src_end, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = checkEnd(s, dst_end, dst, n)) return r;
  if (CUresult r = checkEnd(s, src_end, src, n)) return r;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult copySync(State& s, uintptr_t dst, End dst_end, uintptr_t src, End src_end, size_t n) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = requireContext(s, &ctx)) return r;
  return copy(s, dst, dst_end, src, src_end, n);
}

CUresult copyAsync(State& s, uintptr_t dst, End dst_end, uintptr_t src, End src_end, size_t n,
                   CUstream handle) {
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  return copy(s, dst, dst_end, src, src_end, n);
}

CUresult set8(State& s, CUdeviceptr dst, unsigned char value, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = requireDeviceRange(s, address(dst), n)) return r;
  std::memset(reinterpret_cast<void*>(address(dst)), value, n);
  return CUDA_SUCCESS;
}

CUresult set32(State& s, CUdeviceptr dst, unsigned int value, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  if (address(dst) % 4 != 0 || n > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = requireDeviceRange(s, address(dst), n * 4)) return r;
  auto* words = reinterpret_cast<unsigned int*>(address(dst));
  std::fill(words, words + n, value);
  return CUDA_SUCCESS;
}

CUresult setSync(State& s, CUdeviceptr dst, unsigned int value, size_t n, bool words) {
  CUctx_st* ctx = nullptr;
  if (CUresult r = requireContext(s, &ctx)) return r;
  return words ? set32(s, dst, value, n) : set8(s, dst, static_cast<unsigned char>(value), n);
}

CUresult setAsync(State& s, CUdeviceptr dst, unsigned int value, size_t n, bool words,
                  CUstream handle) {
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  return words ? set32(s, dst, value, n) : set8(s, dst, static_cast<unsigned char>(value), n);
}

// ---- device reset -------------------------------------------------------------------------------

// What cuDevicePrimaryCtxReset does, and what destroying the primary context (last release) does.
void resetDevice(State& s, int device) {
  Device& dev = s.devices[device];
  for (auto it = s.plain.begin(); it != s.plain.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    munmap(reinterpret_cast<void*>(it->first), it->second.size);
    if (it->second.ipc_fd >= 0) close(it->second.ipc_fd);
    it = s.plain.erase(it);
  }
  for (auto it = s.ipc_opened.begin(); it != s.ipc_opened.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    munmap(reinterpret_cast<void*>(it->first), it->second.size);
    it = s.ipc_opened.erase(it);
  }
  dev.plain_bytes = 0;
  dev.plain_count = 0;

  std::vector<Pool*> doomed;
  for (auto& pool : s.pools) {
    if (pool->device == device && !pool->is_default) doomed.push_back(pool.get());
  }
  for (Pool* pool : doomed) discardPool(s, pool);

  Pool& default_pool = *dev.default_pool;
  for (auto it = s.pool_allocations.begin(); it != s.pool_allocations.end();) {
    it = it->second.pool == &default_pool ? s.pool_allocations.erase(it) : std::next(it);
  }
  while (!default_pool.chunks.empty())
    releaseChunk(s, default_pool, default_pool.chunks.size() - 1);
  default_pool = Pool{};
  default_pool.device = device;
  default_pool.is_default = true;
  dev.current_pool = &default_pool;

  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second->device != device) {
      ++it;
      continue;
    }
    if (it->second->capture.graph != nullptr) s.graphs.erase(it->second->capture.graph);
    it = s.streams.erase(it);
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    it = it->second->device == device ? s.events.erase(it) : std::next(it);
  }
  dev.default_stream.capture = Capture{};
}

// ---- cuGetProcAddress ---------------------------------------------------------------------------

// Versioned variants of a base name, newest first (cudaTypedefs.h: PFN_<name>_v<version>).
struct Variant {
  const char* symbol;
  int since;
  const char* name;
};

constexpr Variant kVariants[] = {
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"},
    {"cuCtxGetDevice", 13000, "cuCtxGetDevice_v2"},
    {"cuStreamGetCtx", 12050, "cuStreamGetCtx_v2"},
    {"cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3"},
    {"cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2"},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
    {"cuDevicePrimaryCtxSetFlags", 11000, "cuDevicePrimaryCtxSetFlags_v2"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
    {"cuMemFree", 3020, "cuMemFree_v2"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
    {"cuMemAllocHost", 3020, "cuMemAllocHost_v2"},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2"},
    {"cuMemcpyDtoD", 3020, "cuMemcpyDtoD_v2"},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2"},
    {"cuMemcpyDtoDAsync", 3020, "cuMemcpyDtoDAsync_v2"},
    {"cuMemsetD8", 3020, "cuMemsetD8_v2"},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2"},
};

// Base names with a per-thread default stream form (cudaTypedefs.h: PFN_*_ptds / PFN_*_ptsz),
// which CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects from CUDA 7.0 on.
struct PerThreadForm {
  const char* symbol;
  const char* suffix;
};

constexpr PerThreadForm kPerThreadForms[] = {
    {"cuMemcpy", "_ptds"},
    {"cuMemcpyHtoD", "_ptds"},
    {"cuMemcpyDtoH", "_ptds"},
    {"cuMemcpyDtoD", "_ptds"},
    {"cuMemsetD8", "_ptds"},
    {"cuMemsetD32", "_ptds"},
    {"cuMemcpyAsync", "_ptsz"},
    {"cuMemcpyHtoDAsync", "_ptsz"},
    {"cuMemcpyDtoHAsync", "_ptsz"},
    {"cuMemcpyDtoDAsync", "_ptsz"},
    {"cuMemsetD8Async", "_ptsz"},
    {"cuMemsetD32Async", "_ptsz"},
    {"cuStreamSynchronize", "_ptsz"},
    {"cuStreamQuery", "_ptsz"},
    {"cuLaunchKernel", "_ptsz"},
    {"cuStreamGetFlags", "_ptsz"},
    {"cuStreamGetCtx", "_ptsz"},
    {"cuStreamGetDevice", "_ptsz"},
    {"cuStreamWaitEvent", "_ptsz"},
    {"cuStreamBeginCapture", "_ptsz"},
    {"cuStreamEndCapture", "_ptsz"},
    {"cuStreamIsCapturing", "_ptsz"},
    {"cuStreamGetCaptureInfo", "_ptsz"},
    {"cuEventRecord", "_ptsz"},
    {"cuMemAllocAsync", "_ptsz"},
    {"cuMemFreeAsync", "_ptsz"},
    {"cuMemAllocFromPoolAsync", "_ptsz"},
};

constexpr int kPerThreadFormsSince = 7000;

// Callers pass base names only; the driver picks the variant. A versioned or per-thread name
// is not a base name.
bool isBaseName(const char* symbol) {
  const size_t length = std::strlen(symbol);
  if (length < 3 || std::strncmp(symbol, "cu", 2) != 0) return false;
  auto endsWith = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return length > n && std::strcmp(symbol + length - n, suffix) == 0;
  };
  if (endsWith("_ptsz") || endsWith("_ptds")) return false;
  const char* last = std::strrchr(symbol, '_');
  if (last != nullptr && last[1] == 'v' && std::isdigit(static_cast<unsigned char>(last[2])))
    return false;
  return true;
}

void* exportedFunction(const char* name);

}  // namespace

// ================================ exported driver API ===========================================

CUDADOUBLE_API CUresult cuInit(unsigned int flags) {
  countCall(entry::cuInit);
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = lockedState();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUDADOUBLE_API CUresult cuDriverGetVersion(int* version) {
  countCall(entry::cuDriverGetVersion);
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE",
     "operation would result in a merge of separate capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
     "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* findError(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

CUDADOUBLE_API CUresult cuGetErrorString(CUresult error, const char** text) {
  countCall(entry::cuGetErrorString);
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *text = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUDADOUBLE_API CUresult cuGetErrorName(CUresult error, const char** name) {
  countCall(entry::cuGetErrorName);
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *name = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

namespace {

CUresult getProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult* status) {
  auto report = [&](CUresult r, CUdriverProcAddressQueryResult found, void* function) {
    if (pfn != nullptr) *pfn = function;
    if (status != nullptr) *status = found;
    return r;
  };
  if (symbol == nullptr || pfn == nullptr ||
      flags > (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
    return report(CUDA_ERROR_INVALID_VALUE, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, nullptr);
  }
  if (!isBaseName(symbol)) {
    return report(CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, nullptr);
  }
  const char* name = symbol;
  for (const Variant& v : kVariants) {
    if (std::strcmp(v.symbol, symbol) == 0 && cuda_version >= v.since) {
      name = v.name;
      break;
    }
  }
  void* function = nullptr;
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 &&
      cuda_version >= kPerThreadFormsSince) {
    for (const PerThreadForm& form : kPerThreadForms) {
      if (std::strcmp(form.symbol, symbol) != 0) continue;
      char per_thread[128];
      std::snprintf(per_thread, sizeof per_thread, "%s%s", name, form.suffix);
      function = exportedFunction(per_thread);
      break;
    }
  }
  if (function == nullptr) function = exportedFunction(name);
  if (function == nullptr) {
    return report(CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, nullptr);
  }
  return report(CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS, function);
}

}  // namespace

CUDADOUBLE_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* symbolStatus) {
  countCall(entry::cuGetProcAddress_v2);
  return getProcAddress(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUDADOUBLE_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                         cuuint64_t flags) {
  countCall(entry::cuGetProcAddress);
  return getProcAddress(symbol, pfn, cudaVersion, flags, nullptr);
}

// The runtime double never needs the private export tables.
CUDADOUBLE_API CUresult cuGetExportTable(const void** table, const CUuuid* /*id*/) {
  countCall(entry::cuGetExportTable);
  if (table != nullptr) *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// ---- devices ----

CUDADOUBLE_API CUresult cuDeviceGetCount(int* count) {
  return guarded(entry::cuDeviceGetCount, [&](State& s) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = s.device_count;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  return guarded(entry::cuDeviceGet, [&](State& s) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  return guarded(entry::cuDeviceGetName, [&](State& s) {
    if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(length), "poolshim CPU test double, device %d", device);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  return guarded(entry::cuDeviceTotalMem_v2, [&](State& s) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = s.devices[device].capacity;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute,
                                             CUdevice device) {
  return guarded(entry::cuDeviceGetAttribute, [&](State& s) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *value = 9;
        break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *value = 0;
        break;
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = 132;
        break;
      case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *value = 1;
        break;
      case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        *value = 1;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult deviceUuid(State& s, CUuuid* uuid, CUdevice device) {
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  std::memset(uuid->bytes, 0, sizeof uuid->bytes);
  std::memcpy(uuid->bytes, "cudadouble", 10);
  uuid->bytes[15] = static_cast<char>(device);
  return CUDA_SUCCESS;
}

}  // namespace

CUDADOUBLE_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  return guarded(entry::cuDeviceGetUuid, [&](State& s) { return deviceUuid(s, uuid, device); });
}

CUDADOUBLE_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice device) {
  return guarded(entry::cuDeviceGetUuid_v2, [&](State& s) { return deviceUuid(s, uuid, device); });
}

// ---- primary contexts ----

CUDADOUBLE_API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  return guarded(entry::cuDevicePrimaryCtxRetain, [&](State& s) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    ++s.contexts[device].refcount;
    *ctx = &s.contexts[device];
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult primaryCtxRelease(State& s, CUdevice device) {
  if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st& ctx = s.contexts[device];
  if (ctx.refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // The last release destroys the primary context and everything in it.
  if (--ctx.refcount == 0) resetDevice(s, device);
  return CUDA_SUCCESS;
}

CUresult primaryCtxReset(State& s, CUdevice device) {
  if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  resetDevice(s, device);
  return CUDA_SUCCESS;
}

}  // namespace

CUDADOUBLE_API CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return guarded(entry::cuDevicePrimaryCtxRelease,
                 [&](State& s) { return primaryCtxRelease(s, device); });
}

CUDADOUBLE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  return guarded(entry::cuDevicePrimaryCtxRelease_v2,
                 [&](State& s) { return primaryCtxRelease(s, device); });
}

CUDADOUBLE_API CUresult cuDevicePrimaryCtxReset(CUdevice device) {
  return guarded(entry::cuDevicePrimaryCtxReset,
                 [&](State& s) { return primaryCtxReset(s, device); });
}

CUDADOUBLE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  return guarded(entry::cuDevicePrimaryCtxReset_v2,
                 [&](State& s) { return primaryCtxReset(s, device); });
}

CUDADOUBLE_API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags,
                                                   int* active) {
  return guarded(entry::cuDevicePrimaryCtxGetState, [&](State& s) {
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    *flags = s.contexts[device].flags;
    *active = s.contexts[device].refcount > 0 ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags) {
  return guarded(entry::cuDevicePrimaryCtxSetFlags_v2, [&](State& s) {
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    s.contexts[device].flags = flags;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
  return guarded(entry::cuCtxGetCurrent, [&](State& s) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ThreadState& thread = threadState(s);
    *ctx = thread.context_stack.empty() ? nullptr : thread.context_stack.back();
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  return guarded(entry::cuCtxSetCurrent, [&](State& s) {
    ThreadState& thread = threadState(s);
    if (ctx == nullptr) {
      if (!thread.context_stack.empty()) thread.context_stack.pop_back();
      return CUDA_SUCCESS;
    }
    if (contextFromHandle(s, ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (thread.context_stack.empty()) {
      thread.context_stack.push_back(ctx);
    } else {
      thread.context_stack.back() = ctx;
    }
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  return guarded(entry::cuCtxPushCurrent_v2, [&](State& s) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (contextFromHandle(s, ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    threadState(s).context_stack.push_back(ctx);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  return guarded(entry::cuCtxPopCurrent_v2, [&](State& s) {
    ThreadState& thread = threadState(s);
    if (thread.context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx != nullptr) *ctx = thread.context_stack.back();
    thread.context_stack.pop_back();
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuCtxGetDevice(CUdevice* device) {
  return guarded(entry::cuCtxGetDevice, [&](State& s) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    *device = ctx->device;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  return guarded(entry::cuCtxGetDevice_v2, [&](State& s) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUctx_st* target = nullptr;
    if (ctx == nullptr) {
      if (CUresult r = requireContext(s, &target)) return r;
    } else if ((target = contextFromHandle(s, ctx)) == nullptr) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    *device = target->device;
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult synchronizeContext(State& s, CUcontext handle) {
  CUctx_st* ctx = nullptr;
  if (handle == nullptr) {
    if (CUresult r = requireContext(s, &ctx)) return r;
  } else if ((ctx = contextFromHandle(s, handle)) == nullptr || ctx->refcount == 0) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (prohibitedDuringCapture(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  synchronizeDevice(s, ctx->device);
  return CUDA_SUCCESS;
}

}  // namespace

CUDADOUBLE_API CUresult cuCtxSynchronize(void) {
  return guarded(entry::cuCtxSynchronize, [&](State& s) { return synchronizeContext(s, nullptr); });
}

CUDADOUBLE_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  return guarded(entry::cuCtxSynchronize_v2, [&](State& s) { return synchronizeContext(s, ctx); });
}

// ---- plain memory ----

CUDADOUBLE_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return guarded(entry::cuMemGetInfo_v2, [&](State& s) {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    const Device& device = s.devices[ctx->device];
    *total = device.capacity;
    *free = device.capacity - consumption(s, ctx->device);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return guarded(entry::cuMemAlloc_v2, [&](State& s) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    if (prohibitedDuringCapture(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t size = 0;
    if (!roundUp(bytesize, kAllocationGranularity, &size)) return CUDA_ERROR_OUT_OF_MEMORY;
    Device& device = s.devices[ctx->device];
    const size_t consumed = consumption(s, ctx->device);
    if (size > device.capacity || consumed > device.capacity - size)
      return CUDA_ERROR_OUT_OF_MEMORY;
    void* p = mapMemory(size);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    s.plain.emplace(reinterpret_cast<uintptr_t>(p), PlainAllocation{ctx->device, bytesize, size});
    device.plain_bytes += size;
    ++device.plain_count;
    *dptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return guarded(entry::cuMemFree_v2, [&](State& s) {
    if (dptr == 0) return CUDA_SUCCESS;
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    if (prohibitedDuringCapture(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (auto it = s.plain.find(address(dptr)); it != s.plain.end()) {
      Device& device = s.devices[it->second.device];
      device.plain_bytes -= it->second.size;
      --device.plain_count;
      munmap(reinterpret_cast<void*>(it->first), it->second.size);
      if (it->second.ipc_fd >= 0) close(it->second.ipc_fd);  // importers keep their mappings
      s.plain.erase(it);
      return CUDA_SUCCESS;
    }
    if (auto it = s.pool_allocations.find(address(dptr)); it != s.pool_allocations.end()) {
      // Freed at once, not in stream order: the range is free for every stream.
      Pool& pool = *it->second.pool;
      Chunk& chunk = *it->second.chunk;
      const size_t offset = it->second.offset;
      const size_t size = it->second.size;
      forgetPoolAllocation(s, it);
      insertFreeRange(chunk, offset, size);
      discardPoolIfDone(s, pool);
      return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

namespace {

CUresult hostAlloc(State& s, void** pp, size_t bytesize) {
  if (pp == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  if (CUresult r = requireContext(s, &ctx)) return r;
  void* p = std::malloc(bytesize);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  s.host.emplace(reinterpret_cast<uintptr_t>(p), HostAllocation{ctx->device, bytesize});
  *pp = p;
  return CUDA_SUCCESS;
}

}  // namespace

CUDADOUBLE_API CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return guarded(entry::cuMemAllocHost_v2, [&](State& s) { return hostAlloc(s, pp, bytesize); });
}

CUDADOUBLE_API CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  (void)flags;
  return guarded(entry::cuMemHostAlloc, [&](State& s) { return hostAlloc(s, pp, bytesize); });
}

CUDADOUBLE_API CUresult cuMemFreeHost(void* p) {
  return guarded(entry::cuMemFreeHost, [&](State& s) {
    auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
    if (it == s.host.end()) return CUDA_ERROR_INVALID_VALUE;
    std::free(p);
    s.host.erase(it);
    return CUDA_SUCCESS;
  });
}

// ---- memory pools ----

CUDADOUBLE_API CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return guarded(entry::cuMemPoolCreate, [&](State& s) {
    if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !validDevice(s, props->location.id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto created = std::make_unique<Pool>();
    created->device = props->location.id;
    created->max_size = props->maxSize;
    *pool = created.get();
    s.pools.push_back(std::move(created));
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemPoolDestroy(CUmemoryPool handle) {
  return guarded(entry::cuMemPoolDestroy, [&](State& s) {
    Pool* pool = livePool(s, handle);
    if (pool == nullptr || pool->is_default) return CUDA_ERROR_INVALID_VALUE;
    for (Device& device : s.devices) {
      if (device.current_pool == pool) device.current_pool = device.default_pool;
    }
    pool->destroyed = true;
    discardPoolIfDone(s, *pool);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  return guarded(entry::cuDeviceGetDefaultMemPool, [&](State& s) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    *pool = s.devices[device].default_pool;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  return guarded(entry::cuDeviceGetMemPool, [&](State& s) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    *pool = s.devices[device].current_pool;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool handle) {
  return guarded(entry::cuDeviceSetMemPool, [&](State& s) {
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    Pool* pool = livePool(s, handle);
    if (pool == nullptr || pool->device != device) return CUDA_ERROR_INVALID_VALUE;
    s.devices[device].current_pool = pool;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemPoolTrimTo(CUmemoryPool handle, size_t minBytesToKeep) {
  return guarded(entry::cuMemPoolTrimTo, [&](State& s) {
    Pool* pool = livePool(s, handle);
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    settlePendingFrees(*pool, [](uint64_t) { return true; });
    releaseFullyFreeChunks(s, *pool,
                           [&](size_t reserved, size_t) { return reserved >= minBytesToKeep; });
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemPoolSetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                              void* value) {
  return guarded(entry::cuMemPoolSetAttribute, [&](State& s) {
    Pool* pool = livePool(s, handle);
    if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int as_int = attribute <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
                           ? *static_cast<const int*>(value)
                           : 0;
    const cuuint64_t as_u64 = attribute > CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
                                  ? *static_cast<const cuuint64_t*>(value)
                                  : 0;
    switch (attribute) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        pool->reuse_follow_event_dependencies = as_int;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        pool->reuse_allow_opportunistic = as_int;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse_allow_internal_dependencies = as_int;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->release_threshold = as_u64;
        return CUDA_SUCCESS;
      // High-water marks can only be reset, to the current value.
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (as_u64 != 0) return CUDA_ERROR_INVALID_VALUE;
        pool->reserved_high = pool->reserved;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (as_u64 != 0) return CUDA_ERROR_INVALID_VALUE;
        pool->used_high = pool->used;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

CUDADOUBLE_API CUresult cuMemPoolGetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                              void* value) {
  return guarded(entry::cuMemPoolGetAttribute, [&](State& s) {
    Pool* pool = livePool(s, handle);
    if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto* as_int = static_cast<int*>(value);
    auto* as_u64 = static_cast<cuuint64_t*>(value);
    switch (attribute) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        *as_int = pool->reuse_follow_event_dependencies;
        break;
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        *as_int = pool->reuse_allow_opportunistic;
        break;
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *as_int = pool->reuse_allow_internal_dependencies;
        break;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *as_u64 = pool->release_threshold;
        break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *as_u64 = pool->reserved;
        break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *as_u64 = pool->reserved_high;
        break;
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *as_u64 = pool->used;
        break;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *as_u64 = pool->used_high;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemPoolSetAccess(CUmemoryPool handle, const CUmemAccessDesc* map,
                                           size_t count) {
  return guarded(entry::cuMemPoolSetAccess, [&](State& s) {
    Pool* pool = livePool(s, handle);
    if (pool == nullptr || (map == nullptr && count != 0)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
          !validDevice(s, map[i].location.id)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    for (size_t i = 0; i < count; ++i) pool->peer_access[map[i].location.id] = map[i].flags;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool handle,
                                           CUmemLocation* location) {
  return guarded(entry::cuMemPoolGetAccess, [&](State& s) {
    Pool* pool = livePool(s, handle);
    if (pool == nullptr || flags == nullptr || location == nullptr ||
        location->type != CU_MEM_LOCATION_TYPE_DEVICE || !validDevice(s, location->id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto it = pool->peer_access.find(location->id);
    if (it != pool->peer_access.end()) {
      *flags = it->second;
    } else {
      *flags = location->id == pool->device ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                            : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult allocFromPoolAsync(State& s, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool handle,
                            CUstream stream_handle) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, stream_handle, &stream)) return r;
  Pool* pool = livePool(s, handle);
  if (pool == nullptr || pool->device != stream->device) return CUDA_ERROR_INVALID_VALUE;
  return poolAllocate(s, *pool, *stream, bytesize, dptr);
}

CUresult allocAsync(State& s, CUdeviceptr* dptr, size_t bytesize, CUstream stream_handle) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, stream_handle, &stream)) return r;
  return poolAllocate(s, *s.devices[stream->device].current_pool, *stream, bytesize, dptr);
}

CUresult freeAsync(State& s, CUdeviceptr dptr, CUstream stream_handle) {
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, stream_handle, &stream)) return r;
  if (auto plain = s.plain.find(address(dptr)); plain != s.plain.end()) {
    // A cuMemAlloc allocation may be freed in stream order too (seen on an H200 with
    // CUDA 13.0: cudaFreeAsync of a cudaMalloc pointer succeeds). Work here completes at
    // once, so it is freed at once.
    Device& device = s.devices[plain->second.device];
    device.plain_bytes -= plain->second.size;
    --device.plain_count;
    munmap(reinterpret_cast<void*>(plain->first), plain->second.size);
    s.plain.erase(plain);
    return CUDA_SUCCESS;
  }
  auto it = s.pool_allocations.find(address(dptr));
  if (it == s.pool_allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  Pool& pool = *it->second.pool;
  if (pool.device != stream->device) return CUDA_ERROR_INVALID_VALUE;
  Chunk& chunk = *it->second.chunk;
  chunk.unallocated.emplace(it->second.offset, Range{it->second.size, true, stream->id});
  forgetPoolAllocation(s, it);
  discardPoolIfDone(s, pool);
  return CUDA_SUCCESS;
}

}  // namespace

CUDADOUBLE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream stream) {
  return guarded(entry::cuMemAllocFromPoolAsync,
                 [&](State& s) { return allocFromPoolAsync(s, dptr, bytesize, pool, stream); });
}

CUDADOUBLE_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                     CUmemoryPool pool, CUstream stream) {
  return guarded(entry::cuMemAllocFromPoolAsync_ptsz,
                 [&](State& s) { return allocFromPoolAsync(s, dptr, bytesize, pool, stream); });
}

CUDADOUBLE_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return guarded(entry::cuMemAllocAsync,
                 [&](State& s) { return allocAsync(s, dptr, bytesize, stream); });
}

CUDADOUBLE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return guarded(entry::cuMemAllocAsync_ptsz,
                 [&](State& s) { return allocAsync(s, dptr, bytesize, stream); });
}

CUDADOUBLE_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return guarded(entry::cuMemFreeAsync, [&](State& s) { return freeAsync(s, dptr, stream); });
}

CUDADOUBLE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return guarded(entry::cuMemFreeAsync_ptsz, [&](State& s) { return freeAsync(s, dptr, stream); });
}

// ---- streams and events ----

namespace {

CUresult createStream(State& s, CUstream* out, unsigned int flags, int priority) {
  if (out == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUctx_st* ctx = nullptr;
  if (CUresult r = requireContext(s, &ctx)) return r;
  auto stream = std::make_unique<CUstream_st>();
  stream->id = s.next_stream_id++;
  stream->device = ctx->device;
  stream->flags = flags;
  stream->priority = priority;
  *out = stream.get();
  s.streams.emplace(stream.get(), std::move(stream));
  return CUDA_SUCCESS;
}

CUresult streamSynchronize(State& s, CUstream handle) {
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  if (stream->capture.active) {
    stream->capture.invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  synchronizeStream(s, *stream);
  return CUDA_SUCCESS;
}

CUresult streamQuery(State& s, CUstream handle) {
  CUstream_st* stream = nullptr;
  return resolveStream(s, handle, &stream);
}

CUresult streamGetDevice(State& s, CUstream handle, CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  *device = stream->device;
  return CUDA_SUCCESS;
}

CUresult streamGetCtx(State& s, CUstream handle, CUcontext* ctx, CUgreenCtx* green) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  *ctx = &s.contexts[stream->device];
  if (green != nullptr) *green = nullptr;
  return CUDA_SUCCESS;
}

CUresult streamGetFlags(State& s, CUstream handle, unsigned int* flags) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  *flags = stream->flags;
  return CUDA_SUCCESS;
}

CUresult streamWaitEvent(State& s, CUstream handle, CUevent event_handle) {
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  CUevent_st* event = nullptr;
  return resolveEvent(s, event_handle, &event);
}

CUresult eventRecord(State& s, CUevent event_handle, CUstream handle) {
  CUevent_st* event = nullptr;
  if (CUresult r = resolveEvent(s, event_handle, &event)) return r;
  CUstream_st* stream = nullptr;
  return resolveStream(s, handle, &stream);
}

}  // namespace

CUDADOUBLE_API CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  return guarded(entry::cuStreamCreate,
                 [&](State& s) { return createStream(s, stream, flags, 0); });
}

CUDADOUBLE_API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                                   int priority) {
  return guarded(entry::cuStreamCreateWithPriority,
                 [&](State& s) { return createStream(s, stream, flags, priority); });
}

CUDADOUBLE_API CUresult cuStreamDestroy_v2(CUstream handle) {
  return guarded(entry::cuStreamDestroy_v2, [&](State& s) {
    auto it = s.streams.find(handle);
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    // Work on a destroyed stream still completes, so its pending frees become free ranges;
    // no release-threshold pass, since nothing was synchronized.
    const CUstream_st& stream = *it->second;
    for (auto& pool : s.pools) {
      if (pool->device == stream.device) {
        settlePendingFrees(*pool, [&](uint64_t id) { return id == stream.id; });
      }
    }
    if (stream.capture.graph != nullptr) s.graphs.erase(stream.capture.graph);
    s.streams.erase(it);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuStreamSynchronize(CUstream stream) {
  return guarded(entry::cuStreamSynchronize,
                 [&](State& s) { return streamSynchronize(s, stream); });
}

CUDADOUBLE_API CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  return guarded(entry::cuStreamSynchronize_ptsz,
                 [&](State& s) { return streamSynchronize(s, stream); });
}

// The double runs no kernels: a launch checks its stream and function, and then reports that
// it is not supported (what the shim's tests need is the call, its stream and its result).
namespace {
CUresult launchKernel(State& s, CUfunction f, CUstream handle) {
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  return f == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_NOT_SUPPORTED;
}
}  // namespace

CUDADOUBLE_API CUresult cuLaunchKernel(CUfunction f, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, unsigned int,
                                       CUstream hStream, void**, void**) {
  return guarded(entry::cuLaunchKernel, [&](State& s) { return launchKernel(s, f, hStream); });
}

CUDADOUBLE_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int, unsigned int, unsigned int,
                                            unsigned int, unsigned int, unsigned int, unsigned int,
                                            CUstream hStream, void**, void**) {
  return guarded(entry::cuLaunchKernel_ptsz, [&](State& s) { return launchKernel(s, f, hStream); });
}

CUDADOUBLE_API CUresult cuStreamQuery(CUstream stream) {
  return guarded(entry::cuStreamQuery, [&](State& s) { return streamQuery(s, stream); });
}

CUDADOUBLE_API CUresult cuStreamQuery_ptsz(CUstream stream) {
  return guarded(entry::cuStreamQuery_ptsz, [&](State& s) { return streamQuery(s, stream); });
}

CUDADOUBLE_API CUresult cuStreamGetDevice(CUstream stream, CUdevice* device) {
  return guarded(entry::cuStreamGetDevice,
                 [&](State& s) { return streamGetDevice(s, stream, device); });
}

CUDADOUBLE_API CUresult cuStreamGetDevice_ptsz(CUstream stream, CUdevice* device) {
  return guarded(entry::cuStreamGetDevice_ptsz,
                 [&](State& s) { return streamGetDevice(s, stream, device); });
}

CUDADOUBLE_API CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  return guarded(entry::cuStreamGetCtx,
                 [&](State& s) { return streamGetCtx(s, stream, ctx, nullptr); });
}

CUDADOUBLE_API CUresult cuStreamGetCtx_ptsz(CUstream stream, CUcontext* ctx) {
  return guarded(entry::cuStreamGetCtx_ptsz,
                 [&](State& s) { return streamGetCtx(s, stream, ctx, nullptr); });
}

CUDADOUBLE_API CUresult cuStreamGetCtx_v2(CUstream stream, CUcontext* ctx, CUgreenCtx* green) {
  return guarded(entry::cuStreamGetCtx_v2,
                 [&](State& s) { return streamGetCtx(s, stream, ctx, green); });
}

CUDADOUBLE_API CUresult cuStreamGetCtx_v2_ptsz(CUstream stream, CUcontext* ctx, CUgreenCtx* green) {
  return guarded(entry::cuStreamGetCtx_v2_ptsz,
                 [&](State& s) { return streamGetCtx(s, stream, ctx, green); });
}

CUDADOUBLE_API CUresult cuStreamGetFlags(CUstream stream, unsigned int* flags) {
  return guarded(entry::cuStreamGetFlags,
                 [&](State& s) { return streamGetFlags(s, stream, flags); });
}

CUDADOUBLE_API CUresult cuStreamGetFlags_ptsz(CUstream stream, unsigned int* flags) {
  return guarded(entry::cuStreamGetFlags_ptsz,
                 [&](State& s) { return streamGetFlags(s, stream, flags); });
}

CUDADOUBLE_API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  (void)flags;
  return guarded(entry::cuStreamWaitEvent,
                 [&](State& s) { return streamWaitEvent(s, stream, event); });
}

CUDADOUBLE_API CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags) {
  (void)flags;
  return guarded(entry::cuStreamWaitEvent_ptsz,
                 [&](State& s) { return streamWaitEvent(s, stream, event); });
}

CUDADOUBLE_API CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  return guarded(entry::cuEventCreate, [&](State& s) {
    if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    auto created = std::make_unique<CUevent_st>();
    created->device = ctx->device;
    created->flags = flags;
    *event = created.get();
    s.events.emplace(created.get(), std::move(created));
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuEventRecord(CUevent event, CUstream stream) {
  return guarded(entry::cuEventRecord, [&](State& s) { return eventRecord(s, event, stream); });
}

CUDADOUBLE_API CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
  return guarded(entry::cuEventRecord_ptsz,
                 [&](State& s) { return eventRecord(s, event, stream); });
}

CUDADOUBLE_API CUresult cuEventSynchronize(CUevent event) {
  return guarded(entry::cuEventSynchronize, [&](State& s) {
    CUevent_st* found = nullptr;
    return resolveEvent(s, event, &found);
  });
}

CUDADOUBLE_API CUresult cuEventQuery(CUevent event) {
  return guarded(entry::cuEventQuery, [&](State& s) {
    CUevent_st* found = nullptr;
    return resolveEvent(s, event, &found);
  });
}

CUDADOUBLE_API CUresult cuEventDestroy_v2(CUevent event) {
  return guarded(entry::cuEventDestroy_v2, [&](State& s) {
    return s.events.erase(event) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

// ---- stream capture ----

namespace {

CUresult beginCapture(State& s, CUstream handle, CUstreamCaptureMode mode) {
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (isSpecialStream(handle)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  if (stream->capture.active) return CUDA_ERROR_ILLEGAL_STATE;
  auto graph = std::make_unique<CUgraph_st>();
  stream->capture.active = true;
  stream->capture.invalidated = false;
  stream->capture.mode = mode;
  stream->capture.thread = std::this_thread::get_id();
  stream->capture.id = s.next_capture_id++;
  stream->capture.graph = graph.get();
  graph->capture_id = stream->capture.id;
  s.graphs.emplace(graph.get(), std::move(graph));
  return CUDA_SUCCESS;
}

CUresult endCapture(State& s, CUstream handle, CUgraph* graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  Capture& capture = stream->capture;
  if (!capture.active) return CUDA_ERROR_ILLEGAL_STATE;
  if (capture.mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      capture.thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  const bool invalidated = capture.invalidated;
  if (invalidated) {
    s.graphs.erase(capture.graph);
    *graph = nullptr;
  } else {
    *graph = capture.graph;
  }
  stream->capture = Capture{};
  return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUstreamCaptureStatus captureStatus(const Capture& capture) {
  if (!capture.active) return CU_STREAM_CAPTURE_STATUS_NONE;
  return capture.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                             : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

CUresult isCapturing(State& s, CUstream handle, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  *status = captureStatus(stream->capture);
  return CUDA_SUCCESS;
}

CUresult getCaptureInfo(State& s, CUstream handle, CUstreamCaptureStatus* status, cuuint64_t* id,
                        CUgraph* graph, const CUgraphNode** dependencies,
                        const CUgraphEdgeData** edge_data, size_t* dependency_count) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult r = resolveStream(s, handle, &stream)) return r;
  const Capture& capture = stream->capture;
  *status = captureStatus(capture);
  // The double builds no graph nodes, so a capture never has dependencies to report.
  if (capture.active) {
    if (id != nullptr) *id = capture.id;
    if (graph != nullptr) *graph = capture.graph;
  }
  if (dependencies != nullptr) *dependencies = nullptr;
  if (edge_data != nullptr) *edge_data = nullptr;
  if (dependency_count != nullptr) *dependency_count = 0;
  return CUDA_SUCCESS;
}

}  // namespace

CUDADOUBLE_API CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return guarded(entry::cuStreamBeginCapture_v2,
                 [&](State& s) { return beginCapture(s, stream, mode); });
}

CUDADOUBLE_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return guarded(entry::cuStreamBeginCapture_v2_ptsz,
                 [&](State& s) { return beginCapture(s, stream, mode); });
}

CUDADOUBLE_API CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return guarded(entry::cuStreamEndCapture, [&](State& s) { return endCapture(s, stream, graph); });
}

CUDADOUBLE_API CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return guarded(entry::cuStreamEndCapture_ptsz,
                 [&](State& s) { return endCapture(s, stream, graph); });
}

CUDADOUBLE_API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  return guarded(entry::cuStreamIsCapturing,
                 [&](State& s) { return isCapturing(s, stream, status); });
}

CUDADOUBLE_API CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  return guarded(entry::cuStreamIsCapturing_ptsz,
                 [&](State& s) { return isCapturing(s, stream, status); });
}

CUDADOUBLE_API CUresult cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status,
                                                  cuuint64_t* id, CUgraph* graph,
                                                  const CUgraphNode** dependencies,
                                                  const CUgraphEdgeData** edge_data,
                                                  size_t* count) {
  return guarded(entry::cuStreamGetCaptureInfo_v3, [&](State& s) {
    return getCaptureInfo(s, stream, status, id, graph, dependencies, edge_data, count);
  });
}

CUDADOUBLE_API CUresult cuStreamGetCaptureInfo_v3_ptsz(
    CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
    const CUgraphNode** dependencies, const CUgraphEdgeData** edge_data, size_t* count) {
  return guarded(entry::cuStreamGetCaptureInfo_v3_ptsz, [&](State& s) {
    return getCaptureInfo(s, stream, status, id, graph, dependencies, edge_data, count);
  });
}

CUDADOUBLE_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return guarded(entry::cuThreadExchangeStreamCaptureMode, [&](State& s) {
    if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        *mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::swap(threadState(s).capture_mode, *mode);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuGraphDestroy(CUgraph graph) {
  return guarded(entry::cuGraphDestroy, [&](State& s) {
    for (const auto& [handle, stream] : s.streams) {
      // Still owned by its capture until cuStreamEndCapture hands it out.
      if (stream->capture.graph == graph) return CUDA_ERROR_INVALID_VALUE;
    }
    return s.graphs.erase(graph) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

// ---- copies and sets ----

CUDADOUBLE_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guarded(entry::cuMemcpy,
                 [&](State& s) { return copySync(s, dst, End::Unified, src, End::Unified, n); });
}

CUDADOUBLE_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guarded(entry::cuMemcpy_ptds,
                 [&](State& s) { return copySync(s, dst, End::Unified, src, End::Unified, n); });
}

CUDADOUBLE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return guarded(entry::cuMemcpyHtoD_v2, [&](State& s) {
    return copySync(s, dst, End::Device, hostAddress(src), End::Host, n);
  });
}

CUDADOUBLE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  return guarded(entry::cuMemcpyHtoD_v2_ptds, [&](State& s) {
    return copySync(s, dst, End::Device, hostAddress(src), End::Host, n);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return guarded(entry::cuMemcpyDtoH_v2, [&](State& s) {
    return copySync(s, hostAddress(dst), End::Host, src, End::Device, n);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  return guarded(entry::cuMemcpyDtoH_v2_ptds, [&](State& s) {
    return copySync(s, hostAddress(dst), End::Host, src, End::Device, n);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guarded(entry::cuMemcpyDtoD_v2,
                 [&](State& s) { return copySync(s, dst, End::Device, src, End::Device, n); });
}

CUDADOUBLE_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guarded(entry::cuMemcpyDtoD_v2_ptds,
                 [&](State& s) { return copySync(s, dst, End::Device, src, End::Device, n); });
}

CUDADOUBLE_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return guarded(entry::cuMemcpyAsync, [&](State& s) {
    return copyAsync(s, dst, End::Unified, src, End::Unified, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                           CUstream stream) {
  return guarded(entry::cuMemcpyAsync_ptsz, [&](State& s) {
    return copyAsync(s, dst, End::Unified, src, End::Unified, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n,
                                             CUstream stream) {
  return guarded(entry::cuMemcpyHtoDAsync_v2, [&](State& s) {
    return copyAsync(s, dst, End::Device, hostAddress(src), End::Host, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n,
                                                  CUstream stream) {
  return guarded(entry::cuMemcpyHtoDAsync_v2_ptsz, [&](State& s) {
    return copyAsync(s, dst, End::Device, hostAddress(src), End::Host, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n,
                                             CUstream stream) {
  return guarded(entry::cuMemcpyDtoHAsync_v2, [&](State& s) {
    return copyAsync(s, hostAddress(dst), End::Host, src, End::Device, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n,
                                                  CUstream stream) {
  return guarded(entry::cuMemcpyDtoHAsync_v2_ptsz, [&](State& s) {
    return copyAsync(s, hostAddress(dst), End::Host, src, End::Device, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                             CUstream stream) {
  return guarded(entry::cuMemcpyDtoDAsync_v2, [&](State& s) {
    return copyAsync(s, dst, End::Device, src, End::Device, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                  CUstream stream) {
  return guarded(entry::cuMemcpyDtoDAsync_v2_ptsz, [&](State& s) {
    return copyAsync(s, dst, End::Device, src, End::Device, n, stream);
  });
}

CUDADOUBLE_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  return guarded(entry::cuMemsetD8_v2, [&](State& s) { return setSync(s, dst, value, n, false); });
}

CUDADOUBLE_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n) {
  return guarded(entry::cuMemsetD8_v2_ptds,
                 [&](State& s) { return setSync(s, dst, value, n, false); });
}

CUDADOUBLE_API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
  return guarded(entry::cuMemsetD32_v2, [&](State& s) { return setSync(s, dst, value, n, true); });
}

CUDADOUBLE_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n) {
  return guarded(entry::cuMemsetD32_v2_ptds,
                 [&](State& s) { return setSync(s, dst, value, n, true); });
}

CUDADOUBLE_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                        CUstream stream) {
  return guarded(entry::cuMemsetD8Async,
                 [&](State& s) { return setAsync(s, dst, value, n, false, stream); });
}

CUDADOUBLE_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n,
                                             CUstream stream) {
  return guarded(entry::cuMemsetD8Async_ptsz,
                 [&](State& s) { return setAsync(s, dst, value, n, false, stream); });
}

CUDADOUBLE_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n,
                                         CUstream stream) {
  return guarded(entry::cuMemsetD32Async,
                 [&](State& s) { return setAsync(s, dst, value, n, true, stream); });
}

CUDADOUBLE_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n,
                                              CUstream stream) {
  return guarded(entry::cuMemsetD32Async_ptsz,
                 [&](State& s) { return setAsync(s, dst, value, n, true, stream); });
}

// ---- pointer attributes ----

CUDADOUBLE_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                              CUdeviceptr ptr) {
  return guarded(entry::cuPointerGetAttribute, [&](State& s) {
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The allocation holding ptr, within the bytes that were asked for.
    struct Found {
      CUmemorytype type;
      int device;
      uintptr_t start;
      size_t size;
      CUmemoryPool pool;
    };
    const uintptr_t p = address(ptr);
    auto containing = [&](const auto& table) {
      auto it = table.upper_bound(p);
      if (it == table.begin()) return table.end();
      --it;
      return p - it->first < it->second.requested ? it : table.end();
    };
    Found found{};
    if (auto it = containing(s.plain); it != s.plain.end()) {
      found = {CU_MEMORYTYPE_DEVICE, it->second.device, it->first, it->second.requested, nullptr};
    } else if (auto it = containing(s.pool_allocations); it != s.pool_allocations.end()) {
      found = {CU_MEMORYTYPE_DEVICE, it->second.pool->device, it->first, it->second.requested,
               it->second.pool};
    } else if (auto it = containing(s.host); it != s.host.end()) {
      found = {CU_MEMORYTYPE_HOST, it->second.device, it->first, it->second.requested, nullptr};
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data) = found.device;
        break;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned int*>(data) = found.type;
        break;
      case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *static_cast<CUmemoryPool*>(data) = found.pool;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *static_cast<CUdeviceptr*>(data) = found.start;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *static_cast<size_t*>(data) = found.size;
        break;
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext*>(data) = &s.contexts[found.device];
        break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *static_cast<CUdeviceptr*>(data) = ptr;
        break;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (found.type != CU_MEMORYTYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
        *static_cast<void**>(data) = reinterpret_cast<void*>(p);
        break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *static_cast<int*>(data) = 0;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

// ---- legacy IPC --------------------------------------------------------------------------------

namespace {

// The memfd behind an exported allocation, by its name: "cudadouble-ipc-<serial>".
std::string ipcName(uint64_t serial) {
  return "cudadouble-ipc-" + std::to_string(serial);
}

// An allocation's memory moved into a memfd mapped at the same address (once), so that another
// process can map it too.
CUresult makeShareable(State& s, PlainAllocation& a, uintptr_t base) {
  if (a.ipc_fd >= 0) return CUDA_SUCCESS;
  const uint64_t serial = s.next_ipc_serial++;
  const int fd = memfd_create(ipcName(serial).c_str(), MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_MAP_FAILED;
  void* at = reinterpret_cast<void*>(base);
  if (ftruncate(fd, static_cast<off_t>(a.size)) != 0 ||
      pwrite(fd, at, a.size, 0) != static_cast<ssize_t>(a.size) ||
      mmap(at, a.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  a.ipc_fd = fd;
  a.ipc_serial = serial;
  return CUDA_SUCCESS;
}

}  // namespace

// Exports a plain allocation (its base only): the same bytes for every call on the same live
// allocation, new ones for a new allocation at the same address. Pool and VMM memory, and
// interior pointers: CUDA_ERROR_INVALID_VALUE (the real driver's code for those is unchecked).
CUDADOUBLE_API CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return guarded(entry::cuIpcGetMemHandle, [&](State& s) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    auto it = s.plain.find(address(dptr));
    if (pHandle == nullptr || it == s.plain.end()) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = makeShareable(s, it->second, it->first)) return r;
    IpcHandleBytes h{};
    std::memcpy(h.magic, kIpcMagic, sizeof h.magic);
    h.pid = static_cast<int32_t>(getpid());
    h.fd = it->second.ipc_fd;
    h.serial = it->second.ipc_serial;
    h.size = it->second.size;
    h.device = it->second.device;
    std::memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
  });
}

// Opens another process's export: mapped at a new address; opened again in this process, the
// same address with one more reference. In the exporting process: CUDA_ERROR_INVALID_CONTEXT (as
// the real driver answers, reported by UCX); no such export (its process or allocation is gone,
// or the bytes are no handle of the double's): CUDA_ERROR_INVALID_HANDLE (unchecked on a GPU).
CUDADOUBLE_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                              unsigned int Flags) {
  return guarded(entry::cuIpcOpenMemHandle_v2, [&](State& s) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    if (pdptr == nullptr || (Flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    IpcHandleBytes h{};
    std::memcpy(&h, handle.reserved, sizeof h);
    if (std::memcmp(h.magic, kIpcMagic, sizeof h.magic) != 0 || h.size == 0)
      return CUDA_ERROR_INVALID_HANDLE;
    if (h.pid == static_cast<int32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
    for (auto& [base, opened] : s.ipc_opened) {
      if (opened.pid == h.pid && opened.serial == h.serial) {
        ++opened.count;
        *pdptr = static_cast<CUdeviceptr>(base);
        return CUDA_SUCCESS;
      }
    }
    const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
    char target[256] = {};
    const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
    const std::string expected = "/memfd:" + ipcName(h.serial) + " (deleted)";
    if (n <= 0 || expected != target) return CUDA_ERROR_INVALID_HANDLE;
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
    void* p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
    const int device = validDevice(s, h.device) ? h.device : ctx->device;
    s.ipc_opened.emplace(reinterpret_cast<uintptr_t>(p),
                         IpcOpened{device, static_cast<size_t>(h.size), h.pid, h.serial, 1});
    *pdptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  });
}

// One reference less; unmapped at none. Not an opened address: CUDA_ERROR_INVALID_VALUE.
CUDADOUBLE_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return guarded(entry::cuIpcCloseMemHandle, [&](State& s) {
    CUctx_st* ctx = nullptr;
    if (CUresult r = requireContext(s, &ctx)) return r;
    auto it = s.ipc_opened.find(address(dptr));
    if (it == s.ipc_opened.end()) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.count == 0) {
      munmap(reinterpret_cast<void*>(it->first), it->second.size);
      s.ipc_opened.erase(it);
    }
    return CUDA_SUCCESS;
  });
}

// ================================ control API ===================================================

// ---- virtual memory management ----------------------------------------------------------------

namespace {

constexpr size_t kVmmGranularity = 2u << 20;

bool validLocation(const State& s, const CUmemLocation& location) {
  return location.type == CU_MEM_LOCATION_TYPE_DEVICE && validDevice(s, location.id);
}

// The mapping that starts at `va`, or end().
std::map<uintptr_t, Mapping>::iterator mappingAt(State& s, uintptr_t va) {
  return s.mappings.find(va);
}

bool insideReservation(const State& s, uintptr_t va, size_t size) {
  auto it = s.reservations.upper_bound(va);
  if (it == s.reservations.begin()) return false;
  --it;
  return va >= it->first && va - it->first <= it->second && size <= it->second - (va - it->first);
}

bool overlapsMapping(const State& s, uintptr_t va, size_t size) {
  auto it = s.mappings.lower_bound(va);
  if (it != s.mappings.end() && it->first < va + size) return true;
  if (it != s.mappings.begin()) {
    --it;
    if (it->first + it->second.size > va) return true;
  }
  return false;
}

void dropPhysical(State& s, std::map<CUmemGenericAllocationHandle, Physical>::iterator it) {
  if (!it->second.imported) s.devices[it->second.device].vmm_bytes -= it->second.size;
  close(it->second.fd);
  s.physical.erase(it);
}

}  // namespace

CUDADOUBLE_API CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                      const CUmemAllocationProp* prop,
                                                      CUmemAllocationGranularity_flags) {
  return guarded(entry::cuMemGetAllocationGranularity, [&](State& s) {
    if (granularity == nullptr || prop == nullptr || !validLocation(s, prop->location))
      return CUDA_ERROR_INVALID_VALUE;
    *granularity = kVmmGranularity;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags) {
  return guarded(entry::cuMemAddressReserve, [&](State& s) {
    if (ptr == nullptr || size == 0 || size % kVmmGranularity != 0 || flags != 0 ||
        (alignment != 0 && alignment % kVmmGranularity != 0))
      return CUDA_ERROR_INVALID_VALUE;
    (void)addr;  // a hint only
    const size_t align = std::max(alignment, kVmmGranularity);
    // Reserve more and keep the aligned part.
    void* p =
        mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const uintptr_t raw = reinterpret_cast<uintptr_t>(p);
    const uintptr_t base = (raw + align - 1) / align * align;
    if (base > raw) munmap(p, base - raw);
    if (raw + size + align > base + size)
      munmap(reinterpret_cast<void*>(base + size), raw + size + align - (base + size));
    s.reservations.emplace(base, size);
    *ptr = static_cast<CUdeviceptr>(base);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded(entry::cuMemAddressFree, [&](State& s) {
    auto it = s.reservations.find(address(ptr));
    if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    if (overlapsMapping(s, it->first, size)) return CUDA_ERROR_INVALID_VALUE;  // still mapped
    munmap(reinterpret_cast<void*>(it->first), size);
    s.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  return guarded(entry::cuMemCreate, [&](State& s) {
    if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 ||
        size % kVmmGranularity != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        !validLocation(s, prop->location))
      return CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
        prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      return CUDA_ERROR_NOT_SUPPORTED;
    const int d = prop->location.id;
    const size_t consumed = consumption(s, d);
    if (size > s.devices[d].capacity || consumed > s.devices[d].capacity - size)
      return CUDA_ERROR_OUT_OF_MEMORY;
    // The name carries the device, for an importer of the descriptor (vmmDeviceOf).
    const std::string name = "cudadouble-vmm-device-" + std::to_string(d);
    const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const CUmemGenericAllocationHandle h = s.next_handle++;
    Physical physical{d, size, fd};
    physical.exportable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    s.physical.emplace(h, physical);
    s.devices[d].vmm_bytes += size;
    *handle = h;
    return CUDA_SUCCESS;
  });
}

namespace {

// The device of a descriptor that cuMemCreate made (in this or another process: its memfd's
// name says), or -1 for any other descriptor.
int vmmDeviceOf(int fd) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  char target[256] = {};
  const ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return -1;
  int device = -1;
  return std::sscanf(target, "/memfd:cudadouble-vmm-device-%d", &device) == 1 ? device : -1;
}

}  // namespace

// A POSIX file descriptor of physical memory made exportable at its creation: a new descriptor,
// close-on-exec, which the caller owns (the real driver's close-on-exec state is not documented).
CUDADOUBLE_API CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                     CUmemGenericAllocationHandle handle,
                                                     CUmemAllocationHandleType handleType,
                                                     unsigned long long flags) {
  return guarded(entry::cuMemExportToShareableHandle, [&](State& s) {
    auto it = s.physical.find(handle);
    if (shareableHandle == nullptr || flags != 0 || it == s.physical.end() || it->second.released ||
        handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !it->second.exportable)
      return CUDA_ERROR_INVALID_VALUE;
    const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
  });
}

// Physical memory from a descriptor that cuMemExportToShareableHandle gave (any process): a new
// handle to the same memory, which counts toward no device's consumption here (it is the
// exporter's). The caller keeps its descriptor.
CUDADOUBLE_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                       void* osHandle,
                                                       CUmemAllocationHandleType shHandleType) {
  return guarded(entry::cuMemImportFromShareableHandle, [&](State& s) {
    const int given = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
    if (handle == nullptr || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      return CUDA_ERROR_INVALID_VALUE;
    const int device = vmmDeviceOf(given);
    struct stat st {};
    if (device < 0 || fstat(given, &st) != 0 || st.st_size <= 0 ||
        static_cast<size_t>(st.st_size) % kVmmGranularity != 0)
      return CUDA_ERROR_INVALID_HANDLE;
    if (!validDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    const int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUmemGenericAllocationHandle h = s.next_handle++;
    Physical physical{device, static_cast<size_t>(st.st_size), fd};
    physical.exportable = true;
    physical.imported = true;
    s.physical.emplace(h, physical);
    *handle = h;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded(entry::cuMemRelease, [&](State& s) {
    auto it = s.physical.find(handle);
    if (it == s.physical.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.mappings > 0) {
      it->second.released = true;  // goes with its last mapping
    } else {
      dropPhysical(s, it);
    }
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return guarded(entry::cuMemMap, [&](State& s) {
    auto it = s.physical.find(handle);
    const uintptr_t va = address(ptr);
    if (it == s.physical.end() || it->second.released || flags != 0 || offset != 0 ||
        size != it->second.size || va % kVmmGranularity != 0 || !insideReservation(s, va, size) ||
        overlapsMapping(s, va, size))
      return CUDA_ERROR_INVALID_VALUE;
    void* p = mmap(reinterpret_cast<void*>(va), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                   it->second.fd, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    ++it->second.mappings;
    s.mappings.emplace(va, Mapping{size, handle});
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                       size_t count) {
  return guarded(entry::cuMemSetAccess, [&](State& s) {
    if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      if (!validLocation(s, desc[i].location)) return CUDA_ERROR_INVALID_DEVICE;
    }
    // The range must be covered by whole mappings that follow each other.
    const uintptr_t va = address(ptr);
    auto it = mappingAt(s, va);
    uintptr_t at = va;
    std::vector<Mapping*> covered;
    while (at < va + size) {
      if (it == s.mappings.end() || it->first != at) return CUDA_ERROR_INVALID_VALUE;
      covered.push_back(&it->second);
      at += it->second.size;
      ++it;
    }
    if (at != va + size) return CUDA_ERROR_INVALID_VALUE;
    const bool rw = desc[count - 1].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (mprotect(reinterpret_cast<void*>(va), size, rw ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    for (Mapping* m : covered) m->accessible = rw;
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded(entry::cuMemUnmap, [&](State& s) {
    const uintptr_t va = address(ptr);
    auto it = mappingAt(s, va);
    uintptr_t at = va;
    std::vector<std::map<uintptr_t, Mapping>::iterator> covered;
    while (at < va + size) {
      if (it == s.mappings.end() || it->first != at) return CUDA_ERROR_INVALID_VALUE;
      covered.push_back(it);
      at += it->second.size;
      ++it;
    }
    if (at != va + size) return CUDA_ERROR_INVALID_VALUE;
    // Back to reserved address space (the file's pages stay with the file).
    mmap(reinterpret_cast<void*>(va), size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    for (auto m : covered) {
      auto phys = s.physical.find(m->second.handle);
      --phys->second.mappings;
      if (phys->second.released && phys->second.mappings == 0) dropPhysical(s, phys);
      s.mappings.erase(m);
    }
    return CUDA_SUCCESS;
  });
}

CUDADOUBLE_API void cudadouble_reset(int devices, size_t capacity_per_device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  start(rawState(), devices, capacity_per_device);
  for (auto& counter : g_calls) counter.store(0, std::memory_order_relaxed);
}

CUDADOUBLE_API int cudadouble_device_stats(int device, struct cudadouble_device_stats* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = lockedState();
  if (out == nullptr || !validDevice(s, device)) return -1;
  const Device& dev = s.devices[device];
  *out = {};
  out->consumption = consumption(s, device);
  out->capacity = dev.capacity;
  out->plain_count = dev.plain_count;
  out->plain_bytes = dev.plain_bytes;
  out->vmm_bytes = dev.vmm_bytes;
  for (const auto& [base, m] : s.mappings) {
    if (s.physical.at(m.handle).device == device) out->vmm_mapped_bytes += m.size;
  }
  for (const auto& pool : s.pools) {
    if (pool->device != device) continue;
    if (!pool->is_default && !pool->destroyed) ++out->pool_count;
    for (const auto& chunk : pool->chunks) {
      for (const auto& [offset, range] : chunk->unallocated) {
        if (range.pending) ++out->pending_free_count;
      }
    }
  }
  return 0;
}

CUDADOUBLE_API void cudadouble_fault() {
  std::lock_guard<std::mutex> lock(g_mutex);
  rawState().faulted = true;
}

CUDADOUBLE_API unsigned long long cudadouble_call_count(const char* name) {
  if (name == nullptr) return 0;
  for (size_t i = 0; i < entry::kCount; ++i) {
    if (std::strcmp(kEntryNames[i], name) == 0) return g_calls[i].load(std::memory_order_relaxed);
  }
  return 0;
}

// ================================ symbol table ==================================================

namespace {

struct ExportedFunction {
  const char* name;
  void* address;
};

// Built from the definitions above rather than looked up with dlsym: a preloaded dlsym hook
// (the shim has one) must not be able to hand its own hooks back through the driver, which would
// make the shim's "real" functions point at itself. Linked with -Bsymbolic-functions, so these
// are the double's own definitions even when a preloaded library exports the same names.
#define CUDADOUBLE_TABLE_ROW(name) {#name, reinterpret_cast<void*>(&name)},
const ExportedFunction kExportedFunctions[] = {CUDADOUBLE_ENTRY_POINTS(CUDADOUBLE_TABLE_ROW)};
#undef CUDADOUBLE_TABLE_ROW

void* exportedFunction(const char* name) {
  for (const ExportedFunction& f : kExportedFunctions) {
    if (std::strcmp(f.name, name) == 0) return f.address;
  }
  return nullptr;
}

}  // namespace
