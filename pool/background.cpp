#include "background.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "clock.h"
#include "json.h"
#include "nvtx_marks.h"
#include "prometheus.h"
#include "summary.h"
#include "units.h"

namespace poolshim {

namespace {

// Ticks at most this far apart, whatever sample_ms is, so idle trims and events stay prompt.
constexpr std::uint64_t kMaxTickMs = 250;
// Below this much unused memory above the threshold, a trim goes straight to the threshold.
constexpr std::uint64_t kTrimStepFloor = 4ULL << 20;
// The event log is written in chunks of about this many bytes, one write(2) each.
constexpr std::size_t kEventChunkBytes = 256 << 10;

// A peak "grew" when it passed the last figure seen by more than 1/256 of it: a run writes a
// few thousand peak samples at most, however its peaks creep.
bool grew(std::uint64_t before, std::uint64_t now) {
  return now > before + before / 256;
}

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
  // A thread left behind by finish() still uses this object until its write returns (only
  // tests destroy a worker: the shim's lives for the whole process).
  while (running_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void BackgroundWorker::start() {
  std::lock_guard<std::mutex> lock(finish_mutex_);
  if (started_ || finished_) return;
  // A new thread inherits the signal mask of its creator: every signal is blocked from its
  // first instruction (issue 12: a signal the application blocks in its threads, to take with
  // sigwait, was delivered here and killed the process; SIGXFSZ from a log past the file-size
  // limit killed it too, where a blocked one makes the write fail with EFBIG).
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    running_.store(true);
    thread_ = std::thread([this] {
      run();
      running_.store(false);  // the thread's last touch of this object
    });
    started_ = true;
  } catch (const std::exception& e) {
    running_.store(false);
    print_stderr(std::string("warning: cannot start the background thread (") + e.what() +
                 "); running without a log");
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void BackgroundWorker::finish(ExitExtras extras, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(finish_mutex_);
  if (finished_) return;
  finished_ = true;
  exit_extras_ = std::move(extras);
  if (!started_) return;
  events_.request_stop();
  if (ended_cv_.wait_for(lock, wait, [this] { return ended_; })) {
    lock.unlock();
    thread_.join();
    return;
  }
  // A write that blocks (a hung file system): the application's exit must not wait for it.
  abandoned_.store(true);
  lock.unlock();
  thread_.detach();
  print_stderr("warning: the log " + info_.log_path + " did not take the final records within " +
               std::to_string(wait.count()) + " ms (a write is blocked); exiting without them");
}

void BackgroundWorker::write(std::string record) {
  pending_records_.push_back(std::move(record));
}

void BackgroundWorker::say(std::string line) {
  pending_stderr_.push_back(std::move(line));
}

void BackgroundWorker::flush() {
  // Outside the gate: nothing here makes a driver call, and what blocks here (a full pipe on
  // stderr, a hung file system) holds up neither fork() nor the application's threads.
  for (const auto& line : pending_stderr_) print_stderr(line);
  pending_stderr_.clear();
  for (const auto& record : pending_records_) {
    if (!log_.is_open()) break;
    const std::string error = log_.write(record);
    if (!error.empty()) {
      print_stderr("warning: cannot write log " + info_.log_path + ": " + error +
                   "; logging stops");
    }
  }
  pending_records_.clear();
  if (prometheus_due_) {
    prometheus_due_ = false;
    const std::string error =
        write_file_atomically(info_.prom_path, pending_prometheus_, &prom_written_);
    if (!error.empty() && !prom_warned_) {
      prom_warned_ = true;
      print_stderr("warning: POOLSHIM_PROM_FILE: " + error);
      const std::string record =
          warning_record(t(now_ns()), info_.pid, "POOLSHIM_PROM_FILE: " + error);
      if (log_.is_open()) log_.write(record);
    }
  }
  // Only now are the events written (an allocating thread may wait for its OOM record).
  if (pending_ticket_ != 0) events_.mark_written(pending_ticket_);
  pending_ticket_ = 0;
}

void BackgroundWorker::begin() {
  const std::string& path = info_.log_path;
  if (!path.empty()) {
    const std::string error = log_.open(path);
    if (!error.empty()) say("warning: " + error + "; running without a log");
  }
  {
    std::lock_guard<std::mutex> gate(tick_mutex_);
    if (log_.is_open()) router_.set_oom_record_wait(std::chrono::milliseconds(200));
    devices_ = router_.describe_devices();
    write(start_record(t(now_ns()), info_, router_.config(), devices_, router_.free_mode_why()));
    for (const auto& w : startup_warnings_) write(warning_record(t(now_ns()), info_.pid, w));
    next_sample_ns_ = now_ns() + router_.config().sample_ms * 1000000ULL;
  }
  open_event_log();  // outside the gate: no driver call (its warning follows the start record)
  flush();
}

void BackgroundWorker::open_event_log() {
  if (event_log_ == nullptr) return;
  const std::string& path = info_.events_path;
  std::string error = path.empty() ? "POOLSHIM_EVENTS: no path" : events_file_.open(path, true);
  if (error.empty()) error = events_file_.write(event_log_header());
  if (!error.empty()) stop_event_log(error);
}

void BackgroundWorker::stop_event_log(const std::string& why) {
  if (events_stopped_) return;
  events_stopped_ = true;
  router_.set_event_log(nullptr);  // hooks stop recording; the queue itself stays (never freed)
  events_file_.close();
  const std::string text = "POOLSHIM_EVENTS: " + why + "; the event log stops";
  say("warning: " + text);
  write(warning_record(t(now_ns()), info_.pid, text));
}

std::uint64_t BackgroundWorker::event_log_dropped() const {
  return event_log_ == nullptr ? 0 : event_log_->ring().dropped() + events_lost_;
}

void BackgroundWorker::drain_event_log() {
  if (event_log_ == nullptr) return;
  EventRing& ring = event_log_->ring();
  const long utc_offset = local_utc_offset(static_cast<std::int64_t>(::time(nullptr)));
  // At most one queue's worth per call: producers that never pause must not keep it here.
  std::size_t left = ring.capacity();
  AllocationEvent e;
  while (left > 0) {
    events_chunk_.clear();
    std::uint64_t rows = 0;
    while (left > 0 && events_chunk_.size() < kEventChunkBytes && ring.pop(&e)) {
      --left;
      if (rows++ > 0) events_chunk_ += '\n';
      if (e.site != 0) event_sites_.insert(e.site);
      append_event_row(events_chunk_, e, utc_offset, info_.start_mono_ns);
    }
    if (rows == 0) break;
    if (events_stopped_) {
      events_lost_ += rows;
      continue;
    }
    const std::string error = events_file_.write(events_chunk_);  // adds the last newline
    if (error.empty()) {
      events_written_ += rows;
    } else {
      events_lost_ += rows;
      stop_event_log("cannot write " + info_.events_path + ": " + error);
    }
  }
}

void BackgroundWorker::write_events() {
  std::vector<Event> events;
  events_.drain(events);
  for (const auto& e : events) {
    if (e.kind == Event::Kind::warning) {
      say("warning: " + e.text);
      write(warning_record(t(now_ns()), info_.pid, e.text));
    } else {
      write_oom(e.oom);
    }
    pending_ticket_ = std::max(pending_ticket_, e.ticket);
  }
}

std::string BackgroundWorker::site_json(std::uint32_t site) {
  if (site == 0) return "null";
  auto it = site_json_.find(site);
  if (it != site_json_.end()) return it->second;
  std::vector<std::string> frames;
  for (std::uintptr_t address : router_.call_sites().frames(site)) {
    const Frame f = symbolizer_.symbolize(address);
    JsonObject fj;
    fj.add("module", f.module).add("offset", static_cast<std::uint64_t>(f.offset));
    if (f.function.empty()) {
      fj.add_null("function").add_null("function_offset");
    } else {
      fj.add("function", f.function).add("function_offset", f.function_offset);
    }
    frames.push_back(fj.str());
  }
  const std::string json = frames.empty() ? "null" : json_array(frames);
  site_json_.emplace(site, json);
  return json;
}

namespace {

// Frames of the CUDA runtime (shared, or linked into the program statically) are not the
// application's call site: the report names the first frame past them.
bool cuda_runtime_frame(const Frame& f) {
  const auto slash = f.module.rfind('/');
  const std::string base = slash == std::string::npos ? f.module : f.module.substr(slash + 1);
  if (base.rfind("libcudart", 0) == 0 || base.rfind("libcuda.so", 0) == 0) return true;
  for (const char* prefix : {"cudart::", "__cudart", "cuda", "__cuda", "libcudart_static_"}) {
    if (f.function.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::string BackgroundWorker::site_text(std::uint32_t site) {
  if (site == 0) return "";
  std::string fallback;
  for (std::uintptr_t address : router_.call_sites().frames(site)) {
    const Frame f = symbolizer_.symbolize(address);
    if (f.function.empty() && f.module.empty()) continue;
    if (!cuda_runtime_frame(f)) return describe_frame(f);
    if (fallback.empty()) fallback = describe_frame(f);
  }
  return fallback;
}

void BackgroundWorker::write_oom(const OomReport& r) {
  // One record per distinct situation: a program retrying the same allocation in a loop must
  // not fill the log (the counters still count every one).
  const std::string key = std::to_string(r.device) + "/" + oom_verdict(r) + "/" +
                          std::to_string(r.site) + "/" +
                          std::to_string(histogram_bucket(r.request | 1));
  if (!reported_ooms_.insert(key).second) {
    ++oom_repeats_;
    return;
  }
  OomDetails details;
  std::vector<LiveAllocation> live;
  for (const auto& l : router_.live_allocations()) {
    if (l.info.device == r.device) live.push_back(l);
  }
  details.largest = largest(live, 10);
  details.by_site = group_by_site(live, 10);
  const DeviceSnapshot snap = router_.snapshot(r.device);
  details.histogram = snap.stats.histogram;
  details.native_bytes = snap.native_bytes;
  details.vmm_bytes = snap.vmm.physical_bytes.current;
  details.vmm_sites = router_.vmm().top_sites(r.device, 5);
  details.other_bytes = other_bytes(snap);
  details.other_known = snap.device_info_valid;
  details.now_ns = coarse_now_ns();
  for (const auto& d : devices_) {
    if (d.ordinal == r.device) details.device_name = d.name;
  }
  const SiteText text = [this](std::uint32_t s) { return site_text(s); };
  const SiteJson json = [this](std::uint32_t s) { return site_json(s); };
  std::string block = oom_text(r, details, text);
  if (!block.empty() && block.back() == '\n') block.pop_back();
  say(std::move(block));
  write(oom_record(seconds_since_start(info_, r.t_ns), info_.pid, r, details, json));
  write(sample_record(t(now_ns()), info_.pid, snap, SampleWhy::oom));  // the device then
}

void BackgroundWorker::write_prometheus(const std::vector<DeviceSnapshot>& snaps) {
  if (info_.prom_path.empty()) return;
  pending_prometheus_ = prometheus_text(snaps, info_, router_.config().mode);
  prometheus_due_ = true;
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
  // Cached blocks are used to the pool but free to the application: they go back first.
  const std::uint64_t in_use = handed_out(snap.pool, snap.cached_bytes);
  const std::uint64_t unused = snap.pool.reserved > in_use ? snap.pool.reserved - in_use : 0;
  if (unused <= threshold) return;
  const std::uint64_t excess = unused - threshold;
  // Halve the excess each tick: a pause in the work does not cost the whole cache at once.
  const std::uint64_t keep = in_use + threshold + (excess > kTrimStepFloor ? excess / 2 : 0);
  if (router_.trim_idle(snap.device, keep) == 0) a.exhausted = true;
}

void BackgroundWorker::tick(std::uint64_t now) {
  {
    std::lock_guard<std::mutex> gate(tick_mutex_);
    work(now);
  }
  flush();
}

void BackgroundWorker::work(std::uint64_t now) {
  write_events();
  const Config& config = router_.config();
  const bool sample_due = config.sample_ms > 0 && now >= next_sample_ns_;
  std::vector<DeviceSnapshot> snaps;
  for (int device : router_.active_devices()) {
    snaps.push_back(router_.snapshot(device));
    look(snaps.back(), now, sample_due);
    trim_if_idle(snaps.back(), now);
    router_.tend_heap(device, now);
  }
  if (sample_due) write_prometheus(snaps);
  if (sample_due) {
    next_sample_ns_ += config.sample_ms * 1000000ULL;
    if (next_sample_ns_ <= now) next_sample_ns_ = now + config.sample_ms * 1000000ULL;
  }
}

void BackgroundWorker::peek(std::uint64_t now) {
  {
    std::lock_guard<std::mutex> gate(tick_mutex_);
    for (int device : router_.active_devices()) look(router_.snapshot(device), now, false);
  }
  flush();
}

void BackgroundWorker::look(const DeviceSnapshot& snap, std::uint64_t now, bool sample_due) {
  PeakMarks& last = sampled_peaks_[snap.device];
  const PeakMarks peaks{snap.pool.reserved_high, snap.stats.requested_bytes.peak,
                        snap.native_bytes_peak, snap.vmm.physical_bytes.peak};
  const bool peak = grew(last.reserved, peaks.reserved) || grew(last.requested, peaks.requested) ||
                    grew(last.native, peaks.native) || grew(last.vmm, peaks.vmm);
  if (sample_due || peak) {
    write(
        sample_record(t(now), info_.pid, snap, sample_due ? SampleWhy::interval : SampleWhy::peak));
    last = peaks;
  }
  note_consumers(snap, now);
}

void BackgroundWorker::note_consumers(const DeviceSnapshot& snap, std::uint64_t now) {
  PeakConsumers& p = peak_consumers_[snap.device];
  const std::uint64_t live = snap.stats.requested_bytes.current;
  if (live == 0 || (p.seen && !grew(p.live_bytes, live))) return;
  // A walk of the allocation table, only when live bytes grew: a few thousand in a whole run.
  std::vector<LiveAllocation> mine;
  std::uint64_t bytes = 0;
  for (const auto& l : router_.live_allocations()) {
    if (l.info.device != snap.device) continue;
    bytes += l.info.requested;
    mine.push_back(l);
  }
  if (bytes == 0) return;
  p.seen = true;
  p.t = t(now);
  p.coarse_ns = coarse_now_ns();
  p.live_bytes = bytes;
  p.live_allocs = mine.size();
  p.by_site = group_by_site(mine, 10);
  p.largest = largest(std::move(mine), 5);
}

void BackgroundWorker::end(const ExitExtras& extras) {
  drain_event_log();  // every hook has returned (the shim's exit handler waited): the last rows
  events_file_.close();
  ExitSummary summary;
  {
    std::lock_guard<std::mutex> gate(tick_mutex_);
    summary = final_records(extras);
  }
  flush();
  // The Prometheus file goes with the process, after its last write: a textfile collector
  // then stops exporting its figures. A failure leaves the file with the final figures; one
  // warning on stderr says so and nothing else changes.
  const std::string kept = remove_file_if_ours(info_.prom_path, prom_written_);
  if (!kept.empty()) print_stderr("warning: POOLSHIM_PROM_FILE: " + kept + " at exit; it stays");
  const bool written = log_.is_open();
  log_.close();
  // What plain LD_PRELOAD use hears at exit (summary.h), once the exit record is out.
  const Config& config = router_.config();
  if (config.verbose) print_stderr(exit_log_line(info_.log_path, written));
  if (config.summary) {
    for (const auto& line : exit_summary_lines(info_.pid, info_.log_path, written, summary)) {
      print_stderr(line);
    }
  }
}

ExitSummary BackgroundWorker::final_records(const ExitExtras& extras) {
  write_events();
  ExitSummary summary;
  const std::uint64_t now = now_ns();
  for (int device : router_.active_devices()) {
    summary.devices.push_back(router_.snapshot(device));
    summary.vmm_sites.push_back(router_.vmm().top_sites(device, 10));
    write(sample_record(t(now), info_.pid, summary.devices.back(), SampleWhy::exit));
    note_consumers(summary.devices.back(), now);
    summary.peaks.push_back(peak_consumers_[device]);
  }
  summary.event_sites.assign(event_sites_.begin(), event_sites_.end());
  write_prometheus(summary.devices);
  summary.live = router_.live_allocations();
  summary.now_ns = coarse_now_ns();
  summary.events_dropped = events_.dropped();
  summary.event_log_on = event_log_ != nullptr;
  summary.event_log_written = events_written_;
  summary.event_log_dropped = event_log_dropped();
  summary.extras = extras;
  summary.oom_repeats = oom_repeats_;
  write(exit_record(t(now_ns()), info_.pid, summary,
                    [this](std::uint32_t s) { return site_json(s); }));
  router_.set_oom_record_wait(std::chrono::milliseconds(0));
  return summary;
}

void BackgroundWorker::run() {
  {
    // Every driver call of this thread happens under the gate that fork() waits for.
    std::lock_guard<std::mutex> gate(tick_mutex_);
    // The worker's pool queries and trims must never invalidate an application's stream
    // capture (DESIGN §3): this thread stays in relaxed capture mode.
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    const DriverApi& driver = router_.driver();
    if (driver.cuThreadExchangeStreamCaptureMode != nullptr) {
      driver.cuThreadExchangeStreamCaptureMode(&relaxed);
    }
  }
  // What the shim has to say at start, said here rather than in the hook that started it.
  for (const auto& w : startup_warnings_) print_stderr("warning: " + w);
  begin();
  nvtx_marks::start();  // NVTX's first call may load a tool: here, not in a hook, after the log
  if (router_.config().verbose) {
    print_stderr("version " + std::string(poolshim_version_string()) + ", log " +
                 (info_.log_path.empty() ? std::string("disabled") : info_.log_path));
    // After begin(): percentages resolve on the devices it described.
    std::map<int, std::uint64_t> totals;
    for (const auto& d : devices_) totals[d.ordinal] = d.total;
    for (const auto& line : describe_config(router_.config(), totals)) {
      print_stderr("option " + line);
    }
  }
  const std::uint64_t sample_ms = router_.config().sample_ms;
  const std::uint64_t tick_ms = sample_ms > 0 ? std::min(sample_ms, kMaxTickMs) : kMaxTickMs;
  // The thread ticks every tick_ms, or at once when an event is queued. Between ticks it wakes
  // every kPeakPollMs to look for new peaks (peek), and with the event log on every
  // kEventDrainMs to drain its queue.
  const bool draining = event_log_ != nullptr && !events_at_exit_only_;
  const std::uint64_t wait_ms =
      std::min({tick_ms, kPeakPollMs, draining ? kEventDrainMs : kPeakPollMs});
  std::uint64_t next_tick_ns = now_ns() + tick_ms * 1000000ULL;
  std::uint64_t next_peek_ns = now_ns() + kPeakPollMs * 1000000ULL;
  while (!events_.wait_for_work(std::chrono::milliseconds(wait_ms))) {
    if (abandoned_.load()) return;
    if (draining) drain_event_log();
    const std::uint64_t now = now_ns();
    if (now >= next_tick_ns || events_.pending()) {
      tick(now);
      next_tick_ns = now + tick_ms * 1000000ULL;
      next_peek_ns = now + kPeakPollMs * 1000000ULL;
    } else if (now >= next_peek_ns) {
      peek(now);
      next_peek_ns = now + kPeakPollMs * 1000000ULL;
    }
  }
  ExitExtras extras;
  {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    extras = exit_extras_;
  }
  // finish() gave up on a write that blocked: the process may be tearing CUDA down by now.
  if (abandoned_.load()) return;
  end(extras);
  std::lock_guard<std::mutex> lock(finish_mutex_);
  ended_ = true;
  ended_cv_.notify_all();
}

void BackgroundWorker::pause_for_fork() {
  // Bounded: a driver call that never returns must not hang the application's fork() too.
  // (Polled with try_lock rather than a timed mutex: GCC 12's ThreadSanitizer does not see
  // pthread_mutex_clocklock, which std::timed_mutex uses, and reports the unlock as wrong.)
  const auto give_up = std::chrono::steady_clock::now() + kForkWait;
  while (!(fork_paused_ = tick_mutex_.try_lock()) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void BackgroundWorker::resume_after_fork() {
  if (fork_paused_) tick_mutex_.unlock();
  fork_paused_ = false;
}

}  // namespace poolshim
