// The log file: JSON Lines written through spdlog (a sink on our own file descriptor, so that
// symbolic links are refused and each record is one write(2) that survives an abort()).
// Only the background thread writes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace spdlog {
class logger;
}

namespace poolshim {

/// Expands %p (pid), %h (host), %r (rank), %t (start time, YYYYmmdd-HHMMSS local) and %%.
std::string expand_log_path(const std::string& path_template, int pid, const std::string& host,
                            const std::string& rank, std::uint64_t start_unix_s);

/// The rank from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID (first set), else "0".
std::string rank_from_environment();

class LogFile {
 public:
  LogFile();
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  /// Opens `path` for appending (created 0644 if missing). Refuses a symbolic link. Returns
  /// an empty string on success, else a sentence saying why.
  std::string open(const std::string& path);
  bool is_open() const { return logger_ != nullptr; }
  /// Writes `record` and a newline.
  void write(const std::string& record);
  void close();

 private:
  std::shared_ptr<spdlog::logger> logger_;
  int fd_ = -1;
};

}  // namespace poolshim
