// The IPC broker (ipc_broker.h). One request and one reply per connection, each a single
// SOCK_SEQPACKET message:
//   request: magic, version, token, export id              (4 + 4 + 8 + 8 bytes)
//   reply:   magic, status, descriptor count, payload size  (4 x 4 bytes), the payload,
//            and the descriptors as SCM_RIGHTS
#include "ipc_broker.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace poolshim {

namespace {

constexpr std::uint32_t kMagic = 0x42495350;  // "PSIB"
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kMaxFds = 64;
constexpr std::size_t kMaxPayload = 16384;
constexpr int kServerTimeoutS = 1;  // a connection that sends nothing cannot hold the broker
constexpr int kClientTimeoutS = 5;

enum Status : std::uint32_t { kOk = 0, kRefused = 1, kNotFound = 2 };

struct Request {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint64_t token;
  std::uint64_t id;
};

struct ReplyHeader {
  std::uint32_t magic;
  std::uint32_t status;
  std::uint32_t fds;
  std::uint32_t payload;
};

bool fill_address(const std::string& path, sockaddr_un* address) {
  std::memset(address, 0, sizeof *address);
  address->sun_family = AF_UNIX;
  if (path.size() >= sizeof address->sun_path) return false;
  std::memcpy(address->sun_path, path.c_str(), path.size() + 1);
  return true;
}

void set_timeout(int fd, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool peer(int fd, ucred* out) {
  socklen_t length = sizeof *out;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, out, &length) == 0 && length == sizeof *out;
}

std::uint64_t random_token() {
  std::uint64_t token = 0;
  while (token == 0) {
    if (getrandom(&token, sizeof token, 0) != static_cast<ssize_t>(sizeof token)) return 0;
  }
  return token;
}

// A directory for the sockets that only this user can reach: made 0700, or an existing one
// that is a directory (not a link) this user owns with no access for anyone else.
bool private_directory(const std::string& dir, std::string* why) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot make " + dir + ": " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    *why = dir + " is not a directory of this user's alone (mode 0700)";
    return false;
  }
  return true;
}

void send_reply(int connection, std::uint32_t status, const IpcBroker::Reply& reply) {
  const bool ok = status == kOk;
  ReplyHeader header{kMagic, status, ok ? static_cast<std::uint32_t>(reply.fds.size()) : 0,
                     ok ? static_cast<std::uint32_t>(reply.payload.size()) : 0};
  std::string body(reinterpret_cast<const char*>(&header), sizeof header);
  if (ok) body += reply.payload;
  iovec iov{body.data(), body.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (ok && !reply.fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * reply.fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * reply.fds.size());
    std::memcpy(CMSG_DATA(c), reply.fds.data(), sizeof(int) * reply.fds.size());
  }
  sendmsg(connection, &message, MSG_NOSIGNAL);
}

}  // namespace

IpcBroker::IpcBroker(std::string dir)
    : dir_(dir.empty() ? "/tmp/poolshim-" + std::to_string(geteuid()) : std::move(dir)) {}

IpcBroker::~IpcBroker() {
  stop();
}

std::string IpcBroker::socket_path(pid_t pid) const {
  return dir_ + "/ipc-" + std::to_string(pid);
}

bool IpcBroker::start(Lookup lookup, std::string* why) {
  std::string reason;
  if (started_) return start_result_;
  started_ = true;
  const std::uint64_t token = random_token();
  const std::string path = socket_path(getpid());
  sockaddr_un address{};
  int fd = -1;
  if (token == 0) {
    reason = "no random bytes for the broker's token";
  } else if (!fill_address(path, &address)) {
    reason = "socket path too long: " + path;
  } else if (private_directory(dir_, &reason)) {
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    unlink(path.c_str());  // a stale file of an earlier process with this pid
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        chmod(path.c_str(), 0600) != 0 || listen(fd, 16) != 0) {
      reason = "cannot listen at " + path + ": " + std::strerror(errno);
      if (fd >= 0) close(fd);
      unlink(path.c_str());
      fd = -1;
    }
  }
  if (fd < 0) {
    if (why != nullptr) *why = reason;
    return start_result_ = false;
  }
  lookup_ = std::move(lookup);
  token_ = token;
  path_ = path;
  listen_fd_.store(fd, std::memory_order_release);
  thread_ = std::thread([this] { serve(); });
  return start_result_ = true;
}

void IpcBroker::serve() {
  for (;;) {
    const int listening = listen_fd_.load(std::memory_order_acquire);
    if (listening < 0 || stopping_.load(std::memory_order_acquire)) return;
    const int connection = accept4(listening, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) {
      if (stopping_.load(std::memory_order_acquire)) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        usleep(10000);  // out of descriptors for a moment: the next try may have one
        continue;
      }
      return;
    }
    answer(connection);
    close(connection);
  }
}

void IpcBroker::answer(int connection) {
  set_timeout(connection, kServerTimeoutS);
  ucred who{};
  Request request{};
  const bool same_user = peer(connection, &who) && who.uid == geteuid();
  const ssize_t n = recv(connection, &request, sizeof request, 0);
  Reply reply;
  if (!same_user || n != static_cast<ssize_t>(sizeof request) || request.magic != kMagic ||
      request.version != kVersion || request.token != token_) {
    send_reply(connection, kRefused, reply);
    return;
  }
  const bool found = lookup_ && lookup_(request.id, &reply) && reply.fds.size() <= kMaxFds &&
                     reply.payload.size() <= kMaxPayload;
  send_reply(connection, found ? kOk : kNotFound, reply);
  for (int fd : reply.fds) close(fd);
}

void IpcBroker::stop() {
  const int fd = listen_fd_.exchange(-1, std::memory_order_acq_rel);
  if (fd < 0) return;
  stopping_.store(true, std::memory_order_release);
  shutdown(fd, SHUT_RDWR);  // wakes the accept
  if (thread_.joinable()) thread_.join();
  close(fd);
  unlink(path_.c_str());
}

void IpcBroker::forget_in_child() {
  const int fd = listen_fd_.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0) close(fd);
  // The parent's thread does not exist here: its handle is dropped, never joined or detached.
  if (thread_.joinable()) new std::thread(std::move(thread_));
}

IpcBroker::Fetch IpcBroker::fetch(pid_t pid, std::uint64_t token, std::uint64_t id,
                                  Reply* out) const {
  sockaddr_un address{};
  if (!fill_address(socket_path(pid), &address)) return Fetch::no_broker;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Fetch::failed;
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return errno == ENOENT || errno == ECONNREFUSED ? Fetch::no_broker : Fetch::failed;
  }
  // The socket's owner must be the process asked for, of this user (its directory is this
  // user's alone; the check also catches a file left by an earlier process of that pid).
  ucred who{};
  if (!peer(fd, &who) || who.pid != pid || who.uid != geteuid()) return Fetch::refused;
  set_timeout(fd, kClientTimeoutS);
  const Request request{kMagic, kVersion, token, id};
  if (send(fd, &request, sizeof request, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof request)) {
    return Fetch::failed;
  }
  std::string body(sizeof(ReplyHeader) + kMaxPayload, '\0');
  iovec iov{body.data(), body.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(received);
    }
  }
  ReplyHeader header{};
  const bool whole =
      n >= static_cast<ssize_t>(sizeof header) && (message.msg_flags & MSG_CTRUNC) == 0;
  if (whole) std::memcpy(&header, body.data(), sizeof header);
  const bool ok = whole && header.magic == kMagic && header.status == kOk &&
                  header.fds == fds.size() &&
                  static_cast<std::size_t>(n) == sizeof header + header.payload;
  if (!ok) {
    for (int received : fds) close(received);
    if (whole && header.magic == kMagic && header.status == kRefused) return Fetch::refused;
    if (whole && header.magic == kMagic && header.status == kNotFound) return Fetch::not_found;
    return Fetch::failed;
  }
  out->fds = std::move(fds);
  out->payload.assign(body.data() + sizeof header, header.payload);
  return Fetch::ok;
}

}  // namespace poolshim
