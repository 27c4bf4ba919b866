#include "core/listener.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/hello.h"
#include "common/log.h"

namespace rdmabuf {

Listener::Listener(Fd listen_fd, Fd stop_fd, int max_connections, ServeFn serve)
    : listen_fd_(std::move(listen_fd)),
      stop_fd_(std::move(stop_fd)),
      max_connections_(max_connections),
      serve_(std::move(serve)) {}

Listener::~Listener() {
  stop_accepting();
  join_connections();
}

void Listener::start() {
  acceptor_ = std::thread([this] { accept_loop(); });
}

void Listener::stop_accepting() {
  {
    std::lock_guard lock(mu_);
    accepting_ = false;
  }
  signal_eventfd(stop_fd_.get());
  if (acceptor_.joinable()) acceptor_.join();
  listen_fd_.reset();
}

void Listener::join_connections() {
  std::list<Connection> all;
  {
    std::lock_guard lock(mu_);
    all.swap(connections_);
  }
  for (Connection& c : all) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void Listener::reap_finished() {
  std::list<Connection> done;
  {
    std::lock_guard lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->finished.load()) done.splice(done.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& c : done)
    c.thread.join();
}

void Listener::accept_loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (rc < 0 && errno != EINTR) {
      RDMABUF_LOG_ERROR("listener: poll failed: " + errno_text(errno));
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    Fd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE) {
        RDMABUF_LOG_WARN("listener: out of file descriptors; refusing a connection");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    reap_finished();
    std::lock_guard lock(mu_);
    if (!accepting_) return;
    if (static_cast<int>(connections_.size()) >= max_connections_) {
      Status full = ResourceExhausted("the owner has " + std::to_string(max_connections_) +
                                      " connections open (RDMABUF_MAX_CONNECTIONS)");
      RDMABUF_LOG_WARN("listener: refusing a connection: " + full.message());
      // Best effort, never blocking: the reply fits any fresh socket buffer.
      send_hello_reply(fd.get(), 0, full, Clock::now()).ignore();
      continue;  // `fd` closes here
    }
    Connection& c = connections_.emplace_back();
    c.thread = std::thread([this, &c, sock = std::move(fd)]() mutable {
      serve_(std::move(sock));
      c.finished.store(true);
    });
  }
}

}  // namespace rdmabuf
