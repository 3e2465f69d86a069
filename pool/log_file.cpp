#include "log_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

namespace poolshim {

// spdlog sink writing each formatted record with one write(2) to the log's descriptor, after
// checking that the descriptor is still the log's and that the record fits under the file-size
// limit. A failed write stops the log (error() says why) and never reaches the application:
// the background thread blocks every signal, so a write past RLIMIT_FSIZE fails with EFBIG
// instead of raising SIGXFSZ.
class DescriptorSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  DescriptorSink(int fd, const struct stat& st) : fd_(fd), dev_(st.st_dev), ino_(st.st_ino) {
    struct rlimit limit {};
    if (getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      size_limit_ = static_cast<std::uint64_t>(limit.rlim_cur);
    }
  }
  /// Why the log stopped; empty while it works.
  const std::string& error() const { return error_; }
  /// The descriptor, while it still refers to the log's file (else -1).
  int owned_descriptor() const {
    struct stat st {};
    return fd_ >= 0 && ::fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_ ? fd_ : -1;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!error_.empty()) return;
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
      error_ = "its descriptor was closed or reused by the program";
      fd_ = -1;  // not ours any more: never written or closed again
      return;
    }
    if (size_limit_ != 0 &&
        static_cast<std::uint64_t>(st.st_size) + formatted.size() > size_limit_) {
      error_ =
          "it reached the file-size limit (ulimit -f: " + std::to_string(size_limit_) + " bytes)";
      return;
    }
    const char* p = formatted.data();
    std::size_t left = formatted.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = n < 0 ? strerror(errno) : "the write made no progress";
        return;
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}

 private:
  int fd_;
  dev_t dev_;
  ino_t ino_;
  std::uint64_t size_limit_ = 0;  // RLIMIT_FSIZE in bytes, 0: none
  std::string error_;
};

namespace {

// Descriptors at or above this are rarely taken by a program: one that closes every
// descriptor above 2 and opens its own files gets low numbers, never the log's. Below 1024,
// so that a huge RLIMIT_NOFILE does not make the kernel grow the descriptor table for it.
int move_high(int fd) {
  long ceiling = 1024;
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<long>(limit.rlim_cur) < ceiling) {
    ceiling = static_cast<long>(limit.rlim_cur);
  }
  const long floor = ceiling >= 128 ? ceiling - 24 : ceiling / 2;
  if (floor <= fd) return fd;
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(floor));
  if (high < 0) return fd;  // all taken: keep the low one
  ::close(fd);
  return high;
}

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

}  // namespace

std::string rank_from_environment() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "0";
}

std::string expand_log_path(const std::string& path_template, int pid, const std::string& host,
                            const std::string& rank, std::uint64_t start_unix_s) {
  std::string out;
  for (std::size_t i = 0; i < path_template.size(); ++i) {
    const char c = path_template[i];
    if (c != '%' || i + 1 == path_template.size()) {
      out += c;
      continue;
    }
    const char e = path_template[++i];
    if (e == 'p') {
      out += std::to_string(pid);
    } else if (e == 'h') {
      out += host;
    } else if (e == 'r') {
      out += rank;
    } else if (e == 't') {
      const time_t t = static_cast<time_t>(start_unix_s);
      struct tm tm_buf {};
      localtime_r(&t, &tm_buf);
      char buf[32];
      strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm_buf);
      out += buf;
    } else if (e == '%') {
      out += '%';
    } else {
      out += '%';
      out += e;
    }
  }
  return out;
}

LogFile::LogFile() = default;

LogFile::~LogFile() {
  close();
}

std::string LogFile::open(const std::string& path, bool truncate) {
  close();
  const std::string why = "cannot open log " + path + ": ";
  // O_NOFOLLOW: a log path that is a symbolic link could be used to overwrite another file.
  // O_NONBLOCK: opening a FIFO must not wait for a reader (it fails with ENXIO instead).
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) return why + "it is a symbolic link";
    struct stat st {};
    if (err == ENXIO && ::lstat(path.c_str(), &st) == 0) {
      return why + "it is " + file_kind(st.st_mode) + ", not a regular file";
    }
    return why + strerror(err);
  }
  struct stat st {};
  std::string refusal;
  if (::fstat(fd, &st) != 0) {
    refusal = strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    refusal = std::string("it is ") + file_kind(st.st_mode) + ", not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    refusal = "it belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  } else if (st.st_nlink != 1) {
    refusal = "it has " + std::to_string(st.st_nlink) + " hard links";
  }
  if (refusal.empty() && truncate && st.st_size != 0 && ::ftruncate(fd, 0) != 0) {
    refusal = std::string("cannot empty it: ") + strerror(errno);
  }
  if (!refusal.empty()) {
    ::close(fd);
    return why + refusal;
  }
  adopt(move_high(fd), path);
  return is_open() ? std::string() : "cannot set up the log " + path;
}

void LogFile::adopt(int fd, const std::string& name) {
  close();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  try {
    sink_ = std::make_shared<DescriptorSink>(fd, st);
    logger_ = std::make_shared<spdlog::logger>("poolshim", sink_);
    logger_->set_pattern("%v");
    logger_->set_level(spdlog::level::info);
    path_ = name;
  } catch (...) {
    ::close(fd);
    logger_.reset();
    sink_.reset();
  }
}

std::string LogFile::write(const std::string& record) {
  if (logger_ == nullptr) return {};
  try {
    logger_->log(spdlog::level::info, spdlog::string_view_t(record.data(), record.size()));
  } catch (...) {
    // spdlog reports its own errors through its handler; nothing may reach the application.
  }
  const std::string error = sink_->error();
  if (!error.empty()) close();
  return error;
}

void LogFile::close() {
  if (sink_ != nullptr) {
    const int fd = sink_->owned_descriptor();
    if (fd >= 0) ::close(fd);
  }
  logger_.reset();
  sink_.reset();
  path_.clear();
}

}  // namespace poolshim
