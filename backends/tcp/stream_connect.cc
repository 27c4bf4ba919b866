// How a tcp stream connects (backends/tcp/client.h) without blocking its
// loop: a name lookup on a thread of its own (for a host name), a
// non-blocking connect address by address, then the hello and its answer,
// each waited for in the loop's epoll set.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/tcp/client.h"
#include "common/hello.h"
#include "common/log.h"

namespace rdmabuf::tcp {
namespace {

// Longest a stream waits to connect, whatever the ops' deadlines.
constexpr auto kConnectCap = std::chrono::seconds(30);

}  // namespace

void Stream::begin_connect() {
  // Wait as long as the most patient op, within a cap.
  Deadline latest = Clock::now();
  for (const Chunk& c : pending_)
    latest = std::max(latest, c.transfer->deadline());
  connect_deadline_ = std::min(latest, Clock::now() + kConnectCap);
  if (!is_numeric_host(peer_->address.host)) {
    begin_lookup();
    return;
  }
  start_connecting(TcpConnecting::begin(peer_->address));
}

void Stream::start_connecting(Result<TcpConnecting> connecting) {
  if (!connecting.ok()) {
    fail_all(connecting.status().code(), connecting.status().message());
    return;
  }
  connecting_.emplace(std::move(connecting).value());
  link_ = Link::kConnecting;
}

Hello Stream::hello() const {
  return Hello{Channel::kTcpData, peer_->self_id, peer_->owner_id};
}

void Stream::begin_lookup() {
  uint64_t lookup;
  {
    std::lock_guard lock(mu_);
    looked_up_.reset();
    lookup = ++lookups_;
  }
  link_ = Link::kResolving;
  // The thread holds the stream; it kicks it unless the stream stopped (the
  // loop may be gone then) or gave up on this lookup.
  std::thread([self = shared_from_this(), lookup] {
    auto connecting = TcpConnecting::begin(self->peer_->address);
    std::lock_guard lock(self->mu_);
    if (self->lookups_ != lookup) return;
    self->looked_up_.emplace(std::move(connecting));
    self->inbox_.kick_unless_stopped(self->loop_, self.get());
  }).detach();
}

bool Stream::advance_lookup() {
  std::optional<Result<TcpConnecting>> looked_up;
  {
    std::lock_guard lock(mu_);
    looked_up.swap(looked_up_);
  }
  if (!looked_up) {
    if (Clock::now() < connect_deadline_) return false;
    fail_all(StatusCode::kDeadlineExceeded,
             "cannot connect to " + peer_->address.to_string() + ": the name lookup timed out");
    return true;
  }
  start_connecting(std::move(*looked_up));
  return true;
}

bool Stream::advance_connect() {
  // advance() may close this socket for the next address's: watch neither
  // until settle() watches whichever is current.
  loop_.unwatch(connecting_->fd());
  auto connected = connecting_->advance();
  if (!connected.ok()) {
    fail_all(connected.status().code(), connected.status().message());
    return true;
  }
  if (!connected->has_value()) {
    if (Clock::now() < connect_deadline_) return false;
    fail_all(StatusCode::kDeadlineExceeded, "cannot connect to " + peer_->address.to_string() +
                                                ": timed out waiting for the socket");
    return true;
  }
  sock_ = std::move(**connected);
  connecting_.reset();
  link_ = Link::kGreeting;
  rx_.reset(new uint8_t[kRxBytes]);
  rx_begin_ = rx_end_ = 0;
  // 24 bytes into the empty send buffer of a new connection go at once.
  const std::vector<uint8_t> bytes = encode_hello(hello());
  const ssize_t sent = ::send(sock_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent != static_cast<ssize_t>(bytes.size())) {
    fail_all(StatusCode::kUnavailable,
             "owner at " + peer_->address.to_string() + ": " +
                 (sent < 0 ? "send: " + errno_text(errno) : "the hello did not fit"));
  }
  return true;
}

bool Stream::advance_greeting() {
  auto owner = [&] { return "owner at " + peer_->address.to_string() + ": "; };
  // The reply's fixed part, then its message (as long as the fixed part says).
  const auto& fixed = *reinterpret_cast<const uint8_t(*)[kHelloReplyBytes]>(rx_.get());
  size_t want = kHelloReplyBytes;
  if (rx_end_ >= kHelloReplyBytes) {
    auto message = hello_reply_message_bytes(fixed);
    if (!message.ok()) {
      fail_all(message.status().code(), owner() + message.status().message());
      return true;
    }
    want += *message;
  }
  if (rx_end_ == want) {
    auto answer = check_hello_reply(
        fixed,
        std::string_view(reinterpret_cast<const char*>(rx_.get()) + kHelloReplyBytes,
                         want - kHelloReplyBytes),
        hello());
    if (!answer.ok()) {
      fail_all(answer.status().code(), owner() + answer.status().message());
      return true;
    }
    link_ = Link::kOpen;
    rx_begin_ = rx_end_ = 0;
    in_payload_ = false;
    last_io_ = Clock::now();
    RDMABUF_LOG_DEBUG("tcp stream " + std::to_string(index_) + " connected to " +
                      peer_->address.to_string());
    return true;
  }
  const ssize_t n = ::recv(sock_.get(), rx_.get() + rx_end_, want - rx_end_, MSG_DONTWAIT);
  if (n > 0) {
    rx_end_ += static_cast<size_t>(n);
    return true;
  }
  if (n == 0) {
    fail_all(StatusCode::kUnavailable, owner() + "connection closed by peer");
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    fail_all(StatusCode::kUnavailable, owner() + "recv: " + errno_text(errno));
  } else if (Clock::now() >= connect_deadline_) {
    fail_all(StatusCode::kDeadlineExceeded, owner() + "no answer to the hello in time");
  } else {
    return false;
  }
  return true;
}

}  // namespace rdmabuf::tcp
