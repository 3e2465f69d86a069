// POOLSHIM_PROM_FILE (issue 17): the exposition text, exact; the OOM verdict counters; the
// file's removal at exit, which leaves alone what is not the file written and fails harmlessly.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "background.h"
#include "clock.h"
#include "driver_double.h"
#include "prometheus.h"
#include "records.h"

using namespace poolshim;
using poolshim::testing::MiB;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;

namespace {

ProcessInfo process() {
  ProcessInfo info;
  info.pid = 4242;
  info.host = "node1";
  info.rank = "3";
  info.start_mono_ns = now_ns();
  return info;
}

std::string temp_path(const char* tag) {
  return "/tmp/poolshim-unit-" + std::to_string(getpid()) + "-" + tag + ".prom";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("prometheus: the families of one table, poolshim_info with the pid, none elsewhere") {
  DeviceSnapshot a;
  a.device = 0;
  a.pool.reserved = 8 * MiB;
  a.pool.used = 6 * MiB;
  a.cached_bytes = 2 * MiB;  // handed out: 4 MiB of 8, slack 0.5 (1 - used / reserved: 0.25)
  a.stats.requested_bytes.current = 3 * MiB;
  a.stats.live_allocs.current = 3;
  a.cap = 16 * MiB;
  a.device_free = 40 * MiB;
  a.device_total = 64 * MiB;
  a.stats.allocs = 10;
  a.stats.frees = 7;
  a.stats.passthrough_allocs = 2;
  a.stats.cache_hits = 6;
  a.stats.cache_misses = 4;
  a.stats.ooms = 5;
  a.stats.ooms_by_verdict = {1, 3, 1};  // exhausted, cap, fragmentation
  DeviceSnapshot b;
  b.device = 1;  // nothing reserved: slack 0
  const std::string v = poolshim_version_string();
  const std::string d0 = "{host=\"node1\",rank=\"3\",device=\"0\"";
  const std::string d1 = "{host=\"node1\",rank=\"3\",device=\"1\"";
  const std::string expected =
      "# HELP poolshim_info The process behind the series (pid, poolshim's version, mode); "
      "always 1.\n"
      "# TYPE poolshim_info gauge\n"
      "poolshim_info{host=\"node1\",rank=\"3\",pid=\"4242\",version=\"" +
      v +
      "\",mode=\"pool\"} 1\n"
      "# HELP poolshim_reserved_bytes Memory the pool holds from the driver.\n"
      "# TYPE poolshim_reserved_bytes gauge\n"
      "poolshim_reserved_bytes" +
      d0 + "} 8388608\npoolshim_reserved_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_used_bytes Memory of the pool handed out (cached bytes included).\n"
      "# TYPE poolshim_used_bytes gauge\n"
      "poolshim_used_bytes" +
      d0 + "} 6291456\npoolshim_used_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_cached_bytes Bytes in the heap's free blocks: used to the pool, free to "
      "the application.\n"
      "# TYPE poolshim_cached_bytes gauge\n"
      "poolshim_cached_bytes" +
      d0 + "} 2097152\npoolshim_cached_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_requested_bytes Bytes the application asked for, live.\n"
      "# TYPE poolshim_requested_bytes gauge\n"
      "poolshim_requested_bytes" +
      d0 + "} 3145728\npoolshim_requested_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_live_allocations Live pooled allocations.\n"
      "# TYPE poolshim_live_allocations gauge\n"
      "poolshim_live_allocations" +
      d0 + "} 3\npoolshim_live_allocations" + d1 +
      "} 0\n"
      "# HELP poolshim_cap_bytes The pool's cap (POOLSHIM_LIMIT), 0 when none.\n"
      "# TYPE poolshim_cap_bytes gauge\n"
      "poolshim_cap_bytes" +
      d0 + "} 16777216\npoolshim_cap_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_device_free_bytes Device memory free as the driver sees it.\n"
      "# TYPE poolshim_device_free_bytes gauge\n"
      "poolshim_device_free_bytes" +
      d0 + "} 41943040\npoolshim_device_free_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_device_total_bytes Device memory in all.\n"
      "# TYPE poolshim_device_total_bytes gauge\n"
      "poolshim_device_total_bytes" +
      d0 + "} 67108864\npoolshim_device_total_bytes" + d1 +
      "} 0\n"
      "# HELP poolshim_pool_slack_ratio 1 - (used - cached) / reserved: memory the pool holds "
      "but has not handed out, 0 when nothing is reserved.\n"
      "# TYPE poolshim_pool_slack_ratio gauge\n"
      "poolshim_pool_slack_ratio" +
      d0 + "} 0.5\npoolshim_pool_slack_ratio" + d1 +
      "} 0\n"
      "# HELP poolshim_allocations_total Allocations served from the pool.\n"
      "# TYPE poolshim_allocations_total counter\n"
      "poolshim_allocations_total" +
      d0 + "} 10\npoolshim_allocations_total" + d1 +
      "} 0\n"
      "# HELP poolshim_frees_total Pooled blocks given back.\n"
      "# TYPE poolshim_frees_total counter\n"
      "poolshim_frees_total" +
      d0 + "} 7\npoolshim_frees_total" + d1 +
      "} 0\n"
      "# HELP poolshim_passthrough_allocations_total Allocation calls passed to the real "
      "function.\n"
      "# TYPE poolshim_passthrough_allocations_total counter\n"
      "poolshim_passthrough_allocations_total" +
      d0 + "} 2\npoolshim_passthrough_allocations_total" + d1 +
      "} 0\n"
      "# HELP poolshim_cache_hits_total Allocations served from a free block of the heap (no "
      "driver call).\n"
      "# TYPE poolshim_cache_hits_total counter\n"
      "poolshim_cache_hits_total" +
      d0 + "} 6\npoolshim_cache_hits_total" + d1 +
      "} 0\n"
      "# HELP poolshim_cache_misses_total Allocations that needed a new segment from the pool.\n"
      "# TYPE poolshim_cache_misses_total counter\n"
      "poolshim_cache_misses_total" +
      d0 + "} 4\npoolshim_cache_misses_total" + d1 +
      "} 0\n"
      "# HELP poolshim_ooms_total Out-of-memory errors returned to the application, by the oom "
      "record's verdict.\n"
      "# TYPE poolshim_ooms_total counter\n"
      "poolshim_ooms_total" +
      d0 + ",verdict=\"exhausted\"} 1\npoolshim_ooms_total" + d0 +
      ",verdict=\"cap\"} 3\npoolshim_ooms_total" + d0 +
      ",verdict=\"fragmentation\"} 1\npoolshim_ooms_total" + d1 +
      ",verdict=\"exhausted\"} 0\npoolshim_ooms_total" + d1 +
      ",verdict=\"cap\"} 0\npoolshim_ooms_total" + d1 + ",verdict=\"fragmentation\"} 0\n";
  CHECK(prometheus_text({a, b}, process(), "pool") == expected);
}

TEST_CASE("prometheus: label values escape quotes, backslashes and newlines, mode observe") {
  ProcessInfo info = process();
  info.host = "a\"b\\c\nd";
  const std::string text = prometheus_text({}, info, "observe");
  CHECK(text ==
        "# HELP poolshim_info The process behind the series (pid, poolshim's version, mode); "
        "always 1.\n"
        "# TYPE poolshim_info gauge\n"
        "poolshim_info{host=\"a\\\"b\\\\c\\nd\",rank=\"3\",pid=\"4242\",version=\"" +
            std::string(poolshim_version_string()) + "\",mode=\"observe\"} 1\n" +
            text.substr(text.find("# HELP poolshim_reserved_bytes")));
  CHECK(text.find("pid=") == text.rfind("pid="));  // only in poolshim_info
}

TEST_CASE("OOM verdicts: each is classified from the report as the oom record names it") {
  OomReport r;
  r.request = 4 * MiB;
  r.reserved = 10 * MiB;
  r.used = 6 * MiB;  // 4 MiB unused: fragmentation
  CHECK(oom_verdict_of(r) == OomVerdict::fragmentation);
  CHECK(std::string(oom_verdict(r)) == "fragmentation");
  r.used = 8 * MiB;
  r.cap = 11 * MiB;  // 1 MiB of room under the cap
  CHECK(oom_verdict_of(r) == OomVerdict::cap);
  CHECK(std::string(oom_verdict(r)) == "cap");
  r.cap = 0;
  CHECK(oom_verdict_of(r) == OomVerdict::exhausted);
  CHECK(std::string(oom_verdict(r)) == "exhausted");
  r.device_info_valid = true;
  r.device_free = 4 * MiB;  // free on the device, not usable
  CHECK(oom_verdict_of(r) == OomVerdict::fragmentation);
}

TEST_CASE("OOM verdicts: the router counts each out-of-memory error under its verdict") {
  Config c = testing::with_segments();
  c.limit = SizeValue{8 * MiB};
  Rig rig(1, 16 * MiB, c);
  auto& router = rig.router;
  const auto oom = [] { return RealResult::out_of_memory; };
  CHECK(sync_alloc(router, 0, 12 * MiB, oom) == nullptr);  // past the cap
  CHECK(sync_alloc(router, 0, 12 * MiB, oom) == nullptr);
  Rig bare(1, 16 * MiB, testing::with_segments());
  CHECK(sync_alloc(bare.router, 0, 20 * MiB, oom) == nullptr);  // larger than the device
  const DeviceSnapshot capped = router.snapshot(0);
  CHECK(capped.stats.ooms == 2);
  CHECK(capped.stats.ooms_by_verdict == std::array<std::uint64_t, kOomVerdicts>{0, 2, 0});
  const DeviceSnapshot full = bare.router.snapshot(0);
  CHECK(full.stats.ooms == 1);
  CHECK(full.stats.ooms_by_verdict == std::array<std::uint64_t, kOomVerdicts>{1, 0, 0});
  const std::string text = prometheus_text({capped}, process(), "pool");
  CHECK(text.find("poolshim_ooms_total{host=\"node1\",rank=\"3\",device=\"0\",verdict=\"cap\"} "
                  "2\n") != std::string::npos);
}

TEST_CASE("prometheus file: removed when it is the file written, left when gone or replaced") {
  const std::string path = temp_path("remove");
  std::remove(path.c_str());
  FileIdentity written;
  REQUIRE(write_file_atomically(path, "a 1\n", &written).empty());
  CHECK(written.valid);
  CHECK(read_file(path) == "a 1\n");
  CHECK(remove_file_if_ours(path, written).empty());
  CHECK_FALSE(exists(path));
  CHECK(remove_file_if_ours(path, written).empty());         // already gone: nothing to say
  CHECK(remove_file_if_ours(path, FileIdentity{}).empty());  // never written

  // Replaced by another file (a user's, or a later process's of the same name): kept.
  REQUIRE(write_file_atomically(path, "a 1\n", &written).empty());
  const std::string other = path + ".other";
  { std::ofstream(other) << "theirs\n"; }
  REQUIRE(::rename(other.c_str(), path.c_str()) == 0);
  CHECK(remove_file_if_ours(path, written).empty());
  CHECK(read_file(path) == "theirs\n");
  std::remove(path.c_str());
}

TEST_CASE("prometheus file: a removal that fails says why and changes nothing else") {
  // A regular file that even root cannot unlink, taken as the one written.
  const std::string path = "/proc/self/status";
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  const FileIdentity proc{true, st.st_dev, st.st_ino};
  CHECK(remove_file_if_ours(path, proc) ==
        "cannot remove /proc/self/status: Operation not permitted");
  CHECK(exists(path));
}

TEST_CASE("worker: the prometheus file exists while it runs and is gone after its end") {
  Rig rig(1, 64 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  ProcessInfo info = process();
  info.prom_path = temp_path("worker");
  std::remove(info.prom_path.c_str());
  BackgroundWorker worker(router, events, info, {});
  worker.begin();
  CHECK(sync_alloc(router, 0, 2 * MiB, [] { return RealResult::error; }) != nullptr);
  worker.tick(now_ns() + 2000000000ULL);  // past the 1 s sample interval
  const std::string text = read_file(info.prom_path);
  CHECK(text.find("\npoolshim_info{host=\"node1\",rank=\"3\",pid=\"4242\",version=\"") !=
        std::string::npos);
  CHECK(text.find("poolshim_live_allocations{host=\"node1\",rank=\"3\",device=\"0\"} 1\n") !=
        std::string::npos);
  worker.end(ExitExtras{});
  CHECK_FALSE(exists(info.prom_path));
}

TEST_CASE("worker: a prometheus file that cannot be written leaves the exit untouched") {
  Rig rig(1, 64 * MiB, testing::with_segments());
  auto& [d, config, events, router] = rig;
  ProcessInfo info = process();
  info.log_path = temp_path("unwritable") + ".jsonl";
  info.prom_path = "/nonexistent-dir/x.prom";
  std::remove(info.log_path.c_str());
  BackgroundWorker worker(router, events, info, {});
  worker.begin();
  CHECK(sync_alloc(router, 0, 2 * MiB, [] { return RealResult::error; }) != nullptr);
  worker.tick(now_ns() + 2000000000ULL);
  worker.end(ExitExtras{});
  std::ifstream in(info.log_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 5);  // start, sample, warning, final sample, exit
  CHECK(lines[2].find(
            "\"message\":\"POOLSHIM_PROM_FILE: cannot write /nonexistent-dir/x.prom.tmp.") !=
        std::string::npos);
  CHECK(lines[4].find("\"type\":\"exit\"") != std::string::npos);
  CHECK_FALSE(exists(info.prom_path));
  std::remove(info.log_path.c_str());
}
