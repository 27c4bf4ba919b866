// The manager's listener: accepts connections, reads each one's hello on
// the manager's I/O threads, and serves it there, as a session of the
// backend that claims its channel. At its limit it closes the idle
// connection that has waited longest to make room, and refuses a
// connection only when none is.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/hello.h"
#include "common/io_pool.h"
#include "common/socket.h"

namespace rdmabuf {

class Listener {
 public:
  // What serves a connection once its hello is read: called on an I/O
  // thread with the hello, or why it is not one. Takes the fd (releases
  // it) when it returns a session; returns none when it has answered the
  // connection with an error (it is then closed).
  using RouteFn = std::function<std::unique_ptr<IoSession>(Fd& fd, const Result<Hello>& hello)>;

  // `max_connections` 0: set by the open file limit (which this raises to
  // its hard limit). `pool` serves the connections.
  Listener(Fd listen_fd, Fd stop_fd, int max_connections, std::unique_ptr<IoPool> pool,
           RouteFn route);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void start();
  // Stops accepting and signals stop_fd(). Connections keep running.
  void stop_accepting();
  // Ends every connection: stops the I/O threads (sessions must see their
  // backend's stop first) and destroys the sessions.
  void join_connections();

  int stop_fd() const { return stop_fd_.get(); }
  int max_connections() const { return max_connections_; }

 private:
  class HelloSession;
  void accept_loop();
  // Connections served now.
  size_t connections() const { return pool_->size(); }
  // At the limit: closes an idle connection, waiting a little for one.
  bool make_room();

  Fd listen_fd_;
  Fd stop_fd_;
  const int max_connections_;
  std::unique_ptr<IoPool> pool_;
  RouteFn route_;
  std::thread acceptor_;
  std::mutex mu_;  // guards accepting_
  bool accepting_ = true;
};

}  // namespace rdmabuf
