// The application's non-blocking streams, as `ordered` frees need them (DESIGN §3): the legacy
// default stream orders every blocking stream, but a non-blocking stream's work is ordered
// before a free only through an event recorded on that stream. Streams are added and removed
// by the stream hooks (rare, exclusive lock); ordered frees walk a device's list under a
// shared lock, so that frees on many threads do not serialize, and a stream cannot be
// destroyed while a free records on it.
#pragma once

#include <cuda.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace poolshim {

class StreamRegistry {
 public:
  struct Entry {
    CUstream stream = nullptr;
    int device = -1;
    CUevent event = nullptr;  // made with the stream (free mode ordered); null if that failed
  };

  /// A non-blocking stream was created.
  void add(const Entry& entry);
  /// The stream is being destroyed: removes it and returns its entry (false if unknown).
  bool remove(CUstream stream, Entry* out) {
    return remove(stream, out, [](const Entry&) {});
  }
  /// As remove, calling `last_use(entry)` first under the exclusive lock: no ordered free or
  /// fence (which walk the list under the shared lock) can run between it and the removal, so
  /// none can miss the stream's last work.
  template <typename F>
  bool remove(CUstream stream, Entry* out, F&& last_use) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->stream != stream) continue;
      last_use(static_cast<const Entry&>(*it));
      *out = *it;
      if (it->event == nullptr) eventless_.fetch_sub(1, std::memory_order_release);
      entries_.erase(it);
      listed_.fetch_sub(1, std::memory_order_seq_cst);
      return true;
    }
    return false;
  }
  /// After a device reset every stream and event of the device is gone: forget them (no
  /// driver call: their handles are no longer valid).
  void drop_device(int device);
  /// Calls `visit(entry)` for each stream of `device` with the shared lock held; stops at the
  /// first visit that returns false and returns false then.
  template <typename F>
  bool for_each(int device, F&& visit) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    for (const auto& e : entries_) {
      if (e.device == device && !visit(e)) return false;
    }
    return true;
  }
  std::size_t size() const;
  /// The number of entries without taking the lock (tests, from inside remove's callback).
  std::size_t size_unlocked_for_tests() const { return entries_.size(); }
  /// Whether any non-blocking stream is listed, without the lock. Sequentially consistent with
  /// add(): a thread that sets a flag and then finds none listed, and a thread that adds a
  /// stream and then reads the flag, cannot both miss each other (Router::legacy_reuse).
  bool any_listed() const { return listed_.load(std::memory_order_seq_cst) > 0; }
  /// Streams listed without an event: work on them cannot be ordered before a free.
  bool has_eventless() const { return eventless_.load(std::memory_order_acquire) > 0; }

  /// Stream creation is seen by the hooks (directly or through cuGetProcAddress): only then
  /// can an `ordered` free trust the list to be complete.
  void mark_observed() { observed_.store(true, std::memory_order_release); }
  bool observed() const { return observed_.load(std::memory_order_acquire); }
  /// The application created a context of its own (cuCtxCreate, a green context), or a
  /// stream the shim could not place: work there is not covered by ordered frees.
  void mark_foreign_context() { foreign_context_.store(true, std::memory_order_release); }
  bool foreign_context() const { return foreign_context_.load(std::memory_order_acquire); }
  /// The application made a stream of its own (blocking or not), or uses the per-thread default
  /// stream: the legacy default stream is no longer the only one whose order counts. True on the
  /// first call. Sequentially consistent, as any_listed().
  bool mark_not_legacy_only() {
    return !not_legacy_only_.exchange(true, std::memory_order_seq_cst);
  }
  bool legacy_only() const { return !not_legacy_only_.load(std::memory_order_seq_cst); }

 private:
  mutable std::shared_mutex mutex_;
  std::vector<Entry> entries_;
  std::atomic<int> eventless_{0};  // entries whose event is null
  std::atomic<int> listed_{0};     // entries, read without the lock
  std::atomic<bool> observed_{false};
  std::atomic<bool> foreign_context_{false};
  std::atomic<bool> not_legacy_only_{false};
};

}  // namespace poolshim
