#include "records.h"

#include <algorithm>
#include <cstdio>
#include <map>

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

}  // namespace

std::uint64_t other_bytes(const DeviceSnapshot& s) {
  if (!s.device_info_valid || s.device_total < s.device_free) return 0;
  const std::uint64_t used = s.device_total - s.device_free;
  const std::uint64_t known = s.pool.reserved + s.native_bytes + s.vmm.physical_bytes.current;
  return used > known ? used - known : 0;
}

namespace {

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
  if (s.cap > 0) {
    o.add("cap_bytes", s.cap);
  } else {
    o.add_null("cap_bytes");
  }
  o.add("native_bytes", s.native_bytes).add("native_bytes_peak", s.native_bytes_peak);
  o.add("native_allocs", s.native_allocs);
#define POOLSHIM_ADD_VMM_GAUGE(name, meaning)     \
  o.add("vmm_" #name, s.vmm.name.current)         \
      .add("vmm_" #name "_peak", s.vmm.name.peak) \
      .add("vmm_" #name "_total", s.vmm.name.total);
  POOLSHIM_VMM_GAUGES(POOLSHIM_ADD_VMM_GAUGE)
#undef POOLSHIM_ADD_VMM_GAUGE
#define POOLSHIM_ADD_VMM_COUNTER(name, meaning) o.add("vmm_" #name, s.vmm.name);
  POOLSHIM_VMM_COUNTERS(POOLSHIM_ADD_VMM_COUNTER)
#undef POOLSHIM_ADD_VMM_COUNTER
  o.add("cached_bytes", s.cached_bytes).add("cached_bytes_peak", s.cached_bytes_peak);
  o.add("pool_slack", pool_slack(s.pool, s.cached_bytes));
  o.add("rounding_waste", rounding_waste(s.pool, s.cached_bytes, s.stats.requested_bytes.current));
  if (s.device_info_valid) {
    o.add("device_free", s.device_free).add("device_total", s.device_total);
    o.add("other_bytes", other_bytes(s));
  } else {
    o.add_null("device_free").add_null("device_total").add_null("other_bytes");
  }
  o.add_raw("size_histogram", histogram_json(s.stats.histogram));
}

}  // namespace

double pool_slack(const PoolUsage& u, std::uint64_t cached) {
  const std::uint64_t used = handed_out(u, cached);
  if (u.reserved == 0 || used >= u.reserved) return 0.0;
  return 1.0 - static_cast<double>(used) / static_cast<double>(u.reserved);
}

double rounding_waste(const PoolUsage& u, std::uint64_t cached, std::uint64_t requested) {
  const std::uint64_t used = handed_out(u, cached);
  if (used == 0 || requested >= used) return 0.0;
  return 1.0 - static_cast<double>(requested) / static_cast<double>(used);
}

std::string start_record(double t, const ProcessInfo& info, const Config& config,
                         const std::vector<DeviceDescription>& devices,
                         const std::string& free_mode) {
  JsonObject o = header("start", t, info.pid);
  o.add("version", poolshim_version_string());
  o.add("host", info.host).add("rank", info.rank);
  o.add("start_unix_s", info.start_unix_s).add("start_unix_ns", info.start_unix_ns);
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
  for (const auto& [device, value] : config.device_limits) {
    conf.add("limit_" + std::to_string(device),
             value.is_percent ? std::to_string(value.percent) + "%" : std::to_string(value.bytes));
  }
  o.add_raw("config", conf.str());
  o.add_raw("config_sources", sources.str());
  o.add("free_mode", free_mode);
  std::vector<std::string> devs;
  for (const auto& d : devices) {
    JsonObject dj;
    dj.add("device", d.ordinal).add("name", d.name).add("total_bytes", d.total);
    devs.push_back(dj.str());
  }
  o.add_raw("devices", json_array(devs));
  return o.str();
}

std::string sample_record(double t, int pid, const DeviceSnapshot& snap, SampleWhy why) {
  static constexpr const char* kWhy[] = {"interval", "peak", "oom", "exit"};
  JsonObject o = header("sample", t, pid);
  add_device_fields(o, snap);
  o.add("why", kWhy[static_cast<int>(why)]);
  return o.str();
}

std::string warning_record(double t, int pid, std::string_view text) {
  JsonObject o = header("warning", t, pid);
  o.add("message", text);
  return o.str();
}

const char* oom_verdict(const OomReport& r) {
  return kOomVerdictNames[static_cast<int>(oom_verdict_of(r))];
}

std::string oom_hint(const OomReport& r) {
  const std::uint64_t unused = r.reserved > r.used ? r.reserved - r.used : 0;
  const std::string verdict = oom_verdict(r);
  if (verdict == "cap") {
    const std::uint64_t room = r.cap > r.reserved ? r.cap - r.reserved : 0;
    const std::string pieces =
        unused > 0 ? " unreserved, and the pool " + format_bytes(unused) + " unused," : "";
    return "the cap (POOLSHIM_LIMIT, " + format_bytes(r.cap) + ") leaves " + format_bytes(room) +
           pieces + " for a request of " + format_bytes(r.request) +
           ": this is the out-of-memory a device of that size would give; raise or unset the "
           "cap to go on";
  }
  if (verdict == "fragmentation") {
    const std::uint64_t free = std::max(unused, r.device_free);
    if (!r.retried) {
      return "memory is free (" + format_bytes(free) + ") but not in one piece of " +
             format_bytes(r.request) +
             ": set POOLSHIM_OOM_RETRY=1 so the pool is trimmed and "
             "the call retried";
    }
    return "memory is free (" + format_bytes(free) + ") but not in one piece of " +
           format_bytes(r.request) +
           " even after a trim: allocate the largest buffers first and reuse them";
  }
  if (r.request > r.device_total && r.device_info_valid) {
    return "the request (" + format_bytes(r.request) + ") is larger than the device (" +
           format_bytes(r.device_total) + "): check the size computation";
  }
  return "the device is full (" + format_bytes(r.live_bytes) + " live in " +
         std::to_string(r.live_count) + (r.observe ? " tracked" : " pooled") +
         " allocations): reduce the working set or free buffers earlier";
}

std::vector<SiteGroup> group_by_site(const std::vector<LiveAllocation>& live, std::size_t limit) {
  std::map<std::uint32_t, SiteGroup> groups;
  for (const auto& l : live) {
    SiteGroup& g = groups[l.info.site];
    g.site = l.info.site;
    ++g.count;
    g.bytes += l.info.requested;
  }
  std::vector<SiteGroup> out;
  for (const auto& [site, g] : groups) out.push_back(g);
  std::sort(out.begin(), out.end(), [](const SiteGroup& a, const SiteGroup& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::vector<LiveAllocation> largest(std::vector<LiveAllocation> live, std::size_t limit) {
  std::sort(live.begin(), live.end(), [](const LiveAllocation& a, const LiveAllocation& b) {
    return a.info.requested != b.info.requested ? a.info.requested > b.info.requested
                                                : a.ptr < b.ptr;
  });
  if (live.size() > limit) live.resize(limit);
  return live;
}

namespace {

double age_of(const Allocation& a, std::uint64_t now_ns) {
  return now_ns > a.birth_ns ? static_cast<double>(now_ns - a.birth_ns) / 1e9 : 0.0;
}

std::string allocation_json(const LiveAllocation& l, std::uint64_t now_ns,
                            const SiteJson& site_json) {
  JsonObject lj;
  lj.add("device", l.info.device).add("bytes", l.info.requested);
  lj.add("age_s", age_of(l.info, now_ns)).add("async", (l.info.flags & Allocation::kAsync) != 0);
  lj.add("stream", static_cast<std::uint64_t>(l.info.stream));
  lj.add_raw("site", site_json(l.info.site));
  return lj.str();
}

std::string groups_json(const std::vector<SiteGroup>& groups, const SiteJson& site_json) {
  std::vector<std::string> rows;
  for (const auto& g : groups) {
    JsonObject gj;
    gj.add_raw("site", site_json(g.site));
    gj.add("count", g.count).add("bytes", g.bytes);
    rows.push_back(gj.str());
  }
  return json_array(rows);
}

}  // namespace

namespace {
std::string vmm_sites_json(const std::vector<VmmSiteBytes>& sites, const SiteJson& site_json) {
  std::vector<std::string> rows;
  for (const auto& s : sites) {
    JsonObject o;
    o.add_raw("site", site_json(s.site));
    o.add("bytes", s.bytes);
    rows.push_back(o.str());
  }
  return json_array(rows);
}
}  // namespace

std::string oom_record(double t, int pid, const OomReport& r, const OomDetails& details,
                       const SiteJson& site_json) {
  JsonObject o = header("oom", t, pid);
  o.add("device", r.device).add("request_bytes", r.request);
  o.add("api", r.async ? "cudaMallocAsync" : "cudaMalloc");
  o.add("mode", r.observe ? "observe" : "pool");
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
  if (r.cap > 0) {
    o.add("cap_bytes", r.cap);
  } else {
    o.add_null("cap_bytes");
  }
  o.add("retried", r.retried);
  o.add("verdict", oom_verdict(r));
  o.add("hint", oom_hint(r));
  o.add_raw("site", site_json(r.site));
  std::vector<std::string> rows;
  for (const auto& l : details.largest)
    rows.push_back(allocation_json(l, details.now_ns, site_json));
  o.add_raw("largest", json_array(rows));
  o.add_raw("by_site", groups_json(details.by_site, site_json));
  o.add_raw("size_histogram", histogram_json(details.histogram));
  o.add("native_bytes", details.native_bytes).add("vmm_bytes", details.vmm_bytes);
  o.add_raw("vmm_by_site", vmm_sites_json(details.vmm_sites, site_json));
  if (details.other_known) {
    o.add("other_bytes", details.other_bytes);
  } else {
    o.add_null("other_bytes");
  }
  return o.str();
}

namespace {
std::string allocations(std::uint64_t n) {
  return std::to_string(n) + (n == 1 ? " allocation" : " allocations");
}
}  // namespace

std::string oom_text(const OomReport& r, const OomDetails& details, const SiteText& site_text) {
  const std::uint64_t unused = r.reserved > r.used ? r.reserved - r.used : 0;
  std::string out = "out of memory on device " + std::to_string(r.device) +
                    (details.device_name.empty() ? "" : " (" + details.device_name + ")") + "\n";
  auto line = [&out](const char* label, const std::string& text) {
    char head[32];
    std::snprintf(head, sizeof head, "  %-12s ", label);
    out += head + text + "\n";
  };
  const std::string where = site_text(r.site);
  line("request", format_bytes(r.request) + " by " + (r.async ? "cudaMallocAsync" : "cudaMalloc") +
                      (where.empty() ? "" : ", from " + where));
  std::string device =
      r.device_info_valid ? format_bytes(r.device_free) + " free of " + format_bytes(r.device_total)
                          : std::string("figures unknown");
  if (r.cap > 0) {
    device += "; cap " + format_bytes(r.cap) + " (" +
              format_bytes(r.cap > r.used ? r.cap - r.used : 0) + " headroom)";
  }
  line("device", device);
  if (r.observe) {
    line("mode", "observe: the real function served every allocation, nothing is pooled");
  } else {
    line("pool", format_bytes(r.reserved) + " reserved, " + format_bytes(r.used) + " used, " +
                     format_bytes(unused) + " unused (" + format_bytes(r.released_after) +
                     " given back before the real call)");
  }
  line("live", allocations(r.live_count) + ", " + format_bytes(r.live_bytes) + " requested");
  bool first = true;
  std::size_t shown = 0;
  for (const auto& l : details.largest) {
    if (++shown > 5) break;  // the record has ten; five read well
    char age[32];
    std::snprintf(age, sizeof age, "%.1f s", age_of(l.info, details.now_ns));
    const std::string at = site_text(l.info.site);
    line(first ? "largest" : "", format_bytes(l.info.requested) + ", age " + age +
                                     (l.info.flags & Allocation::kAsync ? ", async" : "") +
                                     (at.empty() ? "" : ", from " + at));
    first = false;
  }
  first = true;
  for (const auto& g : details.by_site) {
    const std::string at = site_text(g.site);
    line(first ? "by call site" : "", allocations(g.count) + ", " + format_bytes(g.bytes) +
                                          " from " +
                                          (at.empty() ? std::string("(not recorded)") : at));
    first = false;
  }
  std::string histogram;
  for (int k = 0; k < kHistogramBuckets; ++k) {
    if (details.histogram[k] == 0) continue;
    if (!histogram.empty()) histogram += ", ";
    histogram += std::to_string(details.histogram[k]) + " x " + format_bytes(1ULL << k) + "+";
  }
  if (!histogram.empty()) line("sizes", histogram);
  if (details.vmm_bytes > 0) {
    const std::string at =
        details.vmm_sites.empty() ? std::string() : site_text(details.vmm_sites[0].site);
    line("vmm", format_bytes(details.vmm_bytes) + " made by the application (cuMemCreate)" +
                    (at.empty() ? "" : ", most from " + at));
  }
  if (!r.observe && details.native_bytes > 0) {
    line("passed", format_bytes(details.native_bytes) + " in allocations passed through");
  }
  if (details.other_known) {
    line("other", format_bytes(details.other_bytes) +
                      " of the device's used memory is none of the above (contexts, libraries, "
                      "other processes)");
  }
  line("verdict", oom_verdict(r));
  line("hint", oom_hint(r));
  return out;
}

namespace {

// The exit record's `peak_consumers` of one device (ages as they were at the look).
std::string peak_consumers_json(const PeakConsumers& p, const SiteJson& site_json) {
  if (!p.seen) return "null";
  JsonObject o;
  o.add("t", p.t).add("live_bytes", p.live_bytes).add("live_allocs", p.live_allocs);
  std::vector<std::string> rows;
  for (const auto& l : p.largest) rows.push_back(allocation_json(l, p.coarse_ns, site_json));
  o.add_raw("largest", json_array(rows));
  o.add_raw("by_site", groups_json(p.by_site, site_json));
  return o.str();
}

}  // namespace

std::string exit_record(double t, int pid, const ExitSummary& summary, const SiteJson& site_json) {
  JsonObject o = header("exit", t, pid);
  std::uint64_t pooled = 0;
  std::vector<std::string> devs;
  for (std::size_t i = 0; i < summary.devices.size(); ++i) {
    const DeviceSnapshot& d = summary.devices[i];
    if (!d.observe) pooled += d.stats.allocs;  // observe mode tracks them, pooling none
    JsonObject dj;
    add_device_fields(dj, d);
    if (i < summary.vmm_sites.size()) {
      dj.add_raw("vmm_by_site", vmm_sites_json(summary.vmm_sites[i], site_json));
    }
    if (i < summary.peaks.size()) {
      dj.add_raw("peak_consumers", peak_consumers_json(summary.peaks[i], site_json));
    }
    devs.push_back(dj.str());
  }
  o.add("pooled_allocs", pooled);
  o.add_raw("devices", json_array(devs));

  std::uint64_t leaked_bytes = 0;
  for (const auto& l : summary.live) leaked_bytes += l.info.requested;
  std::vector<std::string> rows;
  for (const auto& l : largest(summary.live, 10)) {
    rows.push_back(allocation_json(l, summary.now_ns, site_json));
  }
  JsonObject leaks;
  leaks.add("count", static_cast<std::uint64_t>(summary.live.size())).add("bytes", leaked_bytes);
  leaks.add_raw("largest", json_array(rows));
  leaks.add_raw("by_site", groups_json(group_by_site(summary.live, 20), site_json));
  o.add_raw("leaks", leaks.str());
  o.add("events_dropped", summary.events_dropped);
  if (summary.event_log_on) {
    o.add("event_log_written", summary.event_log_written);
    o.add("event_log_dropped", summary.event_log_dropped);
    JsonObject sites;
    for (std::uint32_t s : summary.event_sites) sites.add_raw(std::to_string(s), site_json(s));
    o.add_raw("event_log_sites", sites.str());
  } else {
    o.add_null("event_log_written").add_null("event_log_dropped").add_null("event_log_sites");
  }
  o.add("oom_repeats", summary.oom_repeats);
  JsonObject paths;
  for (const auto& [name, count] : summary.extras.paths) paths.add(name, count);
  o.add_raw("paths", paths.str());
  o.add("legacy_only", summary.extras.legacy_only);
  std::vector<std::string> notes;
  for (const auto& n : summary.extras.notes) notes.push_back(json_string(n));
  o.add_raw("notes", json_array(notes));
  return o.str();
}

}  // namespace poolshim
