// The IPC broker (pool/ipc_broker.h): descriptors and bytes of an export reach another process
// of the same user that holds the token, and nothing else does. Real processes (fork), real
// sockets, in a private directory of the test's own.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "ipc_broker.h"

using poolshim::IpcBroker;

namespace {

// A fresh directory for the sockets (the broker makes it 0700).
std::string socket_dir() {
  static int n = 0;
  return "/tmp/poolshim-unit-" + std::to_string(getpid()) + "-" + std::to_string(++n);
}

// A memfd holding `text` (-1 when it cannot be made). Called on the broker's thread: no Catch
// assertion here (Catch is not thread-safe); a missing memfd fails the reader's checks.
int memfd_with(const std::string& text) {
  const int fd = memfd_create("ipc-broker-test", MFD_CLOEXEC);
  if (fd >= 0 && write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string contents(int fd) {
  char buffer[64] = {};
  const ssize_t n = pread(fd, buffer, sizeof buffer, 0);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
}

// Export 7: two descriptors and a payload. Every other id is unknown.
bool lookup(std::uint64_t id, IpcBroker::Reply* out) {
  if (id != 7) return false;
  const int first = memfd_with("first");
  const int second = memfd_with("second");
  if (first < 0 || second < 0) return false;  // the child then finds no export
  out->fds = {first, second};
  out->payload = "export seven";
  return true;
}

// Runs `child` in a forked process; its return value is the exit status.
template <typename F>
int in_child(F&& child) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(child());
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

// Forks first, then starts `broker` in the parent and runs `child(token)` in the child once the
// broker has started: the child is then the copy of a process with one thread. (A fork while the
// broker's thread held the allocator's lock deadlocked the child at its first allocation: seen
// under ASan.) Returns the child's exit status.
template <typename F>
int in_child_of_started(IpcBroker& broker, F&& child) {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(ready[1]);
    std::uint64_t token = 0;
    const bool got = read(ready[0], &token, sizeof token) == sizeof token && token != 0;
    _exit(got ? child(token) : 9);
  }
  close(ready[0]);
  const bool started = broker.start(lookup);
  const std::uint64_t token = started ? broker.token() : 0;
  const bool sent = write(ready[1], &token, sizeof token) == sizeof token;
  close(ready[1]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(started);
  REQUIRE(sent);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("ipc broker: a child fetches an export's descriptors and payload with the token") {
  IpcBroker broker(socket_dir());
  const pid_t parent = getpid();
  const int status = in_child_of_started(broker, [&](std::uint64_t token) {
    IpcBroker client(broker.directory());
    IpcBroker::Reply reply;
    if (client.fetch(parent, token, 7, &reply) != IpcBroker::Fetch::ok) return 2;
    if (reply.fds.size() != 2 || reply.payload != "export seven") return 3;
    if (contents(reply.fds[0]) != "first" || contents(reply.fds[1]) != "second") return 4;
    for (int fd : reply.fds) {
      if ((fcntl(fd, F_GETFD) & FD_CLOEXEC) == 0) return 5;  // an exec'd child gets none
    }
    return 0;
  });
  CHECK(status == 0);
  struct stat st {};
  REQUIRE(stat(broker.socket_path(parent).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(stat(broker.directory().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  broker.stop();
  rmdir(broker.directory().c_str());
}

TEST_CASE("ipc broker: a wrong token is refused, an unknown export is not found, no broker") {
  IpcBroker broker(socket_dir());
  const pid_t parent = getpid();
  const int status = in_child_of_started(broker, [&](std::uint64_t token) {
    IpcBroker client(broker.directory());
    IpcBroker::Reply reply;
    if (client.fetch(parent, token + 1, 7, &reply) != IpcBroker::Fetch::refused) return 2;
    if (client.fetch(parent, token, 8, &reply) != IpcBroker::Fetch::not_found) return 3;
    if (!reply.fds.empty()) return 4;
    // This child has no broker: asking it (its own pid) finds none.
    if (client.fetch(getpid(), token, 7, &reply) != IpcBroker::Fetch::no_broker) return 5;
    return 0;
  });
  CHECK(status == 0);
  broker.stop();
  rmdir(broker.directory().c_str());
}

TEST_CASE(
    "ipc broker: a forked child holds no listening socket, and stop() removes the socket file") {
  IpcBroker broker(socket_dir());
  REQUIRE(broker.start(lookup));
  const int listening = broker.listening_fd();
  REQUIRE(listening >= 0);
  const int status = in_child([&] {
    broker.forget_in_child();  // what the shim's fork handler does
    if (broker.running()) return 2;
    return fcntl(listening, F_GETFD) == -1 && errno == EBADF ? 0 : 3;
  });
  CHECK(status == 0);
  const std::string path = broker.socket_path(getpid());
  broker.stop();
  struct stat st {};
  CHECK(stat(path.c_str(), &st) == -1);
  CHECK(!broker.running());
  // A client now finds no broker.
  IpcBroker::Reply reply;
  CHECK(IpcBroker(broker.directory()).fetch(getpid(), 1, 7, &reply) == IpcBroker::Fetch::no_broker);
  rmdir(broker.directory().c_str());
}

TEST_CASE("ipc broker: a socket directory others can reach is refused, and nothing is opened") {
  const std::string dir = socket_dir();
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  IpcBroker broker(dir);
  std::string why;
  CHECK(!broker.start(lookup, &why));
  CHECK(why == dir + " is not a directory of this user's alone (mode 0700)");
  CHECK(!broker.running());
  CHECK(broker.token() == 0);
  struct stat st {};
  CHECK(stat(broker.socket_path(getpid()).c_str(), &st) == -1);
  CHECK(!broker.start(lookup));  // the first answer stands
  rmdir(dir.c_str());
}
