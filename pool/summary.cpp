#include "summary.h"

#include "units.h"

namespace poolshim {

namespace {

std::string count(std::uint64_t n, const char* one) {
  return std::to_string(n) + " " + one + (n == 1 ? "" : "s");
}

}  // namespace

std::string exit_log_line(const std::string& log_path, bool written) {
  if (log_path.empty()) return "log disabled (POOLSHIM_LOG is empty)";
  if (!written) return "no log written (" + log_path + " could not be opened)";
  return "log " + log_path;
}

std::vector<std::string> exit_summary_lines(int pid, const std::string& log_path, bool written,
                                            const ExitSummary& summary) {
  std::vector<std::string> lines;
  lines.push_back("summary of pid " + std::to_string(pid) + ", " +
                  exit_log_line(log_path, written));
  if (summary.devices.empty())
    lines.emplace_back("  no device memory was allocated under poolshim");
  for (const DeviceSnapshot& d : summary.devices) {
    const StatsSnapshot& s = d.stats;
    const std::string device = "  device " + std::to_string(d.device) + ": ";
    if (d.observe) {
      lines.push_back(device + "observe mode, " + count(s.allocs, "allocation") + " tracked (" +
                      std::to_string(s.async_allocs) + " async), " + std::to_string(s.frees) +
                      " freed, nothing pooled");
      lines.push_back("    peak tracked " + format_bytes(d.native_bytes_peak) +
                      ", peak requested " + format_bytes(s.requested_bytes.peak));
      lines.push_back("    out of memory: " + std::to_string(s.ooms));
      continue;
    }
    lines.push_back(device + count(s.allocs, "allocation") + " pooled (" +
                    std::to_string(s.async_allocs) + " async), " + std::to_string(s.frees) +
                    " freed; " + count(s.passthrough_allocs, "allocation") + " and " +
                    count(s.passthrough_frees, "free") + " passed through");
    lines.push_back("    peak reserved " + format_bytes(d.pool.reserved_high) + ", peak used " +
                    format_bytes(d.pool.used_high) + ", peak requested " +
                    format_bytes(s.requested_bytes.peak));
    lines.push_back("    out of memory: " + std::to_string(s.ooms) + " (" +
                    std::to_string(s.oom_with_slack) + " with enough unused pool memory), " +
                    std::to_string(s.oom_retries) + " retried after a trim (" +
                    std::to_string(s.oom_retry_successes) + " succeeded)");
  }
  std::uint64_t leaked = 0;
  for (const LiveAllocation& l : summary.live) leaked += l.info.requested;
  lines.push_back(summary.live.empty()
                      ? std::string("  leaks at exit: none")
                      : "  leaks at exit: " + count(summary.live.size(), "allocation") + ", " +
                            format_bytes(leaked));
  return lines;
}

}  // namespace poolshim
