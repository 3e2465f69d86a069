#include "shim.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "background.h"
#include "call_sites.h"
#include "clock.h"
#include "config.h"
#include "cuda_api.h"
#include "event_log.h"
#include "events.h"
#include "log_file.h"
#include "real_driver.h"
#include "records.h"
#include "spin_lock.h"

extern char** environ;

namespace poolshim::shim {

namespace {

// Initial-exec TLS: no __tls_get_addr call and no allocation on a thread's first hook.
__thread int t_hook_depth __attribute__((tls_model("initial-exec"))) = 0;
__thread int t_in_flight_shard __attribute__((tls_model("initial-exec"))) = -1;

// Outermost hooks in progress, in per-thread shards (one cache line each, like the counters):
// the exit handler waits for them to drain, so that the exit record is one snapshot (issue 12:
// live_allocs and the leak count disagreed while threads were inside hooks at exit).
struct alignas(64) InFlight {
  std::atomic<std::int64_t> hooks{0};
};
InFlight g_in_flight[kCounterShards];
std::atomic<int> g_next_in_flight_shard{0};

std::int64_t hooks_in_flight() {
  std::int64_t n = 0;
  for (const auto& shard : g_in_flight) n += shard.hooks.load(std::memory_order_seq_cst);
  return n;
}

enum Phase : int { kIdle, kStarting, kRunning, kFailed };

// How long the exit handler waits for hooks in progress to finish.
constexpr std::uint64_t kExitDrainNs = 1000000000ULL;

// Never destroyed: hooks can run during static destruction and after our atexit handler.
struct State {
  ParsedConfig parsed;
  std::uint64_t load_mono_ns = 0;
  std::uint64_t load_unix_ns = 0;  // wall clock read right after load_mono_ns
  std::atomic<int> phase{kIdle};
  std::atomic<bool> exiting{false};
  std::atomic<bool> forked_child_passthrough{false};
  bool observe = false;  // POOLSHIM_MODE=observe, fixed at load
  DriverApi driver;
  EventQueue events;
  Router* router = nullptr;
  BackgroundWorker* worker = nullptr;
  EventLog* event_log = nullptr;  // POOLSHIM_EVENTS; never freed (a hook may still push)

  PathCounters paths;
  StreamRegistry streams;
  PeerAccess peers;
  // Stream captures in progress (DESIGN §3).
  struct Capture {
    cudaStream_t stream = nullptr;
    bool used = false;
  };
  std::atomic<int> active_captures{0};
  SpinLock capture_lock;
  static constexpr int kMaxCaptures = 256;
  Capture captures[kMaxCaptures];
};

alignas(State) unsigned char g_state_storage[sizeof(State)];
std::atomic<State*> g_state{nullptr};
pthread_once_t g_state_once = PTHREAD_ONCE_INIT;

void init_state();

// Another library's static constructor may call a hook before our own constructor has run.
State& state() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) {
    pthread_once(&g_state_once, init_state);
    s = g_state.load(std::memory_order_acquire);
  }
  return *s;
}

void print_stderr(const std::string& line) {
  const std::string text = "poolshim: " + line + "\n";
  const ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

std::vector<std::string> environment_strings() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

std::vector<std::string> command_line() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

ProcessInfo make_process_info(const Config& config) {
  ProcessInfo info;
  info.pid = static_cast<int>(getpid());
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) info.host = host;
  info.rank = rank_from_environment();
  info.command_line = command_line();
  info.start_mono_ns = state().load_mono_ns;
  info.start_unix_ns = state().load_unix_ns;
  info.start_unix_s = info.start_unix_ns / 1000000000ULL;
  info.log_path = expand_log_path(config.log, info.pid, info.host, info.rank, info.start_unix_s);
  info.prom_path =
      expand_log_path(config.prom_file, info.pid, info.host, info.rank, info.start_unix_s);
  info.events_path =
      expand_log_path(config.events, info.pid, info.host, info.rank, info.start_unix_s);
  return info;
}

// The core resolves the driver with the C library's dlsym: the exported one would answer
// hooked names with our own hooks, and the core's calls would re-enter them.
void* dlsym_lookup(void* handle, const char* name) {
  return real_dlsym()(handle, name);
}

// The address range of this library's code: call sites leave out the shim's own frames.
void own_code_range(std::uintptr_t* begin, std::uintptr_t* end) {
  struct Range {
    std::uintptr_t probe, begin, end;
  } range{reinterpret_cast<std::uintptr_t>(&own_code_range), 0, 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* r = static_cast<Range*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          const std::uintptr_t hi = lo + ph.p_memsz;
          if (r->probe >= lo && r->probe < hi) {
            r->begin = lo;
            r->end = hi;
            return 1;
          }
        }
        return 0;
      },
      &range);
  *begin = range.begin;
  *end = range.end;
}

// Runs once, on the thread of the first call that reaches the core.
void start() {
  std::uintptr_t range_begin = 0;
  std::uintptr_t range_end = 0;
  State& s = state();
  const Config& config = s.parsed.config;
  const std::string error = s.driver.load("libcuda.so.1", &dlsym_lookup);
  if (!error.empty()) {
    print_stderr("warning: " + error + "; every call passes through to CUDA unchanged");
    s.phase.store(kFailed, std::memory_order_release);
    return;
  }
  ProcessInfo info = make_process_info(config);
  s.router = new Router(s.driver, config, s.events);
  s.router->set_stream_registry(&s.streams);
  s.router->set_capture_probe(&captures_active);
  if (config.backtrace > 0) {
    own_code_range(&range_begin, &range_end);
    s.router->set_own_code_range(range_begin, range_end);
    warm_up_unwinder();  // its first call loads libgcc_s and allocates: not in a hook later
  }
  s.router->set_peer_access(&s.peers);
  s.worker = new BackgroundWorker(*s.router, s.events, std::move(info), s.parsed.warnings);
  if (!config.events.empty()) {
    // A test knob outside the POOLSHIM_ names (README "Tests"): a queue of N records, drained
    // only at exit, so that a run drops an exact number of them.
    const char* knob = std::getenv("_POOLSHIM_TEST_EVENTS_QUEUE");
    const long n = knob != nullptr ? std::strtol(knob, nullptr, 10) : 0;
    s.event_log = new EventLog(n > 0 ? static_cast<std::size_t>(n) : EventLog::kDefaultCapacity);
    s.router->set_event_log(s.event_log);
    s.worker->set_event_log(s.event_log, n > 0);
  }
  s.worker->start();
  s.phase.store(kRunning, std::memory_order_release);
}

void on_exit() {
  State& s = state();
  if (s.forked_child_passthrough.load()) return;
  // Registered twice (see note_device_allocation): the first call does the work.
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  // From here on every hook passes through: the runtime may tear down after this handler.
  s.exiting.store(true, std::memory_order_seq_cst);
  const int phase = s.phase.load(std::memory_order_acquire);
  if (phase == kRunning) {
    // Hooks that began before `exiting` was set finish their work first (bounded: a thread
    // may sit in a sync cudaFree behind a long kernel, or this thread may have been inside a
    // hook when a signal handler called exit).
    const std::int64_t own = t_hook_depth > 0 ? 1 : 0;
    const std::uint64_t give_up = now_ns() + kExitDrainNs;
    while (hooks_in_flight() > own && now_ns() < give_up) sched_yield();
    ExitExtras extras;
    if (s.parsed.config.mode == "observe") {
      extras.notes.emplace_back(
          "observe mode (POOLSHIM_MODE=observe): every allocation and free went to the real "
          "function; the allocation figures count the tracked ones, nothing was pooled");
    } else if (s.router->pooled_allocations() == 0) {
      extras.notes.emplace_back(
          "no allocation was pooled although CUDA calls reached poolshim; see the "
          "passthrough_allocs and fallback_allocs counters and the warnings for why");
    }
    extras.paths = {
        {"runtime_hooks", s.paths.runtime_calls.load()},
        {"driver_hooks", s.paths.driver_calls.load()},
        {"dlsym", s.paths.dlsym_answers.load()},
        {"cuGetProcAddress", s.paths.proc_address_answers.load()},
        {"per_thread_watches", s.paths.per_thread_watches.load()},
    };
    extras.legacy_only = s.streams.legacy_only();
    if (s.parsed.config.verbose) {
      std::string line = "ways in:";
      for (const auto& [name, count] : extras.paths) {
        line += " " + name + " " + std::to_string(count) +
                (name == "runtime_hooks" || name == "driver_hooks" ? " calls," : " answers,");
      }
      line.pop_back();
      print_stderr(line);
    }
    s.worker->finish(std::move(extras));
    s.router->ipc_stop();  // the socket never outlives the process
  }
}

// The worker pauses across fork() (see BackgroundWorker::pause_for_fork).
void before_fork() {
  State& s = state();
  if (s.phase.load(std::memory_order_acquire) == kRunning && s.worker != nullptr) {
    s.worker->pause_for_fork();
  }
}

void after_fork_in_parent() {
  State& s = state();
  if (s.phase.load(std::memory_order_acquire) == kRunning && s.worker != nullptr) {
    s.worker->resume_after_fork();
  }
}

void on_fork_child() {
  // The parent's CUDA state (contexts, pools, our thread) does not exist in the child: a
  // child of a process that had started passes every call through. One that had not (a
  // launcher forking workers before any CUDA use) starts afresh on its own first call.
  State& s = state();
  if (s.phase.load(std::memory_order_relaxed) == kRunning && s.worker != nullptr) {
    s.worker->resume_after_fork();  // this thread locked it in before_fork
  }
  // The parent's IPC socket is not the child's to serve (and not inherited across exec).
  if (s.phase.load(std::memory_order_relaxed) == kRunning) s.router->ipc_forget_in_child();
  if (s.phase.load(std::memory_order_relaxed) != kIdle) {
    s.forked_child_passthrough.store(true, std::memory_order_relaxed);
  }
}

void init_state() {
  State& s = *new (g_state_storage) State();
  s.load_mono_ns = now_ns();
  s.load_unix_ns = unix_now_ns();
  s.parsed = parse_config(environment_strings());
  s.observe = s.parsed.config.mode == "observe";
  if (s.parsed.config.strict && !s.parsed.errors.empty()) {
    for (const auto& e : s.parsed.errors) print_stderr("error: " + e);
    print_stderr(
        "error: POOLSHIM_STRICT is set and the configuration has problems; refusing to start");
    _exit(2);
  }
  g_state.store(&s, std::memory_order_release);
  if (!s.parsed.config.enable) return;  // POOLSHIM_ENABLE=0: pure pass-through, no handlers
  std::atexit(on_exit);
  pthread_atfork(before_fork, after_fork_in_parent, on_fork_child);
}

__attribute__((constructor)) void on_load() {
  state();
}

}  // namespace

HookScope::HookScope() : outermost_(t_hook_depth++ == 0) {
  if (!outermost_) return;
  if (t_in_flight_shard < 0) {
    t_in_flight_shard =
        g_next_in_flight_shard.fetch_add(1, std::memory_order_relaxed) % kCounterShards;
  }
  // seq_cst, and before the hook reads `exiting` (router_for_call): either the exit handler
  // sees this hook in flight, or this hook sees `exiting` and passes through.
  g_in_flight[t_in_flight_shard].hooks.fetch_add(1, std::memory_order_seq_cst);
}
HookScope::~HookScope() {
  if (outermost_) g_in_flight[t_in_flight_shard].hooks.fetch_sub(1, std::memory_order_release);
  --t_hook_depth;
}

Router* router_for_call() {
  State& s = state();
  if (!s.parsed.config.enable || s.exiting.load(std::memory_order_seq_cst) ||
      s.forked_child_passthrough.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  int phase = s.phase.load(std::memory_order_acquire);
  if (phase == kRunning) return s.router;
  if (phase == kIdle && s.phase.compare_exchange_strong(phase, kStarting)) {
    start();
  } else {
    // Another thread is starting the core (a few milliseconds: loading the driver, one
    // thread): wait for it, so that a program's first allocations are pooled like the rest.
    // Not forever: the starting thread may be waiting for a lock this one holds (the dynamic
    // loader's, when this call comes from a library constructor run by dlopen). Then this
    // call passes through.
    const std::uint64_t give_up = now_ns() + 200000000ULL;
    while ((phase = s.phase.load(std::memory_order_acquire)) == kStarting && now_ns() < give_up) {
      sched_yield();
    }
  }
  return s.phase.load(std::memory_order_acquire) == kRunning ? s.router : nullptr;
}

Router* router_if_running() {
  State& s = state();
  return s.phase.load(std::memory_order_acquire) == kRunning && !s.exiting.load() ? s.router
                                                                                  : nullptr;
}

void note_device_allocation() {
  // The CUDA runtime and driver register their own exit teardown when they initialize, which
  // is after our constructor: handlers run in reverse order, so ours, registered at load, would
  // run after theirs, when the pools can no longer be queried (seen on an H200: every exit
  // record read 0 reserved). Registered again here, after they have initialized (they have by
  // the first allocation), it runs before them; the first call does the work.
  static std::atomic<bool> registered{false};
  if (!registered.load(std::memory_order_relaxed) && !registered.exchange(true)) {
    std::atexit(on_exit);
  }
}

PathCounters& paths() {
  return state().paths;
}

StreamRegistry& streams() {
  return state().streams;
}

void note_stream_beyond_legacy() {
  if (!bookkeeping_allowed()) return;  // a forked child of a started process touches nothing
  if (Router* router = router_if_running()) {
    router->after_stream_created();
  } else {
    streams().mark_not_legacy_only();
  }
}

void note_peer_access(int from, int to, Router* router) {
  state().peers.enable(from, to);
  if (router != nullptr) router->open_pool_to(to, from);
}

bool captures_active() {
  return state().active_captures.load(std::memory_order_acquire) > 0;
}

void capture_began(cudaStream_t stream) {
  // A capture of the per-thread default stream is a use of it (DESIGN §7): the legacy rule's
  // barrier-free case ends here, while its barrier can still be recorded.
  if (stream == cudaStreamPerThread) note_stream_beyond_legacy();
  Router* router = router_if_running();
  if (router != nullptr) router->before_capture();
  State& s = state();
  {
    std::lock_guard<SpinLock> lock(s.capture_lock);
    // Counted even when no slot is free (it can then never be uncounted, which only keeps
    // allocations unpooled: safe).
    s.active_captures.fetch_add(1, std::memory_order_acq_rel);
    for (auto& slot : s.captures) {
      if (!slot.used) {
        slot = State::Capture{stream, true};
        break;
      }
    }
  }
  if (router != nullptr) router->capture_counted();  // no fence start lands in the capture
}

void capture_ended(cudaStream_t stream) {
  State& s = state();
  std::lock_guard<SpinLock> lock(s.capture_lock);
  for (auto& slot : s.captures) {
    if (slot.used && slot.stream == stream) {
      slot.used = false;
      s.active_captures.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
  }
}

bool bookkeeping_allowed() {
  return !state().forked_child_passthrough.load(std::memory_order_relaxed);
}

bool observe_mode() {
  return state().observe;
}

}  // namespace poolshim::shim

POOLSHIM_EXPORT const char* poolshim_version() {
  return poolshim::poolshim_version_string();
}
