// EndpointListener (rdmabuf/endpoint.h), and the two ways an endpoint
// begins: listen_for_endpoints() and connect_endpoint(), which
// Manager::listen and Manager::connect call. accept() runs every accepted
// connection's handshake (handshake.h) side by side, one step per frame.
#include "core/endpoint/listener.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <iterator>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/socket.h"
#include "core/endpoint/endpoint_impl.h"
#include "core/endpoint/handshake.h"

namespace rdmabuf {

using endpoint::AcceptingHandshake;

namespace endpoint {

Result<std::unique_ptr<EndpointListener::State>> listen_for_endpoints(EndpointHost& host,
                                                                      const std::string& address) {
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(address));
  RDMABUF_ASSIGN_OR_RETURN(Fd fd, listen_tcp(where, 64));
  RDMABUF_ASSIGN_OR_RETURN(HostPort bound, local_address(fd.get()));
  RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
  return std::make_unique<EndpointListener::State>(host, std::move(fd), std::move(bound),
                                                   std::move(stop));
}

Result<std::shared_ptr<EndpointImpl>> connect_endpoint(EndpointHost& host,
                                                       const std::string& address,
                                                       std::chrono::milliseconds timeout) {
  const Deadline deadline = Clock::now() + timeout;
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(address));
  RDMABUF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(where, deadline));
  const Hello mine = my_hello(host);
  RDMABUF_RETURN_IF_ERROR(send_hello(fd.get(), mine, deadline));
  RDMABUF_ASSIGN_OR_RETURN(Hello theirs, read_hello(fd.get(), deadline));
  RDMABUF_ASSIGN_OR_RETURN(ChannelChoice channel, offer_channels(fd.get(), host, deadline));
  return EndpointImpl::create(host, std::move(fd), std::move(channel), where.to_string(), mine,
                              theirs);
}

}  // namespace endpoint

EndpointListener::EndpointListener(std::unique_ptr<State> state) : state_(std::move(state)) {}
EndpointListener::~EndpointListener() = default;

void EndpointListener::close() {
  if (state_->closed.exchange(true)) return;
  // The socket stops listening (connects are refused from now on) but stays
  // open until destruction, so a concurrent accept never polls a reused fd.
  ::shutdown(state_->fd.get(), SHUT_RDWR);
  signal_eventfd(state_->stop.get());
  std::lock_guard lock(state_->mu);
  state_->unfinished.clear();  // their peers see the end now
}

std::string EndpointListener::address() const {
  return state_->address.to_string();
}

namespace {

// accept(2) reports some errors of the one connection it took (Linux passes
// pending network errors on, and a firewall may refuse it): that connection
// is gone, the listener is fine.
bool accept_error_is_the_connections(int error) {
  switch (error) {
    case EAGAIN:
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case EPERM:
    case ENETDOWN:
    case ENETUNREACH:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENONET:
    case EOPNOTSUPP:
      return true;
    default:
      return false;
  }
}

// Handshakes one accept carries on at once, at most; more connections wait
// in the listening socket's backlog meanwhile.
constexpr size_t kMostHandshakes = 64;

// That connection, not the listener, failed (it vanished, spoke something
// else, or did not finish within kHandshakeLimit): dropped, with a warning.
void drop_connection(const HostPort& listening, const std::string& peer, const Status& why) {
  const std::string reason = why.code() == StatusCode::kDeadlineExceeded
                                 ? "it did not complete the handshake within " +
                                       std::to_string(endpoint::kHandshakeLimit.count()) + " s"
                                 : "its handshake failed: " + why.to_string();
  RDMABUF_LOG_WARN("endpoint listener " + listening.to_string() + ": dropped a connection from " +
                   (peer.empty() ? std::string("a peer already gone") : peer) + "; " + reason);
}

}  // namespace

Result<std::unique_ptr<Endpoint>> EndpointListener::accept(std::chrono::milliseconds timeout) {
  const Deadline deadline = Clock::now() + timeout;
  const Status closed = Cancelled("the listener was closed");
  const int stop = state_->stop.get();
  // The handshakes under way, this call's alone while it runs (no other
  // accept reads them meanwhile); those left go back when it returns, or
  // are dropped once the listener is closed.
  std::vector<AcceptingHandshake> mine;
  {
    std::lock_guard lock(state_->mu);
    std::move(state_->unfinished.begin(), state_->unfinished.end(), std::back_inserter(mine));
    state_->unfinished.clear();
  }
  struct GiveBack {
    State& state;
    std::vector<AcceptingHandshake>& handshakes;
    ~GiveBack() {
      std::lock_guard lock(state.mu);
      if (state.closed.load()) return;  // dropped with `handshakes`
      std::move(handshakes.begin(), handshakes.end(), std::back_inserter(state.unfinished));
    }
  } give_back{*state_, mine};

  std::vector<pollfd> watched;
  while (true) {
    if (state_->closed.load()) return closed;
    // One poll for the stop signal, new connections (while fewer than
    // kMostHandshakes are under way) and the next frame of each handshake,
    // until accept's deadline or the first handshake's wake-up.
    const Deadline before = Clock::now();
    Deadline wake = deadline;
    watched.assign({{stop, POLLIN, 0}, {state_->fd.get(), POLLIN, 0}});
    if (mine.size() >= kMostHandshakes) watched[1].fd = -1;  // poll skips it
    for (const AcceptingHandshake& h : mine) {
      watched.push_back({h.fd(), POLLIN, 0});
      wake = std::min(wake, h.wake_at(before));
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now());
    const int n = ::poll(watched.data(), watched.size(),
                         static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30)));
    if (n < 0 && errno != EINTR) return Internal("poll: " + errno_text(errno));
    if (n > 0 && watched[0].revents != 0) return closed;
    // Each handshake's next step, when its first byte came or its time did:
    // a frame begun is read whole within the handshake's limit (it comes
    // quickly, or the peer misbehaves).
    const Deadline now = Clock::now();
    for (size_t i = mine.size(); i-- > 0;) {
      AcceptingHandshake& h = mine[i];
      const bool readable = n > 0 && watched[2 + i].revents != 0;
      const Status step = h.advance(readable, now);
      if (step.ok() && h.state() != AcceptingHandshake::State::kSettled) continue;
      AcceptingHandshake done = std::move(h);
      mine.erase(mine.begin() + static_cast<ptrdiff_t>(i));
      if (step.code() == StatusCode::kCancelled) return closed;
      if (!step.ok()) {
        drop_connection(state_->address, done.peer(), step);
        continue;
      }
      const std::string peer = done.peer().empty() ? "?" : done.peer();
      const endpoint::Hello hello = done.mine();
      const endpoint::Hello theirs = done.theirs();
      RDMABUF_ASSIGN_OR_RETURN(
          auto impl, EndpointImpl::create(state_->host, done.take_fd(), done.take_channel(), peer,
                                          hello, theirs));
      return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
    }
    if (n > 0 && watched[1].fd >= 0 && watched[1].revents != 0) {
      Fd fd(::accept4(state_->fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (state_->closed.load()) return closed;
      if (fd.valid()) {
        // Now, while the peer is surely there to name in a warning.
        const auto address = peer_address(fd.get());
        const std::string peer = address.ok() ? address->to_string() : std::string();
        tune_data_socket(fd.get());  // no Nagle: frames are small and each is awaited
        auto started = AcceptingHandshake::start(std::move(fd), peer, state_->host, stop);
        if (started.ok()) {
          mine.push_back(std::move(started).value());
        } else if (started.status().code() == StatusCode::kCancelled) {
          return closed;
        } else {
          drop_connection(state_->address, peer, started.status());
        }
      } else if (errno == EMFILE || errno == ENFILE) {
        // The connection stays queued; this process may have fds again soon.
        RDMABUF_LOG_WARN("endpoint listener " + state_->address.to_string() +
                         ": out of file descriptors; a connection waits");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } else if (!accept_error_is_the_connections(errno)) {
        return Unavailable("accept: " + errno_text(errno));
      }
    }
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("no peer completed the endpoint handshake in time");
    }
  }
}

}  // namespace rdmabuf
