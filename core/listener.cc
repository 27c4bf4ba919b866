#include "core/listener.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"

namespace rdmabuf {
namespace {

// Longest a connection may take to send its hello.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// At the limit, how long a new connection waits for one to turn idle.
constexpr auto kIdleWait = std::chrono::milliseconds(20);

// Raises the soft limit on open files to the hard limit and returns it.
// (A limit of 1024 is a relic of select(); rdmabuf uses poll and epoll.)
rlim_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur;
}

int connection_limit(int configured) {
  if (configured > 0) return configured;
  const rlim_t files = raise_open_file_limit();
  // An eighth of the descriptors stay for the rest of the process.
  const rlim_t usable = files == RLIM_INFINITY ? rlim_t{1} << 20 : files - files / 8;
  return static_cast<int>(std::clamp<rlim_t>(usable, 16, rlim_t{1} << 20));
}

}  // namespace

// A connection until its hello is read (never longer than kHelloTimeout);
// then the session the route gives it, which it hands every call on to.
class Listener::HelloSession final : public IoSession {
 public:
  HelloSession(Listener* listener, Fd fd)
      : listener_(listener), fd_(std::move(fd)), deadline_(Clock::now() + kHelloTimeout) {}

  int fd() const override { return served_ ? served_->fd() : fd_.get(); }

  Wait on_ready() override {
    if (served_) return served_->on_ready();
    while (received_ < kHelloBytes) {
      ssize_t n = ::recv(fd_.get(), hello_ + received_, kHelloBytes - received_, MSG_DONTWAIT);
      if (n > 0) {
        received_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Wait::kReadable;
      return Wait::kClose;
    }
    served_ = listener_->route_(fd_, parse_hello(hello_));
    return served_ ? served_->on_ready() : Wait::kClose;
  }

  Deadline deadline() const override { return served_ ? served_->deadline() : deadline_; }

  Wait on_timeout() override {
    if (served_) return served_->on_timeout();
    RDMABUF_LOG_DEBUG("dropping an inbound connection that sent no hello within 5 s");
    return Wait::kClose;
  }

  bool idle() const override { return served_ && served_->idle(); }
  bool on_evict() override { return served_ ? served_->on_evict() : true; }

 private:
  Listener* listener_;
  Fd fd_;
  const Deadline deadline_;
  uint8_t hello_[kHelloBytes] = {};
  size_t received_ = 0;
  std::unique_ptr<IoSession> served_;
};

Listener::Listener(Fd listen_fd, Fd stop_fd, int max_connections, std::unique_ptr<IoPool> pool,
                   RouteFn route)
    : listen_fd_(std::move(listen_fd)),
      stop_fd_(std::move(stop_fd)),
      max_connections_(connection_limit(max_connections)),
      pool_(std::move(pool)),
      route_(std::move(route)) {}

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
  pool_->stop();
}

bool Listener::make_room() {
  // A connection that has just answered its last request spins a while
  // (busy_poll) before it waits, idle, where it can be closed: give those a
  // moment.
  const Deadline until = Clock::now() + kIdleWait;
  while (!pool_->evict_idle()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
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
        // Out of descriptors: an idle connection makes room, else the
        // connection waits in the backlog a while.
        if (pool_->evict_idle()) continue;
        RDMABUF_LOG_WARN("listener: out of file descriptors and no connection is idle");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    {
      std::lock_guard lock(mu_);
      if (!accepting_) return;
    }
    if (connections() >= static_cast<size_t>(max_connections_) && !make_room()) {
      Status full = ResourceExhausted(
          "the owner serves " + std::to_string(max_connections_) +
          " connections, its limit (RDMABUF_MAX_CONNECTIONS, by default set by the open file "
          "limit), and none of them is idle");
      RDMABUF_LOG_WARN("listener: refusing a connection: " + full.message());
      // Best effort, never blocking: the reply fits any fresh socket buffer.
      send_hello_reply(fd.get(), 0, full, Clock::now()).ignore();
      continue;  // `fd` closes here
    }
    pool_->add(std::make_unique<HelloSession>(this, std::move(fd)));
  }
}

}  // namespace rdmabuf
