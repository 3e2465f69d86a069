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

  /// Opens `path` for appending (created 0600 if missing). Refuses (issue 12): a symbolic
  /// link; anything but a regular file (a FIFO or device could block the writer, or is not a
  /// log); a file another user owns; a file with a second hard link. Opened non-blocking and
  /// close-on-exec, and moved to a high descriptor number, so that a program that closes
  /// descriptors and opens its own files does not get this one. Returns an empty string on
  /// success, else a sentence saying why. `truncate`: an existing file is emptied first, once
  /// it has passed those checks (the event log's CSV must start with its header, as RMM's
  /// logging_resource_adaptor truncates its file).
  std::string open(const std::string& path, bool truncate = false);
  /// Writes to an open descriptor the caller hands over (tests: a pipe nobody reads,
  /// /dev/full), with the same checks before each write as a log from open().
  void adopt(int fd, const std::string& name);
  bool is_open() const { return logger_ != nullptr; }
  const std::string& path() const { return path_; }
  /// Writes `record` and a newline with one write(2). Returns an empty string, or why the
  /// log stopped; it is then closed and later writes do nothing. It stops when the file
  /// cannot take the record (no space, the file-size limit: checked before the write, so
  /// that the log keeps whole lines), on an I/O error, and when its descriptor no longer
  /// refers to the file it opened (the program closed it and the number was reused).
  std::string write(const std::string& record);
  /// Closes the descriptor if it is still the log's (never a descriptor the program reused).
  void close();

 private:
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<class DescriptorSink> sink_;
  std::string path_;
};

}  // namespace poolshim
