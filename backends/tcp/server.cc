#include "backends/tcp/server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/futex.h"
#include "common/log.h"
#include "common/sanitizers.h"
#include "common/wire.h"

#ifdef RDMABUF_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace rdmabuf::tcp {
namespace {

constexpr size_t kRxBytes = 256 << 10;
// Read payloads up to this size are copied into the batched reply buffer;
// larger ones are sent straight from the registered memory.
constexpr uint64_t kInlineReply = 16 << 10;
// Gathered replies are sent once this many bytes or pieces are waiting.
constexpr size_t kFlushAtBytes = 4 << 20;
constexpr size_t kMaxIov = 64;
constexpr size_t kScratchBytes = 64 << 10;

// ThreadSanitizer's view of a registered buffer's bytes. Peers order their
// requests by what came back over the sockets, which it cannot see: a read
// copied out of the buffer by one connection, and a write the same peer made
// only after that read came back, taken into the same bytes by another
// connection, look concurrent to it. Every access to a pinned buffer here
// sits between these two, on the buffer's address as a synchronisation
// object, so that it sees the order the sockets give. No-ops elsewhere.
void before_buffer_access([[maybe_unused]] const std::byte* buffer) {
#ifdef RDMABUF_UNDER_TSAN
  __tsan_acquire(const_cast<std::byte*>(buffer));
#endif
}
void after_buffer_access([[maybe_unused]] const std::byte* buffer) {
#ifdef RDMABUF_UNDER_TSAN
  __tsan_release(const_cast<std::byte*>(buffer));
#endif
}
// Read payloads sent straight from a pinned buffer are the exception:
// ThreadSanitizer records sendmsg's reads once the call has returned, by
// when the peer may have had the bytes and written over them through
// another connection, so nothing placed after the call orders them (a
// release there still lost the race, 2 runs in 100). Those reads are kept
// out of its view instead.
void sends_from_buffer_begin() {
#ifdef RDMABUF_UNDER_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
}
void sends_from_buffer_end() {
#ifdef RDMABUF_UNDER_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

bool tokens_equal(const uint8_t* a, const Token& b) {
  uint8_t diff = 0;  // constant time: no early exit on the first differing byte
  for (size_t i = 0; i < b.size(); ++i)
    diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

ServerConnection::ServerConnection(Fd fd, const ServerSettings& settings)
    : fd_(std::move(fd)),
      settings_(settings),
      rx_(new uint8_t[kRxBytes]),
      scratch_(new uint8_t[kScratchBytes]) {
  tune_data_socket(fd_.get());
}

void ServerConnection::abort_pinned_io() {
  ::shutdown(fd_.get(), SHUT_RDWR);
}

void ServerConnection::run() {
  BusyPoll poll(settings_.busy_poll);
  while (!settings_.stopping->load(std::memory_order_acquire)) {
    ssize_t n = ::recv(fd_.get(), rx_.get() + rx_end_, kRxBytes - rx_end_, MSG_DONTWAIT);
    if (n > 0) {
      rx_end_ += static_cast<size_t>(n);
      if (!process()) return;
      poll.activity();
      continue;
    }
    if (n == 0) return;  // the peer closed the connection
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    if (!flush()) return;
    if (poll.spin()) continue;
    // Mid-request, the peer owes us bytes: that wait is bounded. Between
    // requests the connection may idle for ever.
    if (rx_end_ > 0) {
      if (!wait(POLLIN)) return;
      continue;
    }
    pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {settings_.stop_fd, POLLIN, 0}};
    ::poll(fds, settings_.stop_fd >= 0 ? 2 : 1, -1);
  }
}

bool ServerConnection::pin_matches(const RequestHeader& h) const {
  return pin_.held() && pin_id_ == h.buffer_id && tokens_equal(h.token, pin_token_);
}

Status ServerConnection::resolve(const RequestHeader& h, std::byte** at) {
  if (!pin_matches(h)) {
    pin_.reset();
    Token token;
    std::memcpy(token.data(), h.token, token.size());
    auto pinned = settings_.resolver->pin(h.buffer_id, token, this);
    if (!pinned.ok()) return pinned.status();
    pin_ = std::move(pinned).value();
    pin_id_ = h.buffer_id;
    pin_token_ = token;
  }
  if (h.region_size != pin_.size() || !range_fits(h.offset, h.length, pin_.size())) {
    return InvalidArgument("range out of bounds");
  }
  *at = pin_.data() + h.offset;
  return Status::Ok();
}

void ServerConnection::append_bytes(const void* data, size_t size) {
  size_t at = tx_.size();
  tx_.resize(at + size);
  std::memcpy(tx_.data() + at, data, size);
  if (!out_.empty() && out_.back().external == nullptr) {
    out_.back().size += size;
  } else {
    out_.push_back(OutSegment{nullptr, size});
  }
  out_bytes_ += size;
}

void ServerConnection::append_external(const std::byte* data, size_t size, bool staged) {
  out_.push_back(OutSegment{data, size, staged});
  out_bytes_ += size;
  ++externals_;
}

void ServerConnection::append_reply(const RequestHeader& h, StatusCode code, uint64_t payload) {
  ResponseHeader r{};
  r.kind = static_cast<uint8_t>(h.kind | kResponseBit);
  r.status = static_cast<uint8_t>(code);
  r.request_id = h.request_id;
  r.payload = payload;
  append_bytes(&r, sizeof r);
}

bool ServerConnection::abandoned() const {
  pollfd p{fd_.get(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool ServerConnection::process() {
  size_t pos = 0;
  // Asked once per batch of buffered requests (a syscall), and before each
  // payload that has yet to be received.
  bool checked_abandoned = false;
  while (rx_end_ - pos >= sizeof(RequestHeader)) {
    RequestHeader h;
    std::memcpy(&h, rx_.get() + pos, sizeof h);
    Status valid = check_request(h);
    if (!valid.ok()) {
      RDMABUF_LOG_WARN("tcp: dropping a connection whose peer broke the protocol: " +
                       valid.message());
      return false;
    }
    pos += sizeof h;
    // Gathered payloads point into the pinned buffer, and copies to a GPU
    // buffer may still be running: finish both before the pin moves to
    // another buffer.
    if ((has_external() || staged_writes_) && !pin_matches(h) && !flush()) return false;
    std::byte* at = nullptr;
    Status st = resolve(h, &at);
    if (h.kind == static_cast<uint8_t>(RequestKind::kRead)) {
      if (!st.ok()) {
        append_reply(h, st.code(), 0);
      } else {
        append_reply(h, StatusCode::kOk, h.length);
        if (pin_.on_gpu()) {
          if (!append_from_gpu(at, h.length)) return false;
        } else if (h.length <= kInlineReply) {
          before_buffer_access(pin_.data());
          append_bytes(at, h.length);
          after_buffer_access(pin_.data());
        } else {
          append_external(at, h.length);
        }
      }
    } else {
      if (!checked_abandoned) {
        checked_abandoned = true;
        if (abandoned()) return false;
      }
      // Read payloads gathered so far may point at the bytes this write
      // changes: send them first, so that no read returns a later write's
      // bytes.
      if (st.ok() && has_external() && !flush()) return false;
      // The payload follows in full whatever we answer; take it.
      size_t buffered = static_cast<size_t>(std::min<uint64_t>(rx_end_ - pos, h.length));
      if (st.ok() && pin_.on_gpu()) {
        if (!receive_into_gpu(at, h.length, rx_.get() + pos, buffered)) return false;
        pos += buffered;
        append_reply(h, StatusCode::kOk, 0);
        if ((out_bytes_ >= kFlushAtBytes || out_.size() >= kMaxIov) && !flush()) return false;
        continue;
      }
      if (st.ok()) {
        before_buffer_access(pin_.data());
        std::memcpy(at, rx_.get() + pos, buffered);
      }
      pos += buffered;
      size_t rest = h.length - buffered;
      if (rest > 0) {
        // The reader may be waiting for earlier replies; do not make it wait
        // for this payload too.
        if (!flush() || abandoned()) return false;
        bool ok = st.ok() ? recv_blocking(at + buffered, rest) : discard_blocking(rest);
        if (!ok) return false;
      }
      if (st.ok()) after_buffer_access(pin_.data());
      append_reply(h, st.code(), 0);
    }
    if ((out_bytes_ >= kFlushAtBytes || out_.size() >= kMaxIov) && !flush()) return false;
  }
  // Keep the partial request, if any, at the front.
  std::memmove(rx_.get(), rx_.get() + pos, rx_end_ - pos);
  rx_end_ -= pos;
  // Nothing half-received: reply now rather than after one more recv. And
  // never keep payloads of a pin we are about to drop.
  bool ok = (rx_end_ == 0 || has_external() || staged_writes_) ? flush() : true;
  drop_pin();
  return ok;
}

bool ServerConnection::wait(short events) {
  Status st = wait_fd(fd_.get(), events, Clock::now() + settings_.stall_timeout, settings_.stop_fd);
  if (st.code() == StatusCode::kDeadlineExceeded) {
    RDMABUF_LOG_WARN("tcp: dropping a connection whose peer stalled mid-frame for " +
                     std::to_string(settings_.stall_timeout.count()) + " ms");
  }
  return st.ok();
}

bool ServerConnection::append_from_gpu(const std::byte* at, uint64_t length) {
  const size_t piece_max = staging_.capacity() / 2;
  for (uint64_t done = 0; done < length;) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(length - done, piece_max));
    if (staging_.room() < piece && !flush()) return false;  // flush() empties the ring
    before_buffer_access(pin_.data());
    auto staged = staging_.stage_from_gpu(at + done, piece, pin_.device());
    after_buffer_access(pin_.data());
    if (!staged.ok()) {
      RDMABUF_LOG_WARN("tcp: dropping a connection: " + staged.status().message());
      return false;
    }
    append_external(*staged, piece, true);
    done += piece;
  }
  return true;
}

bool ServerConnection::receive_into_gpu(std::byte* at, uint64_t length, const uint8_t* have,
                                        size_t buffered) {
  // The copy of each piece to the GPU runs while the next is received.
  const size_t piece_max = staging_.capacity() / 2;
  for (uint64_t done = 0; done < length;) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(length - done, piece_max));
    const bool from_socket = done + piece > buffered;
    // Before blocking on the socket, send the replies gathered so far: the
    // reader may be waiting for them. flush() empties the ring too.
    if (staging_.room() < piece || (from_socket && !out_.empty())) {
      if (!flush()) return false;
    }
    if (from_socket && abandoned()) return false;
    auto staged = staging_.take(piece);
    if (!staged.ok()) return false;
    const size_t from_rx =
        done < buffered ? std::min<size_t>(piece, buffered - static_cast<size_t>(done)) : 0;
    if (from_rx > 0) std::memcpy(*staged, have + done, from_rx);
    if (from_rx < piece && !recv_blocking(*staged + from_rx, piece - from_rx)) return false;
    before_buffer_access(pin_.data());
    Status copied = staging_.to_gpu(at + done, *staged, piece, pin_.device());
    after_buffer_access(pin_.data());
    if (!copied.ok()) {
      RDMABUF_LOG_WARN("tcp: dropping a connection: " + copied.message());
      return false;
    }
    staged_writes_ = true;
    done += piece;
  }
  return true;
}

bool ServerConnection::flush() {
  // A write's reply says its bytes have landed: those copied to the GPU
  // must be done before any reply goes.
  if (staged_writes_) {
    Status landed = staging_.wait_all();
    staged_writes_ = false;
    if (!landed.ok()) {
      RDMABUF_LOG_WARN("tcp: dropping a connection: " + landed.message());
      return false;
    }
  }
  // External pieces are read payloads in the pinned buffer (see process()).
  const bool from_buffer = has_external();
  if (from_buffer) sends_from_buffer_begin();
  bool ok = true;
  size_t arena_at = 0;
  size_t next = 0;
  while (ok && next < out_.size()) {
    iovec iov[kMaxIov];
    int count = 0;
    for (; next < out_.size() && count < static_cast<int>(kMaxIov); ++next) {
      const OutSegment& seg = out_[next];
      if (seg.staged) {
        // Sent once its copy from the GPU is done; the next staged piece
        // copies meanwhile, so it ends this sendmsg.
        Status copied = staging_.wait_until(seg.external + seg.size);
        if (!copied.ok()) {
          RDMABUF_LOG_WARN("tcp: dropping a connection: " + copied.message());
          ok = false;
          break;
        }
        iov[count++] = {const_cast<std::byte*>(seg.external), seg.size};
        ++next;
        break;
      }
      if (seg.external) {
        iov[count++] = {const_cast<std::byte*>(seg.external), seg.size};
      } else {
        iov[count++] = {tx_.data() + arena_at, seg.size};
        arena_at += seg.size;
      }
    }
    if (ok) ok = send_blocking(iov, count);
  }
  if (from_buffer) sends_from_buffer_end();
  tx_.clear();
  out_.clear();
  out_bytes_ = 0;
  externals_ = 0;
  // Cut short, later pieces' copies from the GPU may still run: they end
  // before the pin that keeps their memory can go.
  if (!ok) (void)staging_.wait_all();
  staging_.reset();  // nothing staged is referred to any more
  return ok;
}

bool ServerConnection::send_blocking(iovec* iov, int count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      if (!wait(POLLOUT)) return false;
      continue;
    }
    size_t sent = static_cast<size_t>(n);
    while (count > 0 && sent >= iov->iov_len) {
      sent -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + sent;
      iov->iov_len -= sent;
    }
  }
  return true;
}

bool ServerConnection::recv_blocking(void* dst, size_t size) {
  auto* p = static_cast<uint8_t*>(dst);
  BusyPoll poll(settings_.busy_poll);
  while (size > 0) {
    ssize_t n = ::recv(fd_.get(), p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      poll.activity();
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    // Shutdown reaches wait() through stop_fd; a peer that trickles its
    // bytes would keep the spin from ever getting there.
    if (settings_.stopping->load(std::memory_order_acquire)) return false;
    if (poll.spin()) continue;
    if (!wait(POLLIN)) return false;
  }
  return true;
}

bool ServerConnection::discard_blocking(size_t size) {
  while (size > 0) {
    size_t n = std::min(size, kScratchBytes);
    if (!recv_blocking(scratch_.get(), n)) return false;
    size -= n;
  }
  return true;
}

}  // namespace rdmabuf::tcp
