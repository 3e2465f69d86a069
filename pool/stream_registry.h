// The application's non-blocking streams, as `ordered` frees need them (DESIGN §3): the legacy
// default stream orders every blocking stream, but a non-blocking stream's work is ordered
// before a free only through an event recorded on that stream. Streams are added and removed
// by the stream hooks (rare); frees walk the device's list under the lock.
#pragma once

#include <cuda.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace poolshim {

class StreamRegistry {
 public:
  struct Entry {
    CUstream stream = nullptr;
    int device = -1;
    CUevent event = nullptr;  // created at the first ordered free that needs it
  };

  /// A non-blocking stream of `device` was created.
  void add(CUstream stream, int device);
  /// The stream is being destroyed: removes it and returns its entry (false if unknown).
  bool remove(CUstream stream, Entry* out);
  /// Calls `visit(entry)` for each stream of `device`, under the lock.
  template <typename F>
  void for_each(int device, F&& visit) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& e : entries_) {
      if (e.device == device) visit(e);
    }
  }
  std::size_t size() const;

  /// Stream creation is seen by the hooks (directly or through cuGetProcAddress): only then
  /// can an `ordered` free trust the list to be complete.
  void mark_observed() { observed_.store(true, std::memory_order_release); }
  bool observed() const { return observed_.load(std::memory_order_acquire); }
  /// The application created a context of its own (cuCtxCreate): work in it is not covered.
  void mark_foreign_context() { foreign_context_.store(true, std::memory_order_release); }
  bool foreign_context() const { return foreign_context_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::atomic<bool> observed_{false};
  std::atomic<bool> foreign_context_{false};
};

}  // namespace poolshim
