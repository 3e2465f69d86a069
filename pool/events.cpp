#include "events.h"

namespace poolshim {

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
