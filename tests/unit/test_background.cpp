#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "background.h"
#include "clock.h"
#include "driver_double.h"
#include "file_lines.h"
#include "log_file.h"
#include "records.h"
#include "router.h"

using namespace poolshim;
using poolshim::testing::async_alloc;
using poolshim::testing::MiB;
using poolshim::testing::read_lines;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;

namespace {

std::string temp_path(const char* tag) {
  return "/tmp/poolshim-unit-" + std::to_string(getpid()) + "-" + tag + ".jsonl";
}

bool has(const std::string& line, const std::string& piece) {
  return line.find(piece) != std::string::npos;
}

ProcessInfo info_for(const std::string& log) {
  ProcessInfo info;
  info.pid = 4242;
  info.host = "testhost";
  info.rank = "0";
  info.command_line = {"prog", "arg"};
  info.start_mono_ns = now_ns();
  info.log_path = log;
  return info;
}

// Stands in for a real function that must not run (allocation or free).
struct NeverCalled {
  template <typename... Args>
  RealResult operator()(Args&&...) const {
    FAIL("the real function was called");
    return RealResult::error;
  }
} never_called;

}  // namespace

TEST_CASE("log path: %p %h %r %t and %% expand") {
  CHECK(expand_log_path("a-%p-%h-%r-%%.jsonl", 77, "node1", "3", 0) == "a-77-node1-3-%.jsonl");
  const std::string t = expand_log_path("%t", 1, "h", "0", 1700000000);
  CHECK(t.size() == 15);  // YYYYmmdd-HHMMSS
  CHECK(t[8] == '-');
}

TEST_CASE("log file: a symbolic link is refused with a sentence saying so") {
  const std::string target = temp_path("target");
  const std::string link = temp_path("link");
  std::remove(link.c_str());
  REQUIRE(symlink(target.c_str(), link.c_str()) == 0);
  LogFile log;
  CHECK(log.open(link) == "cannot open log " + link + ": it is a symbolic link");
  CHECK_FALSE(log.is_open());
  CHECK(log.open("/nonexistent-dir/x.jsonl") ==
        "cannot open log /nonexistent-dir/x.jsonl: No such file or directory");
  std::remove(link.c_str());
}

TEST_CASE("worker: start, sample and exit records with the pool's figures") {
  Rig rig(1, 64 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  const std::string path = temp_path("records");
  std::remove(path.c_str());
  BackgroundWorker worker(router, events, info_for(path), {"a startup warning"});
  worker.begin();

  void* a = sync_alloc(router, 0, 2 * MiB, never_called);  // both from one 20 MiB segment
  CHECK(sync_alloc(router, 0, 10 * MiB, never_called) != nullptr);
  router.free_sync(a, 0, never_called);
  worker.tick(now_ns() + 2000000000ULL);  // past the 1 s sample interval
  worker.end(ExitExtras{{"a note"}, {{"runtime_hooks", 3}}, true});

  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 5);  // start, warning, sample, final sample, exit
  CHECK(has(lines[0], "{\"schema\":2,\"type\":\"start\""));
  CHECK(has(lines[0], "\"pid\":4242"));
  CHECK(has(lines[0], "\"command_line\":[\"prog\",\"arg\"]"));
  CHECK(has(lines[0], "\"sample_ms\":\"1000\""));
  CHECK(has(lines[0], "\"devices\":[{\"device\":0,\"name\":\""));
  CHECK(has(lines[1], "\"type\":\"warning\""));
  CHECK(has(lines[1], "\"message\":\"a startup warning\""));
  for (int i : {2, 3}) {
    CHECK(has(lines[i], "\"type\":\"sample\""));
    CHECK(has(lines[i], "\"device\":0,\"reserved_bytes\":20971520,"));  // one 20 MiB segment
    CHECK(has(lines[i], "\"used_bytes\":20971520,"));  // held by the heap, to the driver
    CHECK(has(lines[i], "\"requested_bytes\":10485760,\"requested_bytes_peak\":12582912,"));
    CHECK(has(lines[i], "\"allocs\":2,\"frees\":1,"));
    CHECK(has(lines[i], "\"cached_bytes\":10485760,"));  // the freed 2 MiB and the 8 MiB rest
    CHECK(has(lines[i], "\"pool_slack\":0.5,"));
    CHECK(has(lines[i], "\"rounding_waste\":0,"));
    CHECK(has(lines[i], "\"device_free\":46137344,\"device_total\":67108864"));
    CHECK(has(lines[i], "\"size_histogram\":{\"8388608\":1}"));
  }
  CHECK(has(lines[4], "\"type\":\"exit\""));
  CHECK(has(lines[4], "\"pooled_allocs\":2"));
  CHECK(has(
      lines[4],
      "\"leaks\":{\"count\":1,\"bytes\":10485760,\"largest\":[{\"device\":0,\"bytes\":10485760,"));
  CHECK(
      has(lines[4], "\"paths\":{\"runtime_hooks\":3},\"legacy_only\":true,\"notes\":[\"a note\"]"));
  std::remove(path.c_str());
}

TEST_CASE("worker: a sample at each peak grown by more than 1/256, and the peak consumers") {
  Rig rig(1, 64 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  const std::string path = temp_path("peaks");
  std::remove(path.c_str());
  BackgroundWorker worker(router, events, info_for(path), {});
  worker.begin();
  const std::uint64_t t0 = now_ns();  // every look below is before the 1 s sample interval
  void* a = sync_alloc(router, 0, 8 * MiB, never_called);
  worker.peek(t0);            // new peaks: a sample, and the consumers (8 MiB)
  worker.peek(t0 + 1000000);  // nothing grew: nothing
  void* b = sync_alloc(router, 0, 16 << 10, never_called);
  worker.peek(t0 + 2000000);  // reserved grew (the small arena's first 2 MiB segment): a sample
  void* b2 = sync_alloc(router, 0, 16 << 10, never_called);
  worker.peek(t0 + 3000000);  // requested grew by 16 KiB, less than 1/256 of 8 MiB: nothing
  void* c = sync_alloc(router, 0, 1 * MiB, never_called);
  worker.tick(t0 + 4000000);  // a tick looks too: a sample, and the consumers (4 allocations)
  for (void* p : {a, b, b2, c}) router.free_sync(p, 0, never_called);
  void* e = sync_alloc(router, 0, 2 * MiB, never_called);  // less than the peak: no look
  worker.peek(t0 + 5000000);
  worker.end(ExitExtras{});
  router.free_sync(e, 0, never_called);

  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 6);  // start, three peak samples, the exit sample, exit
  CHECK(has(lines[1], "\"requested_bytes\":8388608,\"requested_bytes_peak\":8388608,"));
  CHECK(has(lines[1], "\"why\":\"peak\"}"));
  CHECK(has(lines[2], "\"requested_bytes\":8404992,\"requested_bytes_peak\":8404992,"));
  CHECK(has(lines[2], "\"why\":\"peak\"}"));
  CHECK(has(lines[3], "\"requested_bytes\":9469952,\"requested_bytes_peak\":9469952,"));
  CHECK(has(lines[3], "\"why\":\"peak\"}"));
  CHECK(has(lines[4], "\"requested_bytes\":2097152,\"requested_bytes_peak\":9469952,"));
  CHECK(has(lines[4], "\"why\":\"exit\"}"));
  // The consumers as the tick found them: 8 MiB + 1 MiB + 2 x 16 KiB, the largest first.
  CHECK(has(lines[5], "\"peak_consumers\":{\"t\":0.004"));
  CHECK(has(lines[5],
            ",\"live_bytes\":9469952,\"live_allocs\":4,\"largest\":[{\"device\":0,"
            "\"bytes\":8388608,"));
  CHECK(has(lines[5], "\"by_site\":[{\"site\":null,\"count\":4,\"bytes\":9469952}]}"));
  CHECK(has(lines[5],
            "\"event_log_written\":null,\"event_log_dropped\":null,"
            "\"event_log_sites\":null"));
  std::remove(path.c_str());
}

TEST_CASE("worker: an out-of-memory record is followed by a sample of its device") {
  Rig rig(1, 16 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  const std::string path = temp_path("oomsample");
  std::remove(path.c_str());
  BackgroundWorker worker(router, events, info_for(path), {});
  worker.begin();
  void* a = sync_alloc(router, 0, 4 * MiB, never_called);
  CHECK(sync_alloc(router, 0, 20 * MiB, [] { return RealResult::out_of_memory; }) == nullptr);
  worker.tick(now_ns());
  worker.end(ExitExtras{});
  router.free_sync(a, 0, never_called);
  const auto lines = read_lines(path);
  REQUIRE(lines.size() >= 3);
  CHECK(has(lines[1], "\"type\":\"oom\""));
  CHECK(has(lines[2], "\"type\":\"sample\""));
  CHECK(has(lines[2], "\"requested_bytes\":4194304,"));
  CHECK(has(lines[2], "\"ooms\":1,"));
  CHECK(has(lines[2], "\"why\":\"oom\"}"));
}

TEST_CASE("start record: the start in whole seconds and in nanoseconds, one reading") {
  ProcessInfo info = info_for("");
  info.start_unix_ns = 1796300000123456789ULL;
  info.start_unix_s = 1796300000;  // start_unix_ns / 10^9, as the shim sets it
  const std::string record = start_record(0.0, info, Config::defaults(), {});
  CHECK(has(record, ",\"start_unix_s\":1796300000,\"start_unix_ns\":1796300000123456789,"));
}

TEST_CASE("worker: an OOM event becomes an oom record with verdict and hint") {
  Rig rig(1, 16 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  const std::string path = temp_path("oom");
  std::remove(path.c_str());
  BackgroundWorker worker(router, events, info_for(path), {});
  worker.begin();
  CHECK(sync_alloc(router, 0, 20 * MiB, [] { return RealResult::out_of_memory; }) == nullptr);
  worker.tick(now_ns());
  worker.end(ExitExtras{});
  const auto lines = read_lines(path);
  REQUIRE(lines.size() >= 2);
  const std::string& oom = lines[1];
  CHECK(has(oom, "\"type\":\"oom\""));
  CHECK(has(oom, "\"device\":0,\"request_bytes\":20971520,\"api\":\"cudaMalloc\""));
  CHECK(has(oom, "\"device_free\":16777216,\"device_total\":16777216"));
  CHECK(has(oom, "\"verdict\":\"exhausted\""));
  CHECK(has(oom,
            "\"hint\":\"the request (20.0 MiB) is larger than the device (16.0 MiB): check the "
            "size computation\""));
  std::remove(path.c_str());
}

TEST_CASE("worker: an idle pool is trimmed gradually down to the release threshold") {
  Config c = testing::with_segments();
  c.idle_trim_ms = 1000;
  c.cache = *parse_size("1G", true);  // the heap keeps its free segments until the idle trim
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  BackgroundWorker worker(router, events, info_for(""), {});
  worker.begin();
  std::vector<void*> blocks(4);
  for (auto& b : blocks) b = sync_alloc(router, 0, 12 * MiB, never_called);  // own segments
  for (auto* b : blocks) router.free_sync(b, 0, never_called);
  REQUIRE(router.snapshot(0).pool.reserved == 48 * MiB);
  const std::uint64_t t0 = now_ns();
  worker.tick(t0);                 // notes the activity
  worker.tick(t0 + 500000000ULL);  // idle for 0.5 s: nothing yet
  CHECK(router.snapshot(0).pool.reserved == 48 * MiB);
  worker.tick(t0 + 1100000000ULL);  // idle for 1.1 s: keep used + half the excess (24 MiB)
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.pool.reserved == 24 * MiB);  // two whole free segments went back, then the trim
  CHECK(s.pool.used == 24 * MiB);      // the heap still holds two
  CHECK(s.stats.idle_trims == 1);
  CHECK(s.stats.idle_trimmed_bytes == 24 * MiB);
  worker.tick(t0 + 1350000000ULL);  // half of the 24 MiB excess
  s = router.snapshot(0);
  CHECK(s.pool.reserved == 12 * MiB);
  worker.tick(t0 + 1600000000ULL);  // keep 6 MiB: the last 12 MiB segment goes too
  s = router.snapshot(0);
  CHECK(s.pool.reserved == 0);
  CHECK(s.stats.idle_trims == 3);
  CHECK(s.stats.idle_trimmed_bytes == 48 * MiB);
  worker.end(ExitExtras{});
}

TEST_CASE("worker: release_threshold keeps that much unused memory cached") {
  Config c = testing::with_segments();
  c.idle_trim_ms = 1000;
  c.release_threshold = *parse_size("12M", true);
  c.cache = *parse_size("1G", true);
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  BackgroundWorker worker(router, events, info_for(""), {});
  worker.begin();
  std::vector<void*> blocks(4);
  for (auto& b : blocks) b = sync_alloc(router, 0, 12 * MiB, never_called);  // own segments
  for (auto* b : blocks) router.free_sync(b, 0, never_called);
  const std::uint64_t t0 = now_ns();
  for (int i = 0; i < 10; ++i) worker.tick(t0 + (1100 + 250 * i) * 1000000ULL);
  // 48 -> keep 12 + 18 -> 24 MiB; keep 12 + 6 -> 12 MiB; then no excess over the threshold.
  CHECK(router.snapshot(0).pool.reserved == 12 * MiB);
  worker.end(ExitExtras{});
}

// ---- the log never hangs, kills or writes into the host (issue 12) ------------------------

namespace {

// Captures what the code under test writes to stderr (fd 2).
class StderrCapture {
 public:
  StderrCapture() : path_(temp_path("stderr")) {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() {
    restore();
    std::remove(path_.c_str());
  }
  std::string text() {
    restore();
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

std::size_t count_of(const std::string& text, const std::string& piece) {
  std::size_t n = 0;
  for (auto at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) ++n;
  return n;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("log file: a regular file is created private, close-on-exec, on a high descriptor") {
  const std::string path = temp_path("private");
  std::remove(path.c_str());
  const mode_t old_mask = umask(022);
  LogFile log;
  REQUIRE(log.open(path).empty());
  umask(old_mask);
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // The lowest free descriptor at or above 1000 (RLIMIT_NOFILE permitting): find it.
  int found = -1;
  for (int fd = 3; fd < 1024; ++fd) {
    struct stat fs {};
    if (fstat(fd, &fs) == 0 && fs.st_ino == st.st_ino && fs.st_dev == st.st_dev) found = fd;
  }
  struct rlimit limit {};
  getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur >= 1024) CHECK(found >= 1000);
  REQUIRE(found >= 0);
  CHECK((fcntl(found, F_GETFD) & FD_CLOEXEC) != 0);
  CHECK(log.write("{\"a\":1}").empty());
  log.close();
  CHECK(fcntl(found, F_GETFD) == -1);  // closed: it was still the log's
  CHECK(read_lines(path) == std::vector<std::string>{"{\"a\":1}"});
  std::remove(path.c_str());
}

TEST_CASE("log file: a FIFO, a device and a file with a second hard link are refused") {
  const std::string fifo = temp_path("fifo");
  std::remove(fifo.c_str());
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  LogFile log;
  const auto t0 = std::chrono::steady_clock::now();
  // No reader: opening it for writing would block for ever without O_NONBLOCK.
  CHECK(log.open(fifo) == "cannot open log " + fifo + ": it is a FIFO, not a regular file");
  // A reader that never reads: the open succeeds, the check refuses it.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  CHECK(log.open(fifo) == "cannot open log " + fifo + ": it is a FIFO, not a regular file");
  ::close(reader);
  CHECK(seconds_since(t0) < 1.0);
  std::remove(fifo.c_str());

  CHECK(log.open("/dev/null") ==
        "cannot open log /dev/null: it is a character device, not a regular file");

  const std::string victim = temp_path("victim");
  const std::string link = temp_path("hardlink");
  std::remove(link.c_str());
  { std::ofstream(victim) << "precious\n"; }
  REQUIRE(::link(victim.c_str(), link.c_str()) == 0);
  CHECK(log.open(link) == "cannot open log " + link + ": it has 2 hard links");
  CHECK_FALSE(log.is_open());
  CHECK(read_lines(victim) == std::vector<std::string>{"precious"});
  std::remove(link.c_str());
  std::remove(victim.c_str());
}

TEST_CASE("log file: a file of another user is refused (runs as root only)") {
  if (geteuid() != 0) {
    WARN("not root: cannot make a file of another user; the owner check is not exercised");
    return;
  }
  const std::string path = temp_path("owned");
  { std::ofstream(path) << ""; }
  REQUIRE(chown(path.c_str(), 65534, 65534) == 0);
  LogFile log;
  CHECK(log.open(path) == "cannot open log " + path + ": it belongs to another user (uid 65534)");
  std::remove(path.c_str());
}

TEST_CASE("log file: a descriptor the program reused is neither written nor closed") {
  const std::string path = temp_path("reused");
  const std::string other = temp_path("program-file");
  std::remove(path.c_str());
  LogFile log;
  REQUIRE(log.open(path).empty());
  CHECK(log.write("{\"first\":1}").empty());
  // The program closes every descriptor and puts its own file on each number.
  const int own = ::open(other.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(own >= 0);
  std::vector<int> taken;
  for (int fd = 3; fd < 1024; ++fd) {
    struct stat fs {};
    struct stat ls {};
    if (fd != own && fstat(fd, &fs) == 0 && stat(path.c_str(), &ls) == 0 &&
        fs.st_ino == ls.st_ino) {
      REQUIRE(dup2(own, fd) == fd);
      taken.push_back(fd);
    }
  }
  REQUIRE(taken.size() == 1);
  CHECK(log.write("{\"second\":2}") == "its descriptor was closed or reused by the program");
  CHECK_FALSE(log.is_open());
  CHECK(log.write("{\"third\":3}").empty());  // stopped: nothing more is written
  log.close();
  CHECK(fcntl(taken[0], F_GETFD) != -1);  // the program's descriptor stays open
  ::close(taken[0]);
  ::close(own);
  CHECK(read_lines(other).empty());
  CHECK(read_lines(path) == std::vector<std::string>{"{\"first\":1}"});
  std::remove(path.c_str());
  std::remove(other.c_str());
}

TEST_CASE("log file: the file-size limit stops the log before a record would be cut") {
  const std::string path = temp_path("fsize");
  std::remove(path.c_str());
  struct rlimit saved {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
  struct rlimit small = saved;
  small.rlim_cur = 250;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  LogFile log;
  const std::string opened = log.open(path);
  const std::string record(99, 'x');  // 100 bytes a line: two fit, the third would be cut
  const std::string first = log.write(record);
  const std::string second = log.write(record);
  const std::string third = log.write(record);
  setrlimit(RLIMIT_FSIZE, &saved);
  CHECK(opened.empty());
  CHECK(first.empty());
  CHECK(second.empty());
  CHECK(third == "it reached the file-size limit (ulimit -f: 250 bytes)");
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK(st.st_size == 200);
  std::remove(path.c_str());
}

TEST_CASE("worker: a log with no space left stops with one warning, and the work goes on") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  BackgroundWorker worker(router, events, info_for(""), {"a startup warning"});
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  REQUIRE(full >= 0);
  worker.log().adopt(full, "/dev/full");
  StderrCapture err;
  worker.begin();  // the start record: ENOSPC
  CHECK_FALSE(worker.log().is_open());
  void* a = sync_alloc(router, 0, 1000, never_called);
  worker.tick(now_ns() + 2000000000ULL);
  router.free_sync(a, 0, never_called);
  worker.end(ExitExtras{});
  const std::string text = err.text();
  CHECK(count_of(text,
                 "poolshim: warning: cannot write log : No space left on device; logging "
                 "stops\n") == 1);
  CHECK(count_of(text, "warning") == 1);
}

TEST_CASE("worker: exit waits a bounded time for a write that blocks, and fork does not wait") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  // Fill the pipe: the worker's first write blocks (a reader that stopped reading, a hung
  // network file system).
  REQUIRE(fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK) == 0);
  const std::string block(4096, 'z');
  while (::write(pipe_fds[1], block.data(), block.size()) > 0) {
  }
  REQUIRE(fcntl(pipe_fds[1], F_SETFL, 0) == 0);
  auto worker =
      std::make_unique<BackgroundWorker>(router, events, info_for(""), std::vector<std::string>{});
  worker->log().adopt(pipe_fds[1], "a pipe nobody reads");
  worker->start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // blocked in its first write
  auto t0 = std::chrono::steady_clock::now();
  worker->pause_for_fork();  // the write is outside the gate fork() waits for
  const double fork_wait = seconds_since(t0);
  worker->resume_after_fork();
  CHECK(fork_wait < 0.05);
  StderrCapture err;
  t0 = std::chrono::steady_clock::now();
  worker->finish(ExitExtras{}, std::chrono::milliseconds(300));
  const double exit_wait = seconds_since(t0);
  CHECK(exit_wait >= 0.29);
  CHECK(exit_wait < 1.0);
  CHECK(count_of(err.text(),
                 "poolshim: warning: the log  did not take the final records within 300 ms (a "
                 "write is blocked); exiting without them\n") == 1);
  // The reader goes: the write fails (EPIPE: the thread blocks SIGPIPE) and the thread ends.
  ::close(pipe_fds[0]);
  t0 = std::chrono::steady_clock::now();
  worker.reset();  // waits for the thread left behind
  CHECK(seconds_since(t0) < 2.0);
}

TEST_CASE("worker: its thread blocks every signal") {
  Rig rig(1, 64 * MiB);
  auto& [d, config, events, router] = rig;
  BackgroundWorker worker(router, events, info_for(""), {});
  // The thread inherits no mask of ours: unblock everything here first.
  sigset_t none;
  sigset_t saved;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, &saved);
  worker.start();
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  // Find the worker's thread in /proc/self/task and read its SigBlk line.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::string blocked;
  DIR* tasks = opendir("/proc/self/task");
  REQUIRE(tasks != nullptr);
  while (dirent* e = readdir(tasks)) {
    if (e->d_name[0] == '.' || std::to_string(gettid()) == e->d_name) continue;
    std::ifstream status(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("SigBlk:", 0) == 0) blocked = line;
    }
  }
  closedir(tasks);
  worker.finish(ExitExtras{});
  // Every signal but the two the kernel never lets a thread block (SIGKILL, SIGSTOP); glibc
  // keeps its own two (32, 33) out of the mask as well.
  CHECK(blocked == "SigBlk:\tfffffffe7ffbfeff");
}
