#include "backends/tcp/server.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>

#include "common/atomic_word.h"
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
// The same for each range of a scattered read.
constexpr uint64_t kInlineRange = 512;
// Gathered replies are sent once this many bytes or pieces are waiting.
constexpr size_t kFlushAtBytes = 4 << 20;
constexpr size_t kMaxIov = 64;
// One sendmsg (or a write payload's recvmsg) takes up to this many pieces
// (a scattered request's ranges come in hundreds).
constexpr size_t kMaxSendIov = 256;
// Memory that connections give back while they wait (receive buffers,
// reply arenas), kept for the next connection with work (allocating again
// for every burst costs page faults, and growing an arena copies): up to
// kSpares of each kind; more are freed.
constexpr size_t kSpares = 32;

template <typename T>
class SpareList {
 public:
  // A spare, or an empty T when none waits.
  T take() {
    std::lock_guard lock(mu_);
    if (spares_.empty()) return T{};
    T spare = std::move(spares_.back());
    spares_.pop_back();
    return spare;
  }
  void give(T spare) {
    std::lock_guard lock(mu_);
    if (spares_.size() < kSpares) spares_.push_back(std::move(spare));
  }

 private:
  std::mutex mu_;
  std::vector<T> spares_;
};

// Never destroyed: connections may give back after static destructors ran.
SpareList<std::unique_ptr<uint8_t[]>>& spare_rx_buffers() {
  static auto* spares = new SpareList<std::unique_ptr<uint8_t[]>>;
  return *spares;
}
SpareList<std::vector<uint8_t>>& spare_tx_arenas() {
  static auto* spares = new SpareList<std::vector<uint8_t>>;
  return *spares;
}

std::unique_ptr<uint8_t[]> take_rx_buffer() {
  auto buffer = spare_rx_buffers().take();
  return buffer ? std::move(buffer) : std::unique_ptr<uint8_t[]>(new uint8_t[kRxBytes]);
}

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
    : fd_(std::move(fd)), settings_(settings) {
  tune_data_socket(fd_.get());
}

ServerConnection::~ServerConnection() {
  // Cut short, copies from the GPU may still run: they end before the pin
  // that keeps their memory goes.
  (void)staging_.wait_all();
  if (rx_) spare_rx_buffers().give(std::move(rx_));
}

void ServerConnection::abort_pinned_io() {
  ::shutdown(fd_.get(), SHUT_RDWR);
}

IoSession::Wait ServerConnection::on_ready() {
  BusyPoll poll(settings_.busy_poll);
  bool progressed = false;
  // Mid-frame waits are bounded: stall_timeout from the last progress (a
  // wake-up that moved nothing does not extend it).
  auto stall_deadline = [&] {
    if (progressed || deadline_ == Deadline::max()) {
      deadline_ = Clock::now() + settings_.stall_timeout;
    }
  };
  while (!settings_.stopping->load(std::memory_order_acquire)) {
    switch (advance()) {
      case Step::kProgress:
        progressed = true;
        poll.activity();
        continue;
      case Step::kClosed:
        return Wait::kClose;
      case Step::kBlockedWrite:
        // The reader is not taking its replies.
        stall_deadline();
        release_receive_buffer();
        return Wait::kWritable;
      case Step::kBlockedRead:
        // The next request (or the rest of this one) is usually
        // microseconds away: spin for busy_poll before giving the thread
        // up, unless other connections need it.
        if (IoPool::may_spin() && poll.spin()) continue;
        // Mid-request, the peer owes us bytes. Between requests the
        // connection may idle for ever.
        if (between_requests()) {
          deadline_ = Deadline::max();
          release_idle_memory();
        } else {
          stall_deadline();
        }
        release_receive_buffer();
        return Wait::kReadable;
    }
  }
  return Wait::kClose;
}

IoSession::Wait ServerConnection::on_timeout() {
  RDMABUF_LOG_WARN("tcp: dropping a connection whose peer stalled mid-frame for " +
                   std::to_string(settings_.stall_timeout.count()) + " ms");
  return Wait::kClose;
}

bool ServerConnection::idle() const {
  // A connection that has not served a request yet is not idle: its reader
  // is about to send one (else two readers could evict each other for ever).
  return served_any_ && between_requests() && out_.empty() && !flushing_ && !pin_.held();
}

bool ServerConnection::on_evict() {
  uint8_t byte;
  if (::recv(fd_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) return false;  // a request came
  // The goodbye must reach the reader whole, after every reply: only once
  // the replies have all been sent (some may await their acknowledgement),
  // and the goodbye went into the send buffer whole, is this connection
  // closed; else it stays.
  int unsent = 0;
  if (::ioctl(fd_.get(), SIOCOUTQNSD, &unsent) != 0 || unsent != 0) return false;
  ResponseHeader bye{};
  bye.kind = kGoodbye;
  const ssize_t sent = ::send(fd_.get(), &bye, sizeof bye, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent <= 0) return false;  // the reader has not taken its replies: nothing went
  // (Part of a goodbye, in a send buffer all but full, cannot be taken
  // back: the connection closes anyway, and its reader sees it cut.)
  // Nothing more is taken from this connection; the reader sends whatever
  // it had in flight again on a new one.
  ::shutdown(fd_.get(), SHUT_WR);
  return true;
}

void ServerConnection::release_receive_buffer() {
  if (rx_pos_ != rx_end_) return;  // part of a request waits there
  rx_pos_ = rx_end_ = 0;
  if (rx_) spare_rx_buffers().give(std::move(rx_));
}

void ServerConnection::release_idle_memory() {
  if (tx_.capacity() > 0) {
    tx_.clear();
    spare_tx_arenas().give(std::exchange(tx_, {}));
  }
  if (out_.capacity() > 8) std::vector<OutSegment>().swap(out_);
}

ServerConnection::Step ServerConnection::advance() {
  if (flushing_) {
    Step sent = send_some();
    if (sent == Step::kProgress) flushing_ = false;
    return sent;
  }
  if (payload_.left > 0) return receive_payload();
  if (rx_end_ - rx_pos_ >= sizeof(RequestHeader)) return take_request();
  return receive_requests();
}

ServerConnection::Step ServerConnection::take_request() {
  RequestHeader h;
  std::memcpy(&h, rx_.get() + rx_pos_, sizeof h);
  Status valid = check_request(h);
  if (!valid.ok()) {
    RDMABUF_LOG_WARN("tcp: dropping a connection whose peer broke the protocol: " +
                     valid.message());
    return Step::kClosed;
  }
  // Gathered payloads point into the pinned buffer, and copies to a GPU
  // buffer may still be running: finish both before the pin moves to
  // another buffer. (The request is taken again after the flush.)
  if ((has_external() || staged_writes_) && !pin_matches(h)) return start_flush();
  if (is_atomic(h.kind)) return take_atomic(h);
  if (is_scattered(h.kind)) return take_scattered(h);
  std::byte* at = nullptr;
  Status st = resolve(h, &at);
  extents_.clear();
  if (st.ok()) extents_.emplace_back(at, h.length);
  if (is_read(h.kind)) {
    rx_pos_ += sizeof h;
    return reply_to_read(h, st);
  }
  if (abandoned_since_receive()) return Step::kClosed;
  // Read payloads gathered so far may point at the bytes this write
  // changes: send them first, so that no read returns a later write's bytes.
  if (st.ok() && has_external()) return start_flush();
  rx_pos_ += sizeof h;
  return take_payload(h, st);
}

ServerConnection::Step ServerConnection::take_scattered(const RequestHeader& h) {
  const size_t list_bytes = static_cast<size_t>(h.offset) * sizeof(WireRange);
  // Taken once its list is whole: at most 64 KiB, which rx_ holds.
  if (rx_end_ - rx_pos_ < sizeof h + list_bytes) return receive_requests();
  const uint8_t* list = rx_.get() + rx_pos_ + sizeof h;
  Status valid = check_ranges(h, list);
  if (!valid.ok()) {
    RDMABUF_LOG_WARN("tcp: dropping a connection whose peer broke the protocol: " +
                     valid.message());
    return Step::kClosed;
  }
  const bool write = is_write(h.kind);
  if (write && abandoned_since_receive()) return Step::kClosed;
  // Every range against the buffer first: one out of bounds moves nothing.
  extents_.clear();
  Status st;
  for (uint64_t k = 0; k < h.offset && st.ok(); ++k) {
    const WireRange r = wire_range(list, k);
    RequestHeader range = h;
    range.offset = r.offset;
    range.length = r.length;
    std::byte* at = nullptr;
    st = resolve(range, &at);
    extents_.emplace_back(at, r.length);
  }
  if (!st.ok()) extents_.clear();
  if (write && st.ok() && has_external()) return start_flush();  // as for a plain write
  rx_pos_ += sizeof h + list_bytes;
  return write ? take_payload(h, st) : reply_to_read(h, st);
}

ServerConnection::Step ServerConnection::reply_to_read(const RequestHeader& h, const Status& st) {
  if (!st.ok()) {
    append_reply(h, st.code(), 0);
    return after_request();
  }
  append_reply(h, StatusCode::kOk, h.length);
  // A scattered read's small ranges are sent from the buffer too: copying
  // a thousand 4 KiB ranges into the arena costs more than their iovecs.
  const uint64_t inline_max = is_scattered(h.kind) ? kInlineRange : kInlineReply;
  for (const auto& [at, length] : extents_) {
    if (pin_.on_gpu()) {
      if (!append_from_gpu(at, length)) return Step::kClosed;
    } else if (length <= inline_max) {
      before_buffer_access(pin_.data());
      append_bytes(at, length);
      after_buffer_access(pin_.data());
    } else {
      append_external(at, length);
    }
  }
  return after_request();
}

ServerConnection::Step ServerConnection::take_payload(const RequestHeader& h, const Status& st) {
  // The payload follows in full whatever we answer; take it.
  const size_t buffered = static_cast<size_t>(std::min<uint64_t>(rx_end_ - rx_pos_, h.length));
  const uint8_t* have = rx_.get() + rx_pos_;
  if (st.ok() && pin_.on_gpu()) {
    size_t used = 0;
    for (const auto& [at, length] : extents_) {
      const size_t from_rx = static_cast<size_t>(std::min<uint64_t>(buffered - used, length));
      if (!receive_into_gpu(at, length, have + used, from_rx)) return Step::kClosed;
      used += from_rx;
    }
    rx_pos_ += buffered;
    append_reply(h, StatusCode::kOk, 0);
    return after_request();
  }
  payload_ = PendingPayload{h, st.code(), st.ok(), h.length, nullptr, 0, 0, true};
  if (payload_.keep) {
    before_buffer_access(pin_.data());
    land(have, buffered);
  }
  payload_.left -= buffered;
  rx_pos_ += buffered;
  if (payload_.left > 0) {
    // The reader may be waiting for earlier replies; do not make it wait
    // for this payload too.
    return out_.empty() ? Step::kProgress : start_flush();
  }
  if (payload_.keep) after_buffer_access(pin_.data());
  append_reply(h, st.code(), 0);
  payload_ = PendingPayload{};
  return after_request();
}

void ServerConnection::next_extent() {
  while (payload_.at_left == 0 && payload_.next_extent < extents_.size()) {
    payload_.at = extents_[payload_.next_extent].first;
    payload_.at_left = static_cast<size_t>(extents_[payload_.next_extent].second);
    ++payload_.next_extent;
  }
}

void ServerConnection::land(const uint8_t* from, size_t n) {
  while (n > 0) {
    next_extent();
    const size_t k = std::min(n, payload_.at_left);
    std::memcpy(payload_.at, from, k);
    payload_.at += k;
    payload_.at_left -= k;
    from += k;
    n -= k;
  }
}

ServerConnection::Step ServerConnection::take_atomic(const RequestHeader& h) {
  // Applied only once its operands are whole: one cut short changes nothing.
  if (rx_end_ - rx_pos_ < sizeof h + kAtomicOperandBytes) return receive_requests();
  uint64_t operands[2];
  std::memcpy(operands, rx_.get() + rx_pos_ + sizeof h, sizeof operands);
  const bool fetch_add = h.kind == static_cast<uint8_t>(RequestKind::kFetchAdd);
  if (fetch_add && operands[1] != 0) {
    RDMABUF_LOG_WARN(
        "tcp: dropping a connection whose peer broke the protocol: a fetch-add "
        "whose second operand is not 0");
    return Step::kClosed;
  }
  // A reader that gave up on this connection abandoned its atomics too.
  if (abandoned_since_receive()) return Step::kClosed;
  std::byte* at = nullptr;
  Status st = resolve(h, &at);
  if (st.ok() && pin_.on_gpu()) {
    st = InvalidArgument("atomics on GPU memory are not supported");
  } else if (st.ok() && !atomic_word_aligned(at)) {
    st = InvalidArgument("the word is not 8-byte aligned");
  }
  // Read payloads gathered so far may point at this word: send them first,
  // so that no read returns a later atomic's result.
  if (st.ok() && has_external()) return start_flush();
  rx_pos_ += sizeof h + kAtomicOperandBytes;
  if (!st.ok()) {
    append_reply(h, st.code(), 0);
    return after_request();
  }
  before_buffer_access(pin_.data());
  // On the wire: fetch-add (add, 0), compare-and-swap (expected, desired).
  const uint64_t previous =
      fetch_add ? apply_atomic(at, OpKind::kFetchAdd, operands[0], 0)
                : apply_atomic(at, OpKind::kCompareAndSwap, operands[1], operands[0]);
  after_buffer_access(pin_.data());
  append_reply(h, StatusCode::kOk, kAtomicWordBytes);
  append_bytes(&previous, sizeof previous);
  return after_request();
}

ServerConnection::Step ServerConnection::after_request() {
  if (out_bytes_ >= kFlushAtBytes || out_.size() >= kMaxIov) return start_flush();
  return Step::kProgress;
}

ServerConnection::Step ServerConnection::receive_payload() {
  // Every byte received before the payload is consumed (rx_pos_ == rx_end_),
  // so a refused write's bytes are discarded into rx_.
  // Asked once the replies before it are sent (a reader that gave up
  // while they went out has abandoned this write too).
  if (payload_.check_abandoned) {
    payload_.check_abandoned = false;
    if (abandoned()) return Step::kClosed;
  }
  const bool keep = payload_.keep;
  if (!keep && !rx_) rx_ = take_rx_buffer();
  // Straight into the buffer: the current extent and the ones after it (a
  // scattered write's ranges), or into rx_ to be discarded.
  iovec iov[kMaxSendIov];
  size_t count = 0;
  if (keep) {
    next_extent();
    iov[count++] = {payload_.at, payload_.at_left};
    for (size_t k = payload_.next_extent; k < extents_.size() && count < kMaxSendIov; ++k)
      iov[count++] = {extents_[k].first, static_cast<size_t>(extents_[k].second)};
  } else {
    iov[count++] = {rx_.get(), std::min(payload_.left, kRxBytes)};
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = count;
  ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
  if (n == 0) return Step::kClosed;
  if (n < 0) {
    if (errno == EINTR) return Step::kProgress;
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? Step::kBlockedRead : Step::kClosed;
  }
  const size_t got = static_cast<size_t>(n);
  payload_.left -= got;
  for (size_t moved = got; keep && moved > 0;) {  // past what landed
    next_extent();
    const size_t k = std::min(moved, payload_.at_left);
    payload_.at += k;
    payload_.at_left -= k;
    moved -= k;
  }
  if (payload_.left > 0) return Step::kProgress;
  if (keep) after_buffer_access(pin_.data());
  append_reply(payload_.header, payload_.code, 0);
  payload_ = PendingPayload{};
  return after_request();
}

ServerConnection::Step ServerConnection::receive_requests() {
  // Keep the partial request, if any, at the front.
  if (rx_pos_ > 0) {
    std::memmove(rx_.get(), rx_.get() + rx_pos_, rx_end_ - rx_pos_);
    rx_end_ -= rx_pos_;
    rx_pos_ = 0;
  }
  // Nothing half-received: reply now rather than after one more recv. And
  // never keep payloads of a pin we are about to drop.
  if (!out_.empty() && (rx_end_ == 0 || has_external() || staged_writes_)) return start_flush();
  drop_pin();
  if (!rx_) rx_ = take_rx_buffer();
  ssize_t n = ::recv(fd_.get(), rx_.get() + rx_end_, kRxBytes - rx_end_, MSG_DONTWAIT);
  if (n > 0) {
    rx_end_ += static_cast<size_t>(n);
    checked_abandoned_ = false;
    return Step::kProgress;
  }
  if (n == 0) return Step::kClosed;  // the peer closed the connection
  if (errno == EINTR) return Step::kProgress;
  if (errno != EAGAIN && errno != EWOULDBLOCK) return Step::kClosed;
  // Replies gathered while a request is half-received go before the wait.
  return out_.empty() ? Step::kBlockedRead : start_flush();
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
  if (tx_.capacity() == 0) tx_ = spare_tx_arenas().take();
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
  served_any_ = true;
  ResponseHeader r{};
  r.kind = static_cast<uint8_t>(h.kind | kResponseBit);
  r.status = static_cast<uint8_t>(code);
  r.request_id = h.request_id;
  r.payload = payload;
  append_bytes(&r, sizeof r);
}

bool ServerConnection::abandoned_since_receive() {
  if (checked_abandoned_) return false;
  checked_abandoned_ = true;
  return abandoned();
}

bool ServerConnection::abandoned() const {
  pollfd p{fd_.get(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
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
    if (staging_.room() < piece && !flush_blocking()) return false;  // empties the ring
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
    // reader may be waiting for them. The flush empties the ring too.
    if (staging_.room() < piece || (from_socket && !out_.empty())) {
      if (!flush_blocking()) return false;
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

ServerConnection::Step ServerConnection::send_some() {
  // A write's reply says its bytes have landed: those copied to the GPU
  // must be done before any reply goes.
  if (staged_writes_) {
    Status landed = staging_.wait_all();
    staged_writes_ = false;
    if (!landed.ok()) {
      RDMABUF_LOG_WARN("tcp: dropping a connection: " + landed.message());
      return Step::kClosed;
    }
  }
  // External pieces are read payloads in the pinned buffer (see take_request()).
  const bool from_buffer = has_external();
  if (from_buffer) sends_from_buffer_begin();
  Step result = Step::kProgress;
  while (send_segment_ < out_.size()) {
    iovec iov[kMaxSendIov];
    int count = 0;
    size_t arena_at = send_arena_at_;
    for (size_t i = send_segment_; i < out_.size() && count < static_cast<int>(kMaxSendIov); ++i) {
      const OutSegment& seg = out_[i];
      const size_t skip = i == send_segment_ ? send_offset_ : 0;
      if (seg.staged) {
        // Sent once its copy from the GPU is done; the next staged piece
        // copies meanwhile, so it ends this sendmsg.
        Status copied = staging_.wait_until(seg.external + seg.size);
        if (!copied.ok()) {
          RDMABUF_LOG_WARN("tcp: dropping a connection: " + copied.message());
          result = Step::kClosed;
          break;
        }
        iov[count++] = {const_cast<std::byte*>(seg.external) + skip, seg.size - skip};
        break;
      }
      if (seg.external) {
        iov[count++] = {const_cast<std::byte*>(seg.external) + skip, seg.size - skip};
      } else {
        iov[count++] = {tx_.data() + arena_at + skip, seg.size - skip};
        arena_at += seg.size;
      }
    }
    if (result == Step::kClosed) break;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      result = (errno == EAGAIN || errno == EWOULDBLOCK) ? Step::kBlockedWrite : Step::kClosed;
      break;
    }
    for (size_t sent = static_cast<size_t>(n); sent > 0;) {
      const OutSegment& seg = out_[send_segment_];
      const size_t left = seg.size - send_offset_;
      if (sent < left) {
        send_offset_ += sent;
        break;
      }
      sent -= left;
      if (!seg.external) send_arena_at_ += seg.size;
      ++send_segment_;
      send_offset_ = 0;
    }
  }
  if (from_buffer) sends_from_buffer_end();
  if (result == Step::kProgress) finish_flush();
  return result;
}

void ServerConnection::finish_flush() {
  tx_.clear();
  out_.clear();
  out_bytes_ = 0;
  externals_ = 0;
  send_segment_ = send_offset_ = send_arena_at_ = 0;
  staging_.reset();  // nothing staged is referred to any more
}

bool ServerConnection::flush_blocking() {
  while (true) {
    switch (send_some()) {
      case Step::kProgress:
        return true;
      case Step::kBlockedWrite:
        if (!wait(POLLOUT)) return false;
        continue;
      default:
        return false;
    }
  }
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

}  // namespace rdmabuf::tcp
