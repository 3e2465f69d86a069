// The background thread (DESIGN §1, §5): opens the log at the first device-memory call, writes
// the `start` record, turns queued events into `warning` and `oom` records, writes a `sample`
// per device in use every sample_ms, trims idle pools gradually, and at exit writes the final
// samples and the `exit` record. Hooks never do any of this themselves.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "events.h"
#include "log_file.h"
#include "records.h"
#include "router.h"
#include "symbolize.h"

namespace poolshim {

class BackgroundWorker {
 public:
  /// `startup_warnings` (bad options and the like) become `warning` records after `start`.
  BackgroundWorker(Router& router, EventQueue& events, ProcessInfo info,
                   std::vector<std::string> startup_warnings);
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void start();
  /// Writes the final samples and the `exit` record (with `notes`), then ends the thread.
  /// Safe to call more than once and without start() (then nothing is written).
  void finish(ExitExtras extras);

  /// Runs one round of work at monotonic time `now_ns` (for tests; the thread calls it too).
  void tick(std::uint64_t now_ns);
  /// Opens the log and writes the start record (for tests; the thread calls it first).
  void begin();
  /// Final records (for tests; finish() calls it on the thread).
  void end(const ExitExtras& extras);
  const ProcessInfo& info() const { return info_; }

  /// fork() must not copy the worker in the middle of a driver call (the child would inherit
  /// the driver's locks held): pthread_atfork's prepare waits for the current round of work
  /// and holds the next one until resume_after_fork (in the parent and in the child).
  void pause_for_fork();
  void resume_after_fork();

 private:
  void run();
  void write_events();
  void write(const std::string& record);
  void trim_if_idle(const DeviceSnapshot& snap, std::uint64_t now_ns);
  void write_oom(const OomReport& report);
  void write_prometheus(const std::vector<DeviceSnapshot>& snaps);
  std::string site_json(std::uint32_t site);
  std::string site_text(std::uint32_t site);
  double t(std::uint64_t mono_ns) const { return seconds_since_start(info_, mono_ns); }

  Router& router_;
  EventQueue& events_;
  ProcessInfo info_;
  std::vector<std::string> startup_warnings_;
  LogFile log_;
  std::thread thread_;
  std::mutex finish_mutex_;
  std::mutex tick_mutex_;  // held while the worker works (see pause_for_fork)
  ExitExtras exit_extras_;
  bool started_ = false;
  bool finished_ = false;
  std::uint64_t next_sample_ns_ = 0;

  struct Activity {
    std::uint64_t calls = 0;       // allocs + frees at the last look
    std::uint64_t changed_ns = 0;  // when that figure last changed
    bool exhausted = false;        // a trim released nothing: wait for new activity
  };
  std::map<int, Activity> activity_;
  std::vector<DeviceDescription> devices_;
  Symbolizer symbolizer_;
  std::map<std::uint32_t, std::string> site_json_;  // rendered call sites, by id
  std::set<std::string> reported_ooms_;
  std::uint64_t oom_repeats_ = 0;
  bool prom_warned_ = false;
};

}  // namespace poolshim
