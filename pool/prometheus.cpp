#include "prometheus.h"

#include "clock.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace poolshim {

namespace {

// Label values escape backslash, double quote and newline.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A family of series, one per device: one row of the table below, written by one loop (a
// template instantiation per family cost 83 KiB of object code).
struct Family {
  const char* name;
  const char* type;  // gauge or counter
  const char* help;
  double (*value)(const DeviceSnapshot&);
};

constexpr Family kFamilies[] = {
    {"poolshim_reserved_bytes", "gauge", "Memory the pool holds from the driver.",
     [](const DeviceSnapshot& d) -> double { return d.pool.reserved; }},
    {"poolshim_used_bytes", "gauge", "Memory of the pool handed out (cached bytes included).",
     [](const DeviceSnapshot& d) -> double { return d.pool.used; }},
    {"poolshim_cached_bytes", "gauge",
     "Bytes in the heap's free blocks: used to the pool, free to the application.",
     [](const DeviceSnapshot& d) -> double { return d.cached_bytes; }},
    {"poolshim_requested_bytes", "gauge", "Bytes the application asked for, live.",
     [](const DeviceSnapshot& d) -> double { return d.stats.requested_bytes.current; }},
    {"poolshim_live_allocations", "gauge", "Live pooled allocations.",
     [](const DeviceSnapshot& d) -> double { return d.stats.live_allocs.current; }},
    {"poolshim_cap_bytes", "gauge", "The pool's cap (POOLSHIM_LIMIT), 0 when none.",
     [](const DeviceSnapshot& d) -> double { return d.cap; }},
    {"poolshim_device_free_bytes", "gauge", "Device memory free as the driver sees it.",
     [](const DeviceSnapshot& d) -> double { return d.device_free; }},
    {"poolshim_device_total_bytes", "gauge", "Device memory in all.",
     [](const DeviceSnapshot& d) -> double { return d.device_total; }},
    {"poolshim_pool_slack_ratio", "gauge",
     "1 - (used - cached) / reserved: memory the pool holds but has not handed out, 0 when "
     "nothing is reserved.",
     [](const DeviceSnapshot& d) { return pool_slack(d.pool, d.cached_bytes); }},
    {"poolshim_allocations_total", "counter", "Allocations served from the pool.",
     [](const DeviceSnapshot& d) -> double { return d.stats.allocs; }},
    {"poolshim_frees_total", "counter", "Pooled blocks given back.",
     [](const DeviceSnapshot& d) -> double { return d.stats.frees; }},
    {"poolshim_passthrough_allocations_total", "counter",
     "Allocation calls passed to the real function.",
     [](const DeviceSnapshot& d) -> double { return d.stats.passthrough_allocs; }},
    {"poolshim_cache_hits_total", "counter",
     "Allocations served from a free block of the heap (no driver call).",
     [](const DeviceSnapshot& d) -> double { return d.stats.cache_hits; }},
    {"poolshim_cache_misses_total", "counter",
     "Allocations that needed a new segment from the pool.",
     [](const DeviceSnapshot& d) -> double { return d.stats.cache_misses; }},
};

void header(std::string& out, const char* name, const char* type, const char* help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void series(std::string& out, const char* name, const std::string& labels, double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  out.append(name).append("{").append(labels).append("} ").append(text).append("\n");
}

}  // namespace

std::string prometheus_text(const std::vector<DeviceSnapshot>& devices, const ProcessInfo& info,
                            std::string_view mode) {
  const std::string process =
      "host=\"" + label_value(info.host) + "\",rank=\"" + label_value(info.rank) + "\"";
  std::string out;
  header(out, "poolshim_info", "gauge",
         "The process behind the series (pid, poolshim's version, mode); always 1.");
  series(out, "poolshim_info",
         process + ",pid=\"" + std::to_string(info.pid) + "\",version=\"" +
             label_value(poolshim_version_string()) + "\",mode=\"" +
             label_value(std::string(mode)) + "\"",
         1);
  std::vector<std::string> labels;
  for (const auto& d : devices)
    labels.push_back(process + ",device=\"" + std::to_string(d.device) + "\"");
  for (const Family& f : kFamilies) {
    header(out, f.name, f.type, f.help);
    for (std::size_t i = 0; i < devices.size(); ++i)
      series(out, f.name, labels[i], f.value(devices[i]));
  }
  header(out, "poolshim_ooms_total", "counter",
         "Out-of-memory errors returned to the application, by the oom record's verdict.");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (int v = 0; v < kOomVerdicts; ++v) {
      series(out, "poolshim_ooms_total", labels[i] + ",verdict=\"" + kOomVerdictNames[v] + "\"",
             static_cast<double>(devices[i].stats.ooms_by_verdict[v]));
    }
  }
  return out;
}

std::string write_file_atomically(const std::string& path, const std::string& text,
                                  FileIdentity* written) {
  // Only a regular file of ours is replaced (issue 12: a device node at the path became a
  // regular file; as root that could be /dev/null).
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return "refusing to replace " + path + ": it is not a regular file";
    if (st.st_uid != ::geteuid()) {
      return "refusing to replace " + path + ": it belongs to another user (uid " +
             std::to_string(st.st_uid) + ")";
    }
  }
  // The temporary file's name is not guessable and it is created new (O_EXCL, no link
  // followed): a hard or symbolic link planted under a predictable name made the shim
  // overwrite the linked file.
  std::string temporary;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    std::uint64_t nonce = 0;
    if (::getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof nonce)) {
      nonce = now_ns() * 0x9e3779b97f4a7c15ULL ^ reinterpret_cast<std::uintptr_t>(&nonce);
    }
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(nonce));
    temporary = path + ".tmp." + std::to_string(getpid()) + "." + suffix;
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) return "cannot write " + temporary + ": " + strerror(errno);
  }
  if (fd < 0) return "cannot make a temporary file next to " + path;
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? strerror(errno) : "the write made no progress";
      ::close(fd);
      ::unlink(temporary.c_str());
      return "cannot write " + temporary + ": " + why;
    }
    done += static_cast<std::size_t>(n);
  }
  struct stat made {};
  const bool known = ::fstat(fd, &made) == 0;
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = strerror(errno);
    ::unlink(temporary.c_str());
    return "cannot rename " + temporary + " to " + path + ": " + why;
  }
  if (written != nullptr) *written = FileIdentity{known, made.st_dev, made.st_ino};
  return {};
}

std::string remove_file_if_ours(const std::string& path, const FileIdentity& written) {
  if (!written.valid) return {};
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? std::string() : "cannot remove " + path + ": " + strerror(errno);
  }
  // Another file at the path now (a user's, or a later process's that took the same name):
  // not ours to remove.
  if (!S_ISREG(st.st_mode) || st.st_dev != written.device || st.st_ino != written.inode) return {};
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return "cannot remove " + path + ": " + strerror(errno);
  }
  return {};
}

}  // namespace poolshim
