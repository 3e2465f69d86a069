#include "background.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "clock.h"
#include "units.h"

namespace poolshim {

namespace {

// Ticks at most this far apart, whatever sample_ms is, so idle trims and events stay prompt.
constexpr std::uint64_t kMaxTickMs = 250;
// Below this much unused memory above the threshold, a trim goes straight to the threshold.
constexpr std::uint64_t kTrimStepFloor = 4ULL << 20;

void print_stderr(const std::string& line) {
  const std::string text = "poolshim: " + line + "\n";
  const ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace

BackgroundWorker::BackgroundWorker(Router& router, EventQueue& events, ProcessInfo info,
                                   std::vector<std::string> startup_warnings)
    : router_(router),
      events_(events),
      info_(std::move(info)),
      startup_warnings_(std::move(startup_warnings)) {}

BackgroundWorker::~BackgroundWorker() {
  if (thread_.joinable()) finish(ExitExtras{});
}

void BackgroundWorker::start() {
  std::lock_guard<std::mutex> lock(finish_mutex_);
  if (started_ || finished_) return;
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void BackgroundWorker::finish(ExitExtras extras) {
  {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    finished_ = true;
    exit_extras_ = std::move(extras);
    if (!started_) return;
  }
  events_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void BackgroundWorker::write(const std::string& record) {
  log_.write(record);
}

void BackgroundWorker::begin() {
  const std::string& path = info_.log_path;
  if (!path.empty()) {
    const std::string error = log_.open(path);
    if (!error.empty()) print_stderr("warning: " + error + "; running without a log");
  }
  if (log_.is_open()) router_.set_oom_record_wait(std::chrono::milliseconds(200));
  write(start_record(t(now_ns()), info_, router_.config(), router_.describe_devices()));
  for (const auto& w : startup_warnings_) write(warning_record(t(now_ns()), info_.pid, w));
  next_sample_ns_ = now_ns() + router_.config().sample_ms * 1000000ULL;
}

void BackgroundWorker::write_events() {
  std::vector<Event> events;
  events_.drain(events);
  std::uint64_t last_ticket = 0;
  for (const auto& e : events) {
    if (e.kind == Event::Kind::warning) {
      print_stderr("warning: " + e.text);
      write(warning_record(t(now_ns()), info_.pid, e.text));
    } else {
      const OomReport& r = e.oom;
      print_stderr(
          "out of memory on device " + std::to_string(r.device) + ": " + format_bytes(r.request) +
          " requested, " +
          (r.device_info_valid
               ? format_bytes(r.device_free) + " of " + format_bytes(r.device_total) + " free"
               : std::string("device figures unknown")) +
          ", pool held " + format_bytes(r.reserved > r.used ? r.reserved - r.used : 0) +
          " unused (" + format_bytes(r.released_after) +
          " given back before the real call); verdict: " + oom_verdict(r) + ". " + oom_hint(r));
      write(oom_record(seconds_since_start(info_, r.t_ns), info_.pid, r));
    }
    last_ticket = std::max(last_ticket, e.ticket);
  }
  if (last_ticket != 0) events_.mark_written(last_ticket);
}

void BackgroundWorker::trim_if_idle(const DeviceSnapshot& snap, std::uint64_t now) {
  const Config& config = router_.config();
  Activity& a = activity_[snap.device];
  const std::uint64_t calls = snap.stats.allocs + snap.stats.frees;
  if (calls != a.calls || a.changed_ns == 0) {
    a.calls = calls;
    a.changed_ns = now;
    a.exhausted = false;
    return;
  }
  if (config.idle_trim_ms == 0 || a.exhausted || !snap.pool.valid) return;
  if (now - a.changed_ns < config.idle_trim_ms * 1000000ULL) return;
  const std::uint64_t threshold =
      config.release_threshold.resolve(snap.device_info_valid ? snap.device_total : 0);
  const std::uint64_t unused =
      snap.pool.reserved > snap.pool.used ? snap.pool.reserved - snap.pool.used : 0;
  if (unused <= threshold) return;
  const std::uint64_t excess = unused - threshold;
  // Halve the excess each tick: a pause in the work does not cost the whole cache at once.
  const std::uint64_t keep =
      snap.pool.used + threshold + (excess > kTrimStepFloor ? excess / 2 : 0);
  if (router_.trim_idle(snap.device, keep) == 0) a.exhausted = true;
}

void BackgroundWorker::tick(std::uint64_t now) {
  write_events();
  const Config& config = router_.config();
  const bool sample_due = config.sample_ms > 0 && now >= next_sample_ns_;
  for (int device : router_.active_devices()) {
    const DeviceSnapshot snap = router_.snapshot(device);
    if (sample_due) write(sample_record(t(now), info_.pid, snap));
    trim_if_idle(snap, now);
  }
  if (sample_due) {
    next_sample_ns_ += config.sample_ms * 1000000ULL;
    if (next_sample_ns_ <= now) next_sample_ns_ = now + config.sample_ms * 1000000ULL;
  }
}

void BackgroundWorker::end(const ExitExtras& extras) {
  write_events();
  ExitSummary summary;
  const std::uint64_t now = now_ns();
  for (int device : router_.active_devices()) {
    summary.devices.push_back(router_.snapshot(device));
    write(sample_record(t(now), info_.pid, summary.devices.back()));
  }
  summary.live = router_.live_allocations();
  summary.now_ns = coarse_now_ns();
  summary.events_dropped = events_.dropped();
  summary.extras = extras;
  write(exit_record(t(now_ns()), info_.pid, summary));
  router_.set_oom_record_wait(std::chrono::milliseconds(0));
  log_.close();
}

void BackgroundWorker::run() {
  // The worker's pool queries and trims must never invalidate an application's stream
  // capture (DESIGN §3): this thread stays in relaxed capture mode.
  CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
  const DriverApi& driver = router_.driver();
  if (driver.cuThreadExchangeStreamCaptureMode != nullptr)
    driver.cuThreadExchangeStreamCaptureMode(&relaxed);
  // What the shim has to say at start, said here rather than in the hook that started it.
  for (const auto& w : startup_warnings_) print_stderr("warning: " + w);
  if (router_.config().verbose) {
    print_stderr("version " + std::string(poolshim_version_string()) + ", log " +
                 (info_.log_path.empty() ? std::string("disabled") : info_.log_path));
    for (const auto& line : describe_config(router_.config())) print_stderr("option " + line);
  }
  begin();
  const std::uint64_t sample_ms = router_.config().sample_ms;
  const std::uint64_t tick_ms = sample_ms > 0 ? std::min(sample_ms, kMaxTickMs) : kMaxTickMs;
  for (;;) {
    const bool stop = events_.wait_for_work(std::chrono::milliseconds(tick_ms));
    if (stop) break;
    tick(now_ns());
  }
  ExitExtras extras;
  {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    extras = exit_extras_;
  }
  end(extras);
}

}  // namespace poolshim
