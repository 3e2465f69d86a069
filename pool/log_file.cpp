#include "log_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

namespace poolshim {

namespace {

// spdlog sink writing each formatted record with one write(2) to a descriptor we opened.
class DescriptorSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit DescriptorSink(int fd) : fd_(fd) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    const char* p = formatted.data();
    std::size_t left = formatted.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // disk full or the like: lose the record, never the application
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}

 private:
  int fd_;
};

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

std::string LogFile::open(const std::string& path) {
  close();
  // O_NOFOLLOW: a log path that is a symbolic link could be used to overwrite another file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) return "cannot open log " + path + ": it is a symbolic link";
    return "cannot open log " + path + ": " + strerror(err);
  }
  try {
    auto sink = std::make_shared<DescriptorSink>(fd);
    logger_ = std::make_shared<spdlog::logger>("poolshim", std::move(sink));
    logger_->set_pattern("%v");
    logger_->set_level(spdlog::level::info);
  } catch (const std::exception& e) {
    ::close(fd);
    logger_.reset();
    return std::string("cannot set up the log: ") + e.what();
  }
  fd_ = fd;
  return {};
}

void LogFile::write(const std::string& record) {
  if (logger_ == nullptr) return;
  try {
    logger_->log(spdlog::level::info, spdlog::string_view_t(record.data(), record.size()));
  } catch (...) {
    // spdlog reports its own errors through its handler; nothing may reach the application.
  }
}

void LogFile::close() {
  logger_.reset();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace poolshim
