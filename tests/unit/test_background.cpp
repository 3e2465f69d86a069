#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "background.h"
#include "clock.h"
#include "driver_double.h"
#include "log_file.h"
#include "records.h"
#include "router.h"

using namespace poolshim;
using poolshim::testing::async_alloc;
using poolshim::testing::MiB;
using poolshim::testing::Rig;
using poolshim::testing::sync_alloc;

namespace {

std::string temp_path(const char* tag) {
  return "/tmp/poolshim-unit-" + std::to_string(getpid()) + "-" + tag + ".jsonl";
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
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

RealResult never_called() {
  FAIL("the real function was called");
  return RealResult::error;
}

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
  Config no_cache = Config::defaults();
  no_cache.cache = SizeValue{};  // the pool's own figures, no block held in front of it
  Rig rig(1, 64 * MiB, no_cache);
  auto& [d, config, events, router] = rig;
  const std::string path = temp_path("records");
  std::remove(path.c_str());
  BackgroundWorker worker(router, events, info_for(path), {"a startup warning"});
  worker.begin();

  void* a = sync_alloc(router, 0, 1000, never_called);
  CHECK(sync_alloc(router, 0, 3 * MiB, never_called) != nullptr);
  router.free_sync(a, 0, never_called);
  worker.tick(now_ns() + 2000000000ULL);  // past the 1 s sample interval
  worker.end(ExitExtras{{"a note"}, {{"runtime_hooks", 3}}});

  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 5);  // start, warning, sample, final sample, exit
  CHECK(has(lines[0], "{\"schema\":1,\"type\":\"start\""));
  CHECK(has(lines[0], "\"pid\":4242"));
  CHECK(has(lines[0], "\"command_line\":[\"prog\",\"arg\"]"));
  CHECK(has(lines[0], "\"sample_ms\":\"1000\""));
  CHECK(has(lines[0], "\"devices\":[{\"device\":0,\"name\":\""));
  CHECK(has(lines[1], "\"type\":\"warning\""));
  CHECK(has(lines[1], "\"message\":\"a startup warning\""));
  for (int i : {2, 3}) {
    CHECK(has(lines[i], "\"type\":\"sample\""));
    CHECK(has(lines[i], "\"device\":0,\"reserved_bytes\":6291456,"));  // 2 MiB + 4 MiB chunks
    CHECK(has(lines[i], "\"used_bytes\":3145728,"));
    CHECK(has(lines[i], "\"requested_bytes\":3145728,\"requested_bytes_peak\":3146728,"));
    CHECK(has(lines[i], "\"allocs\":2,\"frees\":1,"));
    CHECK(has(lines[i], "\"pool_slack\":0.5,"));
    CHECK(has(lines[i], "\"rounding_waste\":0,"));
    CHECK(has(lines[i], "\"device_free\":60817408,\"device_total\":67108864"));
    CHECK(has(lines[i], "\"size_histogram\":{\"2097152\":1}"));
  }
  CHECK(has(lines[4], "\"type\":\"exit\""));
  CHECK(has(lines[4], "\"pooled_allocs\":2"));
  CHECK(has(
      lines[4],
      "\"leaks\":{\"count\":1,\"bytes\":3145728,\"largest\":[{\"device\":0,\"bytes\":3145728,"));
  CHECK(has(lines[4], "\"paths\":{\"runtime_hooks\":3},\"notes\":[\"a note\"]"));
  std::remove(path.c_str());
}

TEST_CASE("worker: an OOM event becomes an oom record with verdict and hint") {
  Rig rig(1, 16 * MiB);
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
  Config c = Config::defaults();
  c.idle_trim_ms = 1000;
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  BackgroundWorker worker(router, events, info_for(""), {});
  worker.begin();
  std::vector<void*> blocks(4);
  for (auto& b : blocks) b = sync_alloc(router, 0, 3 * MiB, never_called);  // 4 MiB chunks
  for (auto* b : blocks) router.free_sync(b, 0, never_called);
  REQUIRE(router.snapshot(0).pool.reserved == 16 * MiB);
  const std::uint64_t t0 = now_ns();
  worker.tick(t0);                 // notes the activity
  worker.tick(t0 + 500000000ULL);  // idle for 0.5 s: nothing yet
  CHECK(router.snapshot(0).pool.reserved == 16 * MiB);
  worker.tick(t0 + 1100000000ULL);  // idle for 1.1 s: keep used + half the excess (8 MiB)
  DeviceSnapshot s = router.snapshot(0);
  CHECK(s.pool.reserved == 4 * MiB);  // chunks go newest first while reserved >= 8 MiB
  CHECK(s.stats.idle_trims == 1);
  CHECK(s.stats.idle_trimmed_bytes == 12 * MiB);
  worker.tick(t0 + 1350000000ULL);  // 4 MiB excess, under the step floor: trim to 0
  s = router.snapshot(0);
  CHECK(s.pool.reserved == 0);
  CHECK(s.stats.idle_trims == 2);
  CHECK(s.stats.idle_trimmed_bytes == 16 * MiB);
  worker.end(ExitExtras{});
}

TEST_CASE("worker: release_threshold keeps that much unused memory cached") {
  Config c = Config::defaults();
  c.idle_trim_ms = 1000;
  c.release_threshold = *parse_size("8M", true);
  Rig rig(1, 64 * MiB, c);
  auto& [d, config, events, router] = rig;
  BackgroundWorker worker(router, events, info_for(""), {});
  worker.begin();
  std::vector<void*> blocks(4);
  for (auto& b : blocks) b = sync_alloc(router, 0, 3 * MiB, never_called);
  for (auto* b : blocks) router.free_sync(b, 0, never_called);
  const std::uint64_t t0 = now_ns();
  for (int i = 0; i < 10; ++i) worker.tick(t0 + (1100 + 250 * i) * 1000000ULL);
  // Excess 8 MiB over the threshold: keep 8 + 4 MiB -> reserved 8 MiB (chunks are 4 MiB).
  CHECK(router.snapshot(0).pool.reserved == 8 * MiB);
  worker.end(ExitExtras{});
}
