#include "records.h"

#include <algorithm>

#include "json.h"
#include "units.h"

#ifndef POOLSHIM_VERSION
#define POOLSHIM_VERSION "0.0.0"
#endif

namespace poolshim {

const char* poolshim_version_string() {
  return POOLSHIM_VERSION;
}

double seconds_since_start(const ProcessInfo& info, std::uint64_t mono_ns) {
  return mono_ns > info.start_mono_ns ? static_cast<double>(mono_ns - info.start_mono_ns) / 1e9
                                      : 0.0;
}

namespace {

JsonObject header(const char* type, double t, int pid) {
  JsonObject o;
  o.add("schema", kSchemaVersion).add("type", type).add("t", t).add("pid", pid);
  return o;
}

std::string histogram_json(const std::array<std::uint64_t, kHistogramBuckets>& h) {
  JsonObject o;
  for (int k = 0; k < kHistogramBuckets; ++k) {
    if (h[k] != 0) o.add(std::to_string(1ULL << k), h[k]);
  }
  return o.str();
}

// The figures of one device, shared by `sample` records and the `exit` record.
void add_device_fields(JsonObject& o, const DeviceSnapshot& s) {
  o.add("device", s.device);
  o.add("reserved_bytes", s.pool.reserved).add("reserved_bytes_peak", s.pool.reserved_high);
  o.add("used_bytes", s.pool.used).add("used_bytes_peak", s.pool.used_high);
#define POOLSHIM_ADD_GAUGE(name, meaning)    \
  o.add(#name, s.stats.name.current)         \
      .add(#name "_peak", s.stats.name.peak) \
      .add(#name "_total", s.stats.name.total);
  POOLSHIM_GAUGES(POOLSHIM_ADD_GAUGE)
#undef POOLSHIM_ADD_GAUGE
#define POOLSHIM_ADD_COUNTER(name, meaning) o.add(#name, s.stats.name);
  POOLSHIM_COUNTERS(POOLSHIM_ADD_COUNTER)
#undef POOLSHIM_ADD_COUNTER
  o.add("pool_slack", pool_slack(s.pool));
  o.add("rounding_waste", rounding_waste(s.pool, s.stats.requested_bytes.current));
  if (s.device_info_valid) {
    o.add("device_free", s.device_free).add("device_total", s.device_total);
  } else {
    o.add_null("device_free").add_null("device_total");
  }
  o.add_raw("size_histogram", histogram_json(s.stats.histogram));
}

}  // namespace

double pool_slack(const PoolUsage& u) {
  if (u.reserved == 0 || u.used >= u.reserved) return 0.0;
  return 1.0 - static_cast<double>(u.used) / static_cast<double>(u.reserved);
}

double rounding_waste(const PoolUsage& u, std::uint64_t requested) {
  if (u.used == 0 || requested >= u.used) return 0.0;
  return 1.0 - static_cast<double>(requested) / static_cast<double>(u.used);
}

std::string start_record(double t, const ProcessInfo& info, const Config& config,
                         const std::vector<DeviceDescription>& devices) {
  JsonObject o = header("start", t, info.pid);
  o.add("version", poolshim_version_string());
  o.add("host", info.host).add("rank", info.rank);
  o.add("start_unix_s", info.start_unix_s);
  o.add("log", info.log_path);
  std::vector<std::string> args;
  for (const auto& a : info.command_line) args.push_back(json_string(a));
  o.add_raw("command_line", json_array(args));
  JsonObject conf;
  JsonObject sources;
  const auto& table = option_table();
  for (std::size_t i = 0; i < table.size(); ++i) {
    conf.add(table[i].name, config.texts[i]);
    sources.add(table[i].name, source_name(config.sources[i]));
  }
  o.add_raw("config", conf.str());
  o.add_raw("config_sources", sources.str());
  std::vector<std::string> devs;
  for (const auto& d : devices) {
    JsonObject dj;
    dj.add("device", d.ordinal).add("name", d.name).add("total_bytes", d.total);
    devs.push_back(dj.str());
  }
  o.add_raw("devices", json_array(devs));
  return o.str();
}

std::string sample_record(double t, int pid, const DeviceSnapshot& snap) {
  JsonObject o = header("sample", t, pid);
  add_device_fields(o, snap);
  return o.str();
}

std::string warning_record(double t, int pid, std::string_view text) {
  JsonObject o = header("warning", t, pid);
  o.add("message", text);
  return o.str();
}

const char* oom_verdict(const OomReport& r) {
  const std::uint64_t unused = r.reserved > r.used ? r.reserved - r.used : 0;
  if (unused >= r.request) return "fragmentation";
  if (r.device_info_valid && r.device_free >= r.request) return "fragmentation";
  return "exhausted";
}

std::string oom_hint(const OomReport& r) {
  const std::uint64_t unused = r.reserved > r.used ? r.reserved - r.used : 0;
  if (std::string(oom_verdict(r)) == "fragmentation") {
    if (!r.retried) {
      return "memory is free (" + format_bytes(std::max(unused, r.device_free)) +
             ") but not in one piece of " + format_bytes(r.request) +
             ": set POOLSHIM_OOM_RETRY=1 so the pool is trimmed and the call retried";
    }
    return "memory is free (" + format_bytes(std::max(unused, r.device_free)) +
           ") but not in one piece of " + format_bytes(r.request) +
           " even after a trim: allocate the largest buffers first and reuse them";
  }
  if (r.request > r.device_total && r.device_info_valid) {
    return "the request (" + format_bytes(r.request) + ") is larger than the device (" +
           format_bytes(r.device_total) + "): check the size computation";
  }
  return "the device is full (" + format_bytes(r.live_bytes) + " live in " +
         std::to_string(r.live_count) +
         " pooled allocations): reduce the working set or free buffers earlier";
}

std::string oom_record(double t, int pid, const OomReport& r) {
  JsonObject o = header("oom", t, pid);
  o.add("device", r.device).add("request_bytes", r.request);
  o.add("api", r.async ? "cudaMallocAsync" : "cudaMalloc");
  o.add("stream", static_cast<std::uint64_t>(r.stream));
  if (r.device_info_valid) {
    o.add("device_free", r.device_free).add("device_total", r.device_total);
  } else {
    o.add_null("device_free").add_null("device_total");
  }
  o.add("reserved_bytes", r.reserved).add("used_bytes", r.used);
  o.add("pool_unused_bytes", r.reserved > r.used ? r.reserved - r.used : 0);
  o.add("released_bytes", r.released_after);
  o.add("live_bytes", r.live_bytes).add("live_allocs", r.live_count);
  o.add("retried", r.retried);
  o.add("verdict", oom_verdict(r));
  o.add("hint", oom_hint(r));
  return o.str();
}

std::string exit_record(double t, int pid, const ExitSummary& summary) {
  JsonObject o = header("exit", t, pid);
  std::uint64_t pooled = 0;
  std::vector<std::string> devs;
  for (const auto& d : summary.devices) {
    pooled += d.stats.allocs;
    JsonObject dj;
    add_device_fields(dj, d);
    devs.push_back(dj.str());
  }
  o.add("pooled_allocs", pooled);
  o.add_raw("devices", json_array(devs));

  std::uint64_t leaked_bytes = 0;
  for (const auto& l : summary.live) leaked_bytes += l.info.requested;
  std::vector<LiveAllocation> largest = summary.live;
  std::sort(largest.begin(), largest.end(), [](const LiveAllocation& a, const LiveAllocation& b) {
    return a.info.requested != b.info.requested ? a.info.requested > b.info.requested
                                                : a.ptr < b.ptr;
  });
  if (largest.size() > 10) largest.resize(10);
  std::vector<std::string> rows;
  for (const auto& l : largest) {
    JsonObject lj;
    lj.add("device", l.info.device).add("bytes", l.info.requested);
    const double age = summary.now_ns > l.info.birth_ns
                           ? static_cast<double>(summary.now_ns - l.info.birth_ns) / 1e9
                           : 0.0;
    lj.add("age_s", age).add("async", (l.info.flags & Allocation::kAsync) != 0);
    rows.push_back(lj.str());
  }
  JsonObject leaks;
  leaks.add("count", static_cast<std::uint64_t>(summary.live.size())).add("bytes", leaked_bytes);
  leaks.add_raw("largest", json_array(rows));
  o.add_raw("leaks", leaks.str());
  o.add("events_dropped", summary.events_dropped);
  JsonObject paths;
  for (const auto& [name, count] : summary.extras.paths) paths.add(name, count);
  o.add_raw("paths", paths.str());
  std::vector<std::string> notes;
  for (const auto& n : summary.extras.notes) notes.push_back(json_string(n));
  o.add_raw("notes", json_array(notes));
  return o.str();
}

}  // namespace poolshim
