#include "ipc_share.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace poolshim {

namespace {

constexpr char kMagic[8] = {'\x7f', 'p', 'o', 'o', 'l', 's', 'h', '1'};

struct HandleBytes {
  char magic[8];
  std::int32_t pid;
  std::uint32_t zero;
  std::uint64_t token;
  std::uint64_t id;
  char rest[IpcShare::kHandleBytes - 32];
};
static_assert(sizeof(HandleBytes) == IpcShare::kHandleBytes, "a legacy IPC handle's size");

// A request names one chunk of an export's pages (the broker sends at most 64 descriptors at a
// time): the export id in the low 48 bits, the chunk above.
constexpr int kChunkShift = 48;
constexpr std::uint64_t kIdMask = (std::uint64_t{1} << kChunkShift) - 1;
constexpr std::uint32_t kChunk = 64;
// Pages of one export at most (80 GiB at the default 20 MiB page).
constexpr std::size_t kMaxPages = 4096;

// What a chunk's reply carries besides its descriptors.
struct Wire {
  std::uint64_t page;    // bytes of each page
  std::uint64_t offset;  // of the block in its first page
  std::uint64_t size;    // of the block
  std::uint32_t count;   // pages under the block, in all chunks
  std::uint32_t first;   // index of this chunk's first page
};

}  // namespace

IpcShare::IpcShare(const DriverApi& driver, std::string broker_dir)
    : driver_(driver), broker_(std::move(broker_dir)) {}

IpcShare::~IpcShare() {
  broker_.stop();
}

bool IpcShare::ours(const void* handle) {
  return std::memcmp(handle, kMagic, sizeof kMagic) == 0;
}

bool IpcShare::export_block(const Block& block, void* handle, std::string* why) {
  if (!broker_.start(
          [this](std::uint64_t request, IpcBroker::Reply* out) { return lookup(request, out); },
          why)) {
    return false;
  }
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ids_.find(block.ptr);
    if (it != ids_.end()) {
      id = it->second;
    } else {
      id = next_id_++ & kIdMask;
      ids_.emplace(block.ptr, id);
      exports_.emplace(id, block);
    }
  }
  HandleBytes h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.pid = static_cast<std::int32_t>(getpid());
  h.token = broker_.token();
  h.id = id;
  std::memcpy(handle, &h, sizeof h);
  return true;
}

void IpcShare::forget(CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ids_.find(ptr);
  if (it == ids_.end()) return;
  exports_.erase(it->second);
  ids_.erase(it);
}

bool IpcShare::lookup(std::uint64_t request, IpcBroker::Reply* out) {
  const std::uint64_t id = request & kIdMask;
  const std::uint64_t chunk = request >> kChunkShift;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = exports_.find(id);
  if (it == exports_.end()) return false;
  const Block& e = it->second;
  std::vector<CUmemGenericAllocationHandle> pages(kMaxPages);
  const std::size_t count = e.pages->handles(e.ptr, e.size, pages.data(), pages.size());
  if (count == 0 || chunk * kChunk >= count) return false;
  const std::uint64_t page = e.pages->page();
  const CUdeviceptr first_page = e.pages->base() + (e.ptr - e.pages->base()) / page * page;
  const auto first = static_cast<std::uint32_t>(chunk * kChunk);
  const std::uint32_t end =
      std::min<std::uint32_t>(first + kChunk, static_cast<std::uint32_t>(count));
  ScopedContext ctx(driver_, e.context);
  for (std::uint32_t i = first; i < end; ++i) {
    int fd = -1;
    if (driver_.cuMemExportToShareableHandle(
            &fd, pages[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) {
      for (int made : out->fds) ::close(made);
      out->fds.clear();
      return false;
    }
    out->fds.push_back(fd);
  }
  const Wire wire{page, e.ptr - first_page, e.size, static_cast<std::uint32_t>(count), first};
  out->payload.assign(reinterpret_cast<const char*>(&wire), sizeof wire);
  return true;
}

CUresult IpcShare::open(const void* handle, CUdeviceptr* out) {
  HandleBytes h;
  std::memcpy(&h, handle, sizeof h);
  if (h.pid == static_cast<std::int32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (opened_again(h.pid, h.id, out)) return CUDA_SUCCESS;
  }
  // Fetched without the lock: the exporter may take a while, and it may be this process's
  // own child asking this process's broker at the same time.
  std::vector<int> fds;
  Wire wire{};
  bool ok = true;
  for (std::uint64_t chunk = 0; ok; ++chunk) {
    IpcBroker::Reply reply;
    ok = (h.id & ~kIdMask) == 0 &&
         broker_.fetch(h.pid, h.token, h.id | chunk << kChunkShift, &reply) == IpcBroker::Fetch::ok;
    Wire got{};
    if (ok && reply.payload.size() == sizeof got)
      std::memcpy(&got, reply.payload.data(), sizeof got);
    ok = ok && got.page > 0 && got.count > 0 && got.count <= kMaxPages && got.first == fds.size() &&
         !reply.fds.empty() && (chunk == 0 || (got.page == wire.page && got.count == wire.count));
    fds.insert(fds.end(), reply.fds.begin(), reply.fds.end());
    if (!ok) break;
    wire = got;
    if (fds.size() >= wire.count) break;
  }
  ok = ok && fds.size() == wire.count && wire.offset + wire.size <= wire.count * wire.page;
  Import import;
  CUresult r = ok ? map_import(fds, wire.page, &import) : CUDA_ERROR_INVALID_HANDLE;
  for (int fd : fds) ::close(fd);
  if (r != CUDA_SUCCESS) return r;
  import.pid = h.pid;
  import.id = h.id;
  import.refs = 1;
  const CUdeviceptr ptr = import.va + wire.offset;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Another thread may have opened the same export meanwhile: one mapping, as natively.
    if (opened_again(h.pid, h.id, out)) {
      unmap_import(import);
      return CUDA_SUCCESS;
    }
    imports_.emplace(ptr, std::move(import));
  }
  *out = ptr;
  return CUDA_SUCCESS;
}

bool IpcShare::opened_again(pid_t pid, std::uint64_t id, CUdeviceptr* out) {
  for (auto& [ptr, import] : imports_) {
    if (import.pid == pid && import.id == id) {
      ++import.refs;
      *out = ptr;
      return true;
    }
  }
  return false;
}

CUresult IpcShare::map_import(const std::vector<int>& fds, std::uint64_t page, Import* import) {
  CUdevice device = 0;
  if (CUresult r = driver_.cuCtxGetDevice(&device)) return r;
  import->page = page;
  import->span = page * fds.size();
  CUresult r = driver_.cuMemAddressReserve(&import->va, import->span, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    import->va = 0;
    return r;
  }
  for (std::size_t i = 0; i < fds.size() && r == CUDA_SUCCESS; ++i) {
    CUmemGenericAllocationHandle mem = 0;
    r = driver_.cuMemImportFromShareableHandle(
        &mem, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i])),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) break;
    import->handles.push_back(mem);
    r = driver_.cuMemMap(import->va + i * page, page, 0, mem, 0);
    if (r != CUDA_SUCCESS) {
      driver_.cuMemRelease(mem);
      import->handles.pop_back();
    }
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = driver_.cuMemSetAccess(import->va, import->span, &access, 1);
  }
  if (r != CUDA_SUCCESS) unmap_import(*import);
  return r;
}

void IpcShare::unmap_import(const Import& import) {
  for (std::size_t i = 0; i < import.handles.size(); ++i) {
    driver_.cuMemUnmap(import.va + i * import.page, import.page);
    driver_.cuMemRelease(import.handles[i]);
  }
  if (import.va != 0) driver_.cuMemAddressFree(import.va, import.span);
}

bool IpcShare::close(CUdeviceptr ptr, CUresult* result) {
  Import gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = imports_.find(ptr);
    if (it == imports_.end()) return false;
    *result = CUDA_SUCCESS;
    if (--it->second.refs > 0) return true;
    gone = std::move(it->second);
    imports_.erase(it);
  }
  unmap_import(gone);
  return true;
}

void IpcShare::forget_in_child() {
  // The exports and imports are the parent's; a forked child passes every call through (the
  // shim's fork handler), so only the listening socket needs closing here.
  broker_.forget_in_child();
}

std::size_t IpcShare::exports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exports_.size();
}

std::size_t IpcShare::imports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return imports_.size();
}

}  // namespace poolshim
