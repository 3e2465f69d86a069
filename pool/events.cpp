#include "events.h"

namespace poolshim {

OomVerdict oom_verdict_of(const OomReport& r) {
  const std::uint64_t unused = r.reserved > r.used ? r.reserved - r.used : 0;
  // Memory held by the pool, unused, but not in a piece that fits: fragmentation.
  if (unused >= r.request) return OomVerdict::fragmentation;
  // The pool would have to grow past the cap: what the pool holds unused does not fit the
  // request (above), and the cap leaves less than the request to reserve. (Unused memory in
  // pieces counts against the cap too: a partial page of the paged arena, say.)
  const std::uint64_t room = r.cap > r.reserved ? r.cap - r.reserved : 0;
  if (r.cap > 0 && room < r.request) return OomVerdict::cap;
  // The device had the memory free, but not usable for this request.
  if (r.device_info_valid && r.device_free >= r.request) return OomVerdict::fragmentation;
  return OomVerdict::exhausted;
}

std::uint64_t EventQueue::push(Event e) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (queue_.size() >= kCapacity) {
    ++dropped_;
    return 0;
  }
  e.ticket = next_ticket_++;
  const std::uint64_t ticket = e.ticket;
  queue_.push_back(std::move(e));
  work_.notify_one();
  return ticket;
}

std::uint64_t EventQueue::push_warning(std::string text) {
  Event e;
  e.kind = Event::Kind::warning;
  e.text = std::move(text);
  return push(std::move(e));
}

std::uint64_t EventQueue::push_oom(const OomReport& report) {
  Event e;
  e.kind = Event::Kind::oom;
  e.oom = report;
  return push(std::move(e));
}

bool EventQueue::wait_written(std::uint64_t ticket, std::chrono::milliseconds timeout) {
  if (ticket == 0) return false;
  std::unique_lock<std::mutex> lock(mutex_);
  return written_.wait_for(lock, timeout, [&] { return written_ticket_ >= ticket; });
}

void EventQueue::drain(std::vector<Event>& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!queue_.empty()) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

void EventQueue::mark_written(std::uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ticket > written_ticket_) written_ticket_ = ticket;
  written_.notify_all();
}

bool EventQueue::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_.wait_for(lock, timeout, [&] { return stop_ || !queue_.empty(); });
  return stop_;
}

void EventQueue::request_stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_ = true;
  work_.notify_all();
}

bool EventQueue::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !queue_.empty();
}

std::uint64_t EventQueue::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

}  // namespace poolshim
