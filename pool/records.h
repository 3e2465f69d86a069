// The log records of DESIGN §5 (schema version kSchemaVersion, documented in README.md).
// Built as strings by the background thread; each is one JSON object on one line.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "events.h"
#include "router.h"

namespace poolshim {

constexpr int kSchemaVersion = 2;  // 2: observe mode's `mode`, the `native_*` fields

/// The library's version ("0.1.0").
const char* poolshim_version_string();

struct ProcessInfo {
  int pid = 0;
  std::string host;
  std::string rank;  // from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID; "0" if none
  std::vector<std::string> command_line;
  std::uint64_t start_unix_s = 0;   // wall clock at library load: start_unix_ns / 10^9
  std::uint64_t start_unix_ns = 0;  // the same reading in nanoseconds
  std::uint64_t start_mono_ns = 0;  // monotonic clock at library load: "t" counts from here
  std::string log_path;             // after expansion
  std::string prom_path;            // POOLSHIM_PROM_FILE after expansion; empty: none
  std::string events_path;          // POOLSHIM_EVENTS after expansion; empty: none
};

/// Seconds since `info.start_mono_ns`.
double seconds_since_start(const ProcessInfo& info, std::uint64_t mono_ns);

/// A call site rendered as JSON: "null", or an array of frames (see README, "The log").
using SiteJson = std::function<std::string(std::uint32_t site)>;
/// A call site in one line for people ("allocate_layer+0x1c (/usr/bin/app)"), "" if none.
using SiteText = std::function<std::string(std::uint32_t site)>;
inline std::string no_site_json(std::uint32_t) {
  return "null";
}

/// Live allocations grouped by call site.
struct SiteGroup {
  std::uint32_t site = 0;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
};
/// Groups `live` by call site, most bytes first, at most `limit` groups.
std::vector<SiteGroup> group_by_site(const std::vector<LiveAllocation>& live, std::size_t limit);
/// The `limit` largest of `live`, largest first.
std::vector<LiveAllocation> largest(std::vector<LiveAllocation> live, std::size_t limit);

/// What an `oom` record says beyond the OomReport: the device's live allocations then.
struct OomDetails {
  std::vector<LiveAllocation> largest;  // at most 10
  std::vector<SiteGroup> by_site;       // at most 10
  std::array<std::uint64_t, kHistogramBuckets> histogram{};
  std::uint64_t now_ns = 0;  // coarse monotonic, to age them
  std::string device_name;
  // The device's other memory when the record is written (milliseconds after the failure):
  // tracked native bytes, the application's VMM physical bytes with their top call sites, and
  // the rest of the device's used memory (other_bytes; other_known false when unknown).
  std::uint64_t native_bytes = 0;
  std::uint64_t vmm_bytes = 0;
  std::vector<VmmSiteBytes> vmm_sites;  // at most 5
  std::uint64_t other_bytes = 0;
  bool other_known = false;
};

std::string start_record(double t, const ProcessInfo& info, const Config& config,
                         const std::vector<DeviceDescription>& devices,
                         const std::string& free_mode = "");
/// Why a `sample` record was written (its `why` field).
enum class SampleWhy { interval, peak, oom, exit };
std::string sample_record(double t, int pid, const DeviceSnapshot& snap,
                          SampleWhy why = SampleWhy::interval);
std::string warning_record(double t, int pid, std::string_view text);
std::string oom_record(double t, int pid, const OomReport& report, const OomDetails& details,
                       const SiteJson& site_json);
/// The readable block the shim prints on stderr at an out-of-memory.
std::string oom_text(const OomReport& report, const OomDetails& details, const SiteText& site_text);

/// What the shim adds to the exit record: notes, and how many calls each way in caught.
struct ExitExtras {
  std::vector<std::string> notes;
  std::vector<std::pair<std::string, std::uint64_t>> paths;
  bool legacy_only = false;  // the legacy default stream stayed the only stream in use
};

/// The peak consumers of a device (the exit record's `peak_consumers`): its tracked live
/// allocations at the moment the background thread saw the most live bytes (it looks every
/// kPeakPollMs), grouped by call site.
struct PeakConsumers {
  bool seen = false;             // a look found live bytes on the device
  double t = 0;                  // when (the log's t)
  std::uint64_t coarse_ns = 0;   // when (coarse monotonic, to age the allocations as they were)
  std::uint64_t live_bytes = 0;  // requested bytes of the allocations found then
  std::uint64_t live_allocs = 0;
  std::vector<SiteGroup> by_site;       // at most 10
  std::vector<LiveAllocation> largest;  // at most 5
};

struct ExitSummary {
  std::vector<DeviceSnapshot> devices;
  std::vector<PeakConsumers> peaks;                  // per entry of `devices`
  std::vector<std::vector<VmmSiteBytes>> vmm_sites;  // per entry of `devices`: live VMM by site
  std::vector<LiveAllocation> live;  // the leaks: pooled allocations still live at exit
  std::uint64_t now_ns = 0;          // coarse monotonic, to age the leaks
  std::uint64_t events_dropped = 0;
  // POOLSHIM_EVENTS: rows written to the event log, and records lost (a full queue, or the file
  // could not be opened or written); both null in the record when the event log is off.
  bool event_log_on = false;
  std::uint64_t event_log_written = 0;
  std::uint64_t event_log_dropped = 0;
  std::vector<std::uint32_t> event_sites;  // call-site ids in the event log's rows (non-zero)
  std::uint64_t oom_repeats = 0;  // OOMs of an already reported situation, not written again
  ExitExtras extras;
};
std::string exit_record(double t, int pid, const ExitSummary& summary,
                        const SiteJson& site_json = no_site_json);

/// The fragmentation figures of DESIGN §5 (0 when the denominator is 0).
/// 1 - handed-out / reserved, where handed-out is the pool's used memory less `cached` bytes.
double pool_slack(const PoolUsage& u, std::uint64_t cached);
/// 1 - requested / handed-out (see pool_slack).
double rounding_waste(const PoolUsage& u, std::uint64_t cached, std::uint64_t requested);

/// The name of oom_verdict_of(r): "exhausted", "cap" or "fragmentation".
const char* oom_verdict(const OomReport& r);
/// The device's used memory (cuMemGetInfo: total - free, every process) that is neither the
/// pool's, nor tracked native allocations, nor the application's VMM memory: contexts,
/// libraries, untracked calls, other processes. 0 when the device's figures are unknown.
std::uint64_t other_bytes(const DeviceSnapshot& s);
/// One line: what to change.
std::string oom_hint(const OomReport& r);

}  // namespace poolshim
