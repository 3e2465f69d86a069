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

struct Metric {
  const char* name;
  const char* type;  // gauge or counter
  const char* help;
};

}  // namespace

std::string prometheus_text(const std::vector<DeviceSnapshot>& devices, const ProcessInfo& info) {
  std::string out;
  auto family = [&](const Metric& m, auto value_of) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n";
    out += std::string("# TYPE ") + m.name + " " + m.type + "\n";
    for (const auto& d : devices) {
      char value[64];
      std::snprintf(value, sizeof value, "%.17g", static_cast<double>(value_of(d)));
      out += std::string(m.name) + "{pid=\"" + std::to_string(info.pid) + "\",host=\"" +
             label_value(info.host) + "\",rank=\"" + label_value(info.rank) + "\",device=\"" +
             std::to_string(d.device) + "\"} " + value + "\n";
    }
  };
  family({"poolshim_reserved_bytes", "gauge", "Memory the pool holds from the driver."},
         [](const DeviceSnapshot& d) { return d.pool.reserved; });
  family({"poolshim_used_bytes", "gauge", "Memory of the pool handed out."},
         [](const DeviceSnapshot& d) { return d.pool.used; });
  family({"poolshim_requested_bytes", "gauge", "Bytes the application asked for, live."},
         [](const DeviceSnapshot& d) { return d.stats.requested_bytes.current; });
  family({"poolshim_live_allocations", "gauge", "Live pooled allocations."},
         [](const DeviceSnapshot& d) { return d.stats.live_allocs.current; });
  family({"poolshim_cap_bytes", "gauge", "The pool's cap (POOLSHIM_LIMIT), 0 when none."},
         [](const DeviceSnapshot& d) { return d.cap; });
  family({"poolshim_device_free_bytes", "gauge", "Device memory free as the driver sees it."},
         [](const DeviceSnapshot& d) { return d.device_free; });
  family({"poolshim_device_total_bytes", "gauge", "Device memory in all."},
         [](const DeviceSnapshot& d) { return d.device_total; });
  family({"poolshim_pool_slack_ratio", "gauge", "1 - used / reserved."},
         [](const DeviceSnapshot& d) { return pool_slack(d.pool, d.cached_bytes); });
  family({"poolshim_allocations_total", "counter", "Allocations served from the pool."},
         [](const DeviceSnapshot& d) { return d.stats.allocs; });
  family({"poolshim_frees_total", "counter", "Pooled blocks given back."},
         [](const DeviceSnapshot& d) { return d.stats.frees; });
  family({"poolshim_passthrough_allocations_total", "counter",
          "Allocation calls passed to the real function."},
         [](const DeviceSnapshot& d) { return d.stats.passthrough_allocs; });
  family({"poolshim_oom_total", "counter", "Out-of-memory errors returned to the application."},
         [](const DeviceSnapshot& d) { return d.stats.ooms; });
  return out;
}

std::string write_file_atomically(const std::string& path, const std::string& text) {
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
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = strerror(errno);
    ::unlink(temporary.c_str());
    return "cannot rename " + temporary + " to " + path + ": " + why;
  }
  return {};
}

}  // namespace poolshim
