// The background thread (DESIGN §1, §5): opens the log at the first device-memory call, writes
// the `start` record, turns queued events into `warning` and `oom` records, writes a `sample`
// per device in use every sample_ms, trims idle pools gradually, and at exit writes the final
// samples and the `exit` record. Hooks never do any of this themselves.
//
// The log is best-effort (issue 12): each round of work makes its driver calls under a gate
// that fork() waits for, and writes what it produced only after leaving it, so that a write
// that blocks (a hung file system) never holds up a fork; the exit handler waits a bounded
// time for the final records; the thread takes no signal.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "event_log.h"
#include "events.h"
#include "log_file.h"
#include "prometheus.h"
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

  /// Starts the thread, with every signal blocked in it: a signal the application blocks in
  /// its own threads (to take it with sigwait or signalfd) must not be delivered to ours.
  void start();
  /// Writes the final samples and the `exit` record (with `notes`), then ends the thread.
  /// Waits at most `wait` for that: past it (a write that blocks), the thread is left behind,
  /// makes no further driver call, and one warning says the final records are lost. Safe to
  /// call more than once and without start() (then nothing is written).
  void finish(ExitExtras extras, std::chrono::milliseconds wait = kExitWait);
  static constexpr std::chrono::milliseconds kExitWait{2000};
  static constexpr std::chrono::milliseconds kForkWait{1000};

  /// Runs one round of work at monotonic time `now_ns` (for tests; the thread calls it too).
  void tick(std::uint64_t now_ns);
  /// Between ticks, every kPeakPollMs: a `sample` record (why "peak") for each device whose
  /// reserved, requested, native or VMM peak grew by more than 1/256 since its last sample,
  /// and the peak consumers noted (for tests; the thread calls it too). Ticks do the same.
  void peek(std::uint64_t now_ns);
  static constexpr std::uint64_t kPeakPollMs = 50;
  /// Opens the log and writes the start record (for tests; the thread calls it first).
  void begin();
  /// Final records (for tests; finish() calls it on the thread).
  void end(const ExitExtras& extras);
  const ProcessInfo& info() const { return info_; }
  /// The log, for tests that hand it a descriptor of their own (LogFile::adopt).
  LogFile& log() { return log_; }
  /// POOLSHIM_EVENTS: the queue the router pushes into (set before start()); begin() opens
  /// info().events_path. `at_exit_only` (a test knob, README "Tests"): drained only at exit,
  /// so that a small queue drops an exact number of records.
  void set_event_log(EventLog* log, bool at_exit_only = false) {
    event_log_ = log;
    events_at_exit_only_ = at_exit_only;
  }
  /// Writes the queued event records to the event log's file (for tests; the thread calls it
  /// every kEventDrainMs and at exit). No driver call: outside the fork gate.
  void drain_event_log();
  /// Rows written to the event log, and records lost (queue full, file off).
  std::uint64_t event_log_written() const { return events_written_; }
  std::uint64_t event_log_dropped() const;
  /// How often the thread drains the event queue while POOLSHIM_EVENTS is on.
  static constexpr std::uint64_t kEventDrainMs = 20;

  /// fork() must not copy the worker in the middle of a driver call (the child would inherit
  /// the driver's locks held): pthread_atfork's prepare waits (at most kForkWait) for the
  /// current round of driver calls and holds the next one until resume_after_fork (in the
  /// parent and in the child). Writes are outside the gate: a blocked write never holds it.
  void pause_for_fork();
  void resume_after_fork();

 private:
  void run();
  void write_events();
  // Output of a round of work, written by flush() once the round has left the gate.
  void write(std::string record);
  void say(std::string line);  // a line for stderr ("poolshim: " is added)
  void flush();
  void work(std::uint64_t now_ns);                      // tick's driver calls, under the gate
  ExitSummary final_records(const ExitExtras& extras);  // end's driver calls, under the gate
  void trim_if_idle(const DeviceSnapshot& snap, std::uint64_t now_ns);
  // A sample when one is due or a peak grew; notes the peak consumers (peek, work).
  void look(const DeviceSnapshot& snap, std::uint64_t now_ns, bool sample_due);
  void note_consumers(const DeviceSnapshot& snap, std::uint64_t now_ns);
  void write_oom(const OomReport& report);
  void open_event_log();
  /// The event log's file failed (`why`): one warning, recording stops, what is queued is lost.
  void stop_event_log(const std::string& why);
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
  std::condition_variable ended_cv_;
  std::mutex tick_mutex_;     // held while the worker makes driver calls (pause_for_fork)
  bool fork_paused_ = false;  // pause_for_fork holds tick_mutex_
  ExitExtras exit_extras_;
  bool started_ = false;
  bool finished_ = false;
  bool ended_ = false;                  // the thread has written its last record
  std::atomic<bool> abandoned_{false};  // finish() gave up waiting: no more driver calls
  std::atomic<bool> running_{false};    // the thread has not returned yet
  std::vector<std::string> pending_records_;
  std::vector<std::string> pending_stderr_;
  std::string pending_prometheus_;
  bool prometheus_due_ = false;
  std::uint64_t pending_ticket_ = 0;  // events up to this one are in pending_*
  std::uint64_t next_sample_ns_ = 0;

  struct Activity {
    std::uint64_t calls = 0;       // allocs + frees at the last look
    std::uint64_t changed_ns = 0;  // when that figure last changed
    bool exhausted = false;        // a trim released nothing: wait for new activity
  };
  std::map<int, Activity> activity_;
  // Each device's peaks as its last sample record gave them (look() compares against them).
  struct PeakMarks {
    std::uint64_t reserved = 0;
    std::uint64_t requested = 0;
    std::uint64_t native = 0;
    std::uint64_t vmm = 0;
  };
  std::map<int, PeakMarks> sampled_peaks_;
  std::map<int, PeakConsumers> peak_consumers_;
  std::set<std::uint32_t> event_sites_;  // call sites named in the event log's rows
  std::vector<DeviceDescription> devices_;
  Symbolizer symbolizer_;
  std::map<std::uint32_t, std::string> site_json_;  // rendered call sites, by id
  std::set<std::string> reported_ooms_;
  std::uint64_t oom_repeats_ = 0;
  bool prom_warned_ = false;
  FileIdentity prom_written_;  // the Prometheus file last written, removed at exit

  EventLog* event_log_ = nullptr;  // POOLSHIM_EVENTS on
  bool events_at_exit_only_ = false;
  bool events_stopped_ = false;  // the file could not be opened or written
  LogFile events_file_;
  std::string events_chunk_;
  std::uint64_t events_written_ = 0;
  std::uint64_t events_lost_ = 0;  // taken from the queue but not written (file stopped)
};

}  // namespace poolshim
