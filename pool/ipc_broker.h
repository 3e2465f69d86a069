// The IPC broker (issue 14, groundwork): hands the file descriptors behind an exported
// allocation to another process of the same user that holds the export's handle. Pooled memory
// cannot go through legacy CUDA IPC itself; its physical memory can travel as POSIX descriptors
// (cuMemExportToShareableHandle), which only a Unix-domain socket can carry (SCM_RIGHTS).
//
// What it opens and who can reach it: nothing until start() (the first export). Then one
// SOCK_SEQPACKET socket bound at <dir>/ipc-<pid> in a directory of the user's own
// (/tmp/poolshim-<uid> by default, made 0700 and refused unless it is a directory the user owns
// with no access for others), the socket file 0600. A connection is served only when the peer's
// uid (SO_PEERCRED) is the server's and its request carries the broker's token (64 random bits,
// which travel inside the export's handle) and an export id the lookup knows. The client checks
// that the socket's owner is the process and uid it asked for. Every descriptor is close-on-exec
// (SOCK_CLOEXEC, accept4, MSG_CMSG_CLOEXEC); a forked child closes the listening socket
// (forget_in_child) and stop() unlinks the socket file, so the socket does not outlive the
// process that made it (after a crash a stale file is left, which the next bind replaces).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace poolshim {

class IpcBroker {
 public:
  /// What one export sends: descriptors (sent, then closed by the broker) and opaque bytes.
  struct Reply {
    std::vector<int> fds;
    std::string payload;
  };
  /// Fills `out` for export `id`, or returns false (unknown id). Called on the broker's thread.
  using Lookup = std::function<bool(std::uint64_t id, Reply* out)>;

  enum class Fetch { ok, no_broker, refused, not_found, failed };

  /// `dir`: where sockets live (empty: /tmp/poolshim-<uid>).
  explicit IpcBroker(std::string dir = "");
  ~IpcBroker();
  IpcBroker(const IpcBroker&) = delete;
  IpcBroker& operator=(const IpcBroker&) = delete;

  /// Starts serving (once; later calls return the first one's result). False when the
  /// directory or the socket cannot be made safely; `why` says what.
  bool start(Lookup lookup, std::string* why = nullptr);
  bool running() const { return listen_fd_.load(std::memory_order_acquire) >= 0; }
  /// The listening socket's descriptor, -1 when not serving (tests).
  int listening_fd() const { return listen_fd_.load(std::memory_order_acquire); }
  /// The token a request must carry; 0 until start() succeeded.
  std::uint64_t token() const { return token_; }
  /// Stops serving: closes the socket, unlinks its file and joins the thread.
  void stop();
  /// In a forked child: the listening socket is the parent's; close it without touching the
  /// file or the thread (which the child does not have).
  void forget_in_child();

  /// Asks process `pid`'s broker (under this broker's directory) for export `id`. The
  /// descriptors in `out` are the caller's (close-on-exec).
  Fetch fetch(pid_t pid, std::uint64_t token, std::uint64_t id, Reply* out) const;

  /// The socket path of process `pid`'s broker.
  std::string socket_path(pid_t pid) const;
  const std::string& directory() const { return dir_; }

 private:
  void serve();
  void answer(int connection);

  std::string dir_;
  Lookup lookup_;
  std::uint64_t token_ = 0;
  std::atomic<int> listen_fd_{-1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::string path_;
  bool started_ = false;
  bool start_result_ = false;
};

}  // namespace poolshim
