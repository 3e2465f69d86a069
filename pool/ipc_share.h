// IpcShare: legacy CUDA IPC of pooled memory (issue 14, DESIGN §10). Memory of a cudaMemPool
// cannot be exported with cuIpcGetMemHandle; a block of a paged arena lies on pages made with
// cuMemCreate, which can travel to another process as POSIX descriptors. So an export of such
// a block writes poolshim's own 64-byte handle, and a process under poolshim that opens it
// fetches the pages' descriptors from the exporter's IpcBroker and maps them:
//
//   handle: magic (8 bytes) | exporter's pid (4) | 0 (4) | broker token (8) | export id (8) | 0
//
// The same live block gives the same bytes (PyTorch uses them as a cache key); a new block at
// the same address gets a new id, as cuIpcGetMemHandle promises. Opening a handle twice in one
// process gives the same address with one more reference; closing its last reference unmaps
// and releases the imported memory. A block freed while another process has it open keeps its
// physical pages alive there (the importer holds its own handles to them); what the exporter
// writes to them afterwards is seen there, as with freed memory under native legacy IPC.
//
// Locking: one mutex over the exports and imports, taken by exports, opens, closes, frees of
// exported blocks (never of others: the Router's table marks exported blocks) and the broker's
// lookups; under it a lookup takes the page map's lock (PageMap::handles), never the reverse.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_api.h"
#include "ipc_broker.h"
#include "page_map.h"

namespace poolshim {

class IpcShare {
 public:
  /// A pooled block to export: its address and size, the context of its device, and the page
  /// map of the paged arena that holds it.
  struct Block {
    CUdeviceptr ptr = 0;
    std::uint64_t size = 0;
    CUcontext context = nullptr;
    const PageMap* pages = nullptr;
  };

  static constexpr std::size_t kHandleBytes = 64;

  /// `broker_dir`: where the brokers' sockets live (empty: /tmp/poolshim-<uid>).
  IpcShare(const DriverApi& driver, std::string broker_dir = "");
  ~IpcShare();
  IpcShare(const IpcShare&) = delete;
  IpcShare& operator=(const IpcShare&) = delete;

  /// Whether the 64 bytes at `handle` are a handle this class writes.
  static bool ours(const void* handle);

  /// Writes the handle of `block` to `handle` (64 bytes), starting the broker at the first
  /// export. False, with `why`, when the broker cannot start.
  bool export_block(const Block& block, void* handle, std::string* why);
  /// An exported block is freed (or its device reset): its handle opens nothing from now on.
  void forget(CUdeviceptr ptr);

  /// Opens a handle of ours in the current context: the native answers for a handle of this
  /// process (CUDA_ERROR_INVALID_CONTEXT) and for one no live export answers
  /// (CUDA_ERROR_INVALID_HANDLE: its process or block is gone, or the bytes are forged).
  CUresult open(const void* handle, CUdeviceptr* out);
  /// Closes one reference of an address open() gave: true, with the result; false when the
  /// address is not one of ours (the real function answers).
  bool close(CUdeviceptr ptr, CUresult* result);

  /// In a forked child: the broker's socket is the parent's (IpcBroker::forget_in_child).
  void forget_in_child();
  /// Stops the broker (process exit).
  void stop() { broker_.stop(); }

  std::size_t exports() const;
  std::size_t imports() const;
  const IpcBroker& broker() const { return broker_; }

 private:
  struct Import {
    CUdeviceptr va = 0;  // the reserved range, count pages
    std::uint64_t span = 0;
    std::uint64_t page = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    pid_t pid = 0;
    std::uint64_t id = 0;
    int refs = 0;
  };

  /// An import of export `id` of `pid` already mapped here: one more reference, its address in
  /// `out`, and true. Under mutex_.
  bool opened_again(pid_t pid, std::uint64_t id, CUdeviceptr* out);
  /// The broker's lookup: the descriptors of one chunk of an export's pages.
  bool lookup(std::uint64_t request, IpcBroker::Reply* out);
  /// Maps the pages whose descriptors arrived; undoes its work on failure.
  CUresult map_import(const std::vector<int>& fds, std::uint64_t page, Import* import);
  void unmap_import(const Import& import);

  const DriverApi& driver_;
  IpcBroker broker_;
  mutable std::mutex mutex_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Block> exports_;    // by export id
  std::unordered_map<CUdeviceptr, std::uint64_t> ids_;  // live exported block -> its id
  std::map<CUdeviceptr, Import> imports_;               // by the address open() returned
};

}  // namespace poolshim
