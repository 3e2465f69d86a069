#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "summary.h"

using namespace poolshim;

namespace {

DeviceSnapshot pooled_device() {
  DeviceSnapshot d;
  d.device = 0;
  d.stats.allocs = 71;
  d.stats.async_allocs = 2;
  d.stats.frees = 70;
  d.stats.passthrough_allocs = 1;
  d.stats.passthrough_frees = 3;
  d.stats.ooms = 2;
  d.stats.oom_with_slack = 1;
  d.stats.oom_retries = 1;
  d.stats.oom_retry_successes = 0;
  d.stats.requested_bytes.peak = 3ULL << 20;
  d.pool.reserved_high = 64ULL << 20;
  d.pool.used_high = 5ULL << 19;
  return d;
}

LiveAllocation leak(std::uint64_t bytes) {
  LiveAllocation l;
  l.info.requested = bytes;
  return l;
}

}  // namespace

TEST_CASE("summary: the log line says where the log went, or why there is none") {
  CHECK(exit_log_line("/tmp/run-42.jsonl", true) == "log /tmp/run-42.jsonl");
  CHECK(exit_log_line("/tmp/run-42.jsonl", false) ==
        "no log written (/tmp/run-42.jsonl could not be opened)");
  CHECK(exit_log_line("", false) == "log disabled (POOLSHIM_LOG is empty)");
}

TEST_CASE("summary: a pooled device's figures and the leaks, exactly") {
  ExitSummary s;
  s.devices.push_back(pooled_device());
  s.live = {leak(3ULL << 20), leak(1ULL << 20)};
  const std::vector<std::string> expected = {
      "summary of pid 42, log run-42.jsonl",
      "  device 0: 71 allocations pooled (2 async), 70 freed; 1 allocation and 3 frees passed "
      "through",
      "    peak reserved 64.0 MiB, peak used 2.5 MiB, peak requested 3.0 MiB",
      "    out of memory: 2 (1 with enough unused pool memory), 1 retried after a trim (0 "
      "succeeded)",
      "  leaks at exit: 2 allocations, 4.0 MiB",
  };
  CHECK(exit_summary_lines(42, "run-42.jsonl", true, s) == expected);
}

TEST_CASE("summary: observe mode counts tracked allocations, one leak is singular") {
  ExitSummary s;
  DeviceSnapshot d;
  d.device = 1;
  d.observe = true;
  d.stats.allocs = 1;
  d.stats.frees = 0;
  d.stats.ooms = 1;
  d.native_bytes_peak = 32ULL << 20;
  d.stats.requested_bytes.peak = 32ULL << 20;
  s.devices.push_back(d);
  s.live = {leak(512)};
  const std::vector<std::string> expected = {
      "summary of pid 7, log disabled (POOLSHIM_LOG is empty)",
      "  device 1: observe mode, 1 allocation tracked (0 async), 0 freed, nothing pooled",
      "    peak tracked 32.0 MiB, peak requested 32.0 MiB",
      "    out of memory: 1",
      "  leaks at exit: 1 allocation, 512 B",
  };
  CHECK(exit_summary_lines(7, "", false, s) == expected);
}

TEST_CASE("summary: no device, no leaks") {
  const std::vector<std::string> expected = {
      "summary of pid 9, no log written (/ro/x.jsonl could not be opened)",
      "  no device memory was allocated under poolshim",
      "  leaks at exit: none",
  };
  CHECK(exit_summary_lines(9, "/ro/x.jsonl", false, ExitSummary{}) == expected);
}
