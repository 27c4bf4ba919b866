// The manager's listener: accepts connections and runs each on a thread of
// its own, up to a limit.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "common/socket.h"

namespace rdmabuf {

class Listener {
 public:
  // `serve` runs on the connection's own thread and owns the fd; it must
  // return promptly once stop_fd() turns readable.
  using ServeFn = std::function<void(Fd)>;

  Listener(Fd listen_fd, Fd stop_fd, int max_connections, ServeFn serve);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void start();
  // Stops accepting and signals stop_fd(). Connections keep running.
  void stop_accepting();
  // Joins every connection thread (after whatever makes `serve` return).
  void join_connections();

  int stop_fd() const { return stop_fd_.get(); }

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  void accept_loop();
  void reap_finished();

  Fd listen_fd_;
  Fd stop_fd_;
  const int max_connections_;
  ServeFn serve_;
  std::thread acceptor_;
  std::mutex mu_;
  std::list<Connection> connections_;
  bool accepting_ = true;
};

}  // namespace rdmabuf
