#include "backends/tcp/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/op_extents.h"
#include "common/op_text.h"
#include "common/strings.h"

namespace rdmabuf::tcp {
namespace {

// Encoding stops while this many arena bytes are waiting to be sent.
constexpr size_t kTxHighWater = 256 << 10;
// The arena's sent prefix is dropped once it is this large.
constexpr size_t kTxCompactAt = 1 << 20;
// Write payloads up to this size are copied next to their header (one
// syscall for many small writes); larger ones are sent from local memory.
constexpr uint64_t kInlineWrite = 16 << 10;
// Read payloads with at least this much left are received straight into
// local memory; smaller remainders go through the rx buffer.
constexpr uint64_t kDirectRecvMin = 16 << 10;
// A sendmsg (recvmsg) gathers (scatters) up to this many pieces: a
// scattered write's (read's) ranges come in hundreds.
constexpr size_t kMaxSendIov = 256;
constexpr size_t kMaxRecvIov = 256;
constexpr size_t kMaxSegments = 1024;
// An open connection with nothing in flight for this long lets go of its
// buffers (until its next work): idle connections cost little.
constexpr auto kIdleBufferRelease = std::chrono::seconds(1);
// Passes a stream makes per run of its loop while work keeps moving, before
// it lets the loop's other streams run.
constexpr int kRoundsPerRun = 16;
// Load counted per request on top of its bytes, so that many tiny ops spread.
constexpr uint64_t kRequestCost = 256;
// Batches to one peer smaller than this stay on one stream: splitting them
// costs more in wake-ups than it gains in parallelism.
constexpr uint64_t kSpreadBytes = 256 << 10;

alignas(64) const uint8_t kZeros[64 << 10] = {};

RequestKind request_kind(const Op& op) {
  switch (op.kind) {
    case OpKind::kReadIntoLocal:
      return op.ranges ? RequestKind::kReadRanges : RequestKind::kRead;
    case OpKind::kWriteFromLocal:
      return op.ranges ? RequestKind::kWriteRanges : RequestKind::kWrite;
    case OpKind::kFetchAdd:
      return RequestKind::kFetchAdd;
    case OpKind::kCompareAndSwap:
      return RequestKind::kCompareAndSwap;
  }
  return RequestKind::kRead;
}

// Cuts `op`'s bytes into the pieces that requests carry: at most
// `chunk_size` bytes each and, for a scattered op, kMaxRequestRanges ranges
// (a range cut between two counts in both). Calls fn(begin, length).
template <class Fn>
void cut_into_chunks(const Op& op, uint64_t chunk_size, Fn&& fn) {
  const uint64_t bytes = op.bytes();
  if (!op.ranges) {
    for (uint64_t begin = 0; begin < bytes; begin += chunk_size)
      fn(begin, std::min(chunk_size, bytes - begin));
    return;
  }
  uint64_t begin = 0, length = 0, ranges = 0;
  for (const OpRange& r : op.ranges->ranges()) {
    for (uint64_t left = r.length; left > 0;) {
      if (ranges == kMaxRequestRanges || length == chunk_size) {
        fn(begin, length);
        begin += length;
        length = ranges = 0;
      }
      const uint64_t take = std::min(left, chunk_size - length);
      length += take;
      left -= take;
      ++ranges;
    }
  }
  fn(begin, length);
}

std::string owner_refused(uint8_t code, RequestKind kind) {
  switch (static_cast<StatusCode>(code)) {
    case StatusCode::kNotFound:
      return "the owner does not have this buffer (released, or never registered)";
    case StatusCode::kPermissionDenied:
      return "the owner refused the handle's token";
    case StatusCode::kInvalidArgument:
      return is_atomic(static_cast<uint8_t>(kind))
                 ? "the owner refused the atomic (the word out of bounds, not 8-byte aligned in "
                   "its memory, or in GPU memory)"
                 : "the owner found the range out of bounds";
    default:
      return "the owner failed to serve the request";
  }
}

}  // namespace

Stream::Stream(std::shared_ptr<const PeerContext> peer, int index, EventLoop& loop)
    : peer_(std::move(peer)), index_(index), loop_(loop) {}

void Stream::enqueue(std::vector<Chunk>& chunks, uint64_t cost) {
  load_.fetch_add(cost, std::memory_order_relaxed);
  if (inbox_.push(chunks, loop_, this)) return;
  for (Chunk& c : chunks)
    finish(c, Cancelled("the manager is shutting down"));
  chunks.clear();
}

void Stream::stop() {
  for (Chunk& c : inbox_.stop(loop_, this))
    finish(c, Cancelled("the manager is shutting down"));
}

bool Stream::idle() {
  return inbox_.idle();
}

bool Stream::take_incoming() {
  return inbox_.take(pending_);
}

void Stream::on_run(EventLoop& loop) {
  for (int round = 0;; ++round) {
    if (take_incoming() || peer_->stopping->load(std::memory_order_acquire)) {
      fail_all(StatusCode::kCancelled, "the manager is shutting down");
      break;
    }
    if (!step()) break;
    if (round + 1 == kRoundsPerRun) {  // let the loop's other streams run
      loop.kick(shared_from_this());
      break;
    }
  }
  if (link_ == Link::kOpen && (!inflight_.empty() || !segs_.empty()) &&
      Clock::now() - last_io_ >= peer_->stall_timeout) {
    broken("owner at " + peer_->address.to_string() + " stopped responding for " +
           std::to_string(peer_->stall_timeout.count()) + " ms");
  }
  settle();
}

bool Stream::step() {
  switch (link_) {
    case Link::kClosed:
      if (pending_.empty()) return false;
      begin_connect();
      return true;
    case Link::kResolving:
      return advance_lookup();
    case Link::kConnecting:
      return advance_connect();
    case Link::kGreeting:
      return advance_greeting();
    case Link::kOpen: {
      if (!rx_) rx_.reset(new uint8_t[kRxBytes]);  // let go of while idle
      bool progressed = pump_send();
      if (sock_.valid()) progressed |= pump_recv();
      return progressed;
    }
  }
  return false;
}

void Stream::settle() {
  int fd = -1;
  uint32_t events = 0;
  Deadline at = Deadline::max();
  switch (link_) {
    case Link::kClosed:
      break;
    case Link::kResolving:
      at = connect_deadline_;
      break;
    case Link::kConnecting:
      fd = connecting_->fd();
      events = EPOLLOUT;
      at = connect_deadline_;
      break;
    case Link::kGreeting:
      fd = sock_.get();
      events = EPOLLIN | EPOLLRDHUP;
      at = connect_deadline_;
      break;
    case Link::kOpen:
      // Readable always: an idle connection notices the owner closing it.
      fd = sock_.get();
      events = EPOLLIN | EPOLLRDHUP | (segs_.empty() ? 0u : uint32_t{EPOLLOUT});
      if (!inflight_.empty() || !segs_.empty()) {
        at = last_io_ + peer_->stall_timeout;
      } else if (rx_ && rx_begin_ == rx_end_ && pending_.empty()) {
        // Idle: the receive buffer goes once it has been idle a while.
        if (Clock::now() - last_io_ >= kIdleBufferRelease) {
          rx_.reset();
          std::vector<uint8_t>().swap(tx_);  // its capacity too
        } else {
          at = last_io_ + kIdleBufferRelease;
        }
      }
      break;
  }
  auto self = shared_from_this();
  if (fd >= 0) {
    Status watched = loop_.watch(self, fd, events);
    if (!watched.ok()) {
      fail_all(watched.code(), "connection to " + peer_->address.to_string() +
                                   " cannot be watched: " + watched.message());
      at = Deadline::max();
    }
  }
  loop_.wake_at(self, at);
  inbox_.set_busy(link_ != Link::kClosed || !pending_.empty());
}

void Stream::finish(Chunk& chunk, const Status& status) {
  load_.fetch_sub(chunk.cost, std::memory_order_relaxed);
  chunk.transfer->complete_part(chunk.op, status);
  chunk.transfer.reset();
}

void Stream::close_connection() {
  segs_.clear();
  tx_.clear();
  tx_head_ = 0;
  rx_.reset();
  rx_begin_ = rx_end_ = 0;
  in_payload_ = false;
  // No longer watched before the descriptor closes: its number may come
  // back for another socket.
  if (connecting_) loop_.unwatch(connecting_->fd());
  if (sock_.valid()) loop_.unwatch(sock_.get());
  connecting_.reset();
  sock_.reset();
  if (link_ == Link::kResolving) {
    std::lock_guard lock(mu_);
    ++lookups_;  // whatever the lookup under way finds is not wanted
    looked_up_.reset();
  }
  link_ = Link::kClosed;
}

void Stream::fail_all(StatusCode code, const std::string& why) {
  if (sock_.valid()) {
    RDMABUF_LOG_INFO("tcp stream " + std::to_string(index_) + " to " + peer_->address.to_string() +
                     " closed: " + why);
  }
  close_connection();
  // Segments are gone, so nothing refers to the chunks' memory any more.
  for (auto* queue : {&inflight_, &pending_}) {
    for (Chunk& c : *queue) {
      if (c.transfer->cancelled()) {
        finish(c, Status(code, why));  // ignored by the transfer; no message to build
      } else {
        finish(c, Status(code, describe_op(c.transfer->op(c.op)) + ": " + why));
      }
    }
    queue->clear();
  }
}

void Stream::start_over() {
  RDMABUF_LOG_DEBUG("tcp stream " + std::to_string(index_) + " to " + peer_->address.to_string() +
                    " closed by the owner to make room; " + std::to_string(inflight_.size()) +
                    " requests go again on a new connection");
  close_connection();
  // The owner applied none of them (protocol.h): they go again, first, in order.
  for (auto it = inflight_.rbegin(); it != inflight_.rend(); ++it) {
    it->request_id = 0;
    it->moved = 0;
    it->payload_unsent = false;
    pending_.push_front(std::move(*it));
  }
  inflight_.clear();
}

// --- sending ------------------------------------------------------------------

void Stream::encode() {
  if (tx_head_ >= kTxCompactAt) {
    tx_.erase(tx_.begin(), tx_.begin() + static_cast<ptrdiff_t>(tx_head_));
    tx_head_ = 0;
  }
  auto append_arena = [this](size_t bytes) {
    if (!segs_.empty() && segs_.back().external == nullptr) {
      segs_.back().size += bytes;
    } else {
      segs_.push_back(TxSegment{nullptr, nullptr, bytes, 0});
    }
  };
  while (!pending_.empty() && tx_.size() - tx_head_ < kTxHighWater && segs_.size() < kMaxSegments) {
    Chunk& c = pending_.front();
    if (c.transfer->cancelled()) {  // never sent: nothing to drain
      finish(c, Cancelled("cancelled before it was sent"));
      pending_.pop_front();
      continue;
    }
    const Op& op = c.transfer->op(c.op);
    RequestHeader h{};
    h.kind = static_cast<uint8_t>(c.kind);
    h.request_id = next_request_id_;
    h.buffer_id = op.remote.id();
    std::memcpy(h.token, op.remote.token().data(), sizeof h.token);
    h.region_size = op.remote.region_size();
    const bool scattered = is_scattered(static_cast<uint8_t>(c.kind));
    const uint64_t ranges = scattered ? count_extents(op, c.op_offset, c.length) : 0;
    h.offset = scattered ? ranges : op.remote.offset() + c.op_offset;
    h.length = c.length;
    const bool atomic = is_atomic(static_cast<uint8_t>(c.kind));
    const bool write = is_write(static_cast<uint8_t>(c.kind));
    bool inline_write = write && c.length <= kInlineWrite;
    if (inline_write && !c.transfer->begin_touch()) {
      finish(c, Cancelled("cancelled before it was sent"));
      pending_.pop_front();
      continue;
    }
    size_t at = tx_.size();
    const size_t list_bytes = static_cast<size_t>(ranges) * sizeof(WireRange);
    tx_.resize(at + sizeof h + list_bytes + (inline_write ? c.length : 0) +
               (atomic ? kAtomicOperandBytes : 0));
    std::memcpy(tx_.data() + at, &h, sizeof h);
    uint8_t* next = tx_.data() + at + sizeof h;
    if (scattered) {  // the ranges in the buffer, in the op's order
      for_each_extent(op, c.op_offset, c.length, [&](const Extent& e) {
        const WireRange r{op.remote.offset() + e.remote_offset, e.length};
        std::memcpy(next, &r, sizeof r);
        next += sizeof r;
      });
    }
    if (inline_write) {
      for_each_extent(op, c.op_offset, c.length, [&](const Extent& e) {
        std::memcpy(next, op.local.data() + e.local_offset, e.length);
        next += e.length;
      });
      c.transfer->end_touch();
    }
    if (atomic) {  // the operands come from the op, not from local memory
      const uint64_t operands[2] = {
          op.kind == OpKind::kFetchAdd ? op.operand : op.compare,
          op.kind == OpKind::kFetchAdd ? 0 : op.operand,
      };
      std::memcpy(next, operands, sizeof operands);
    }
    append_arena(tx_.size() - at);
    ++next_request_id_;
    c.request_id = h.request_id;
    const bool external_write = write && !inline_write;
    if (inflight_.empty()) last_io_ = Clock::now();  // the stall clock starts now
    inflight_.push_back(std::move(c));
    pending_.pop_front();
    if (external_write) {  // sent from local memory, extent by extent
      Chunk& placed = inflight_.back();
      placed.payload_unsent = true;
      for_each_extent(op, placed.op_offset, placed.length, [&](const Extent& e) {
        segs_.push_back(TxSegment{op.local.data() + e.local_offset, &placed, e.length, 0, false});
      });
      segs_.back().last = true;
    }
  }
}

void Stream::advance_tx(size_t sent) {
  while (sent > 0) {
    TxSegment& seg = segs_.front();
    size_t n = std::min(sent, seg.size - seg.done);
    seg.done += n;
    sent -= n;
    if (seg.external == nullptr) tx_head_ += n;
    if (seg.done == seg.size) {
      if (seg.chunk && seg.last) seg.chunk->payload_unsent = false;
      segs_.pop_front();
    }
  }
  if (tx_head_ == tx_.size()) {
    tx_.clear();
    tx_head_ = 0;
  }
}

bool Stream::pump_send() {
  bool progressed = false;
  encode();
  while (!segs_.empty()) {
    iovec iov[kMaxSendIov];
    TransferState* touched[kMaxSendIov];
    int n = 0, ntouched = 0;
    size_t arena_at = tx_head_;
    for (TxSegment& seg : segs_) {
      if (n == static_cast<int>(kMaxSendIov)) break;
      size_t left = seg.size - seg.done;
      if (seg.external == nullptr) {
        iov[n++] = {tx_.data() + arena_at, left};
        arena_at += left;
      } else if (seg.chunk->transfer->begin_touch()) {
        touched[ntouched++] = seg.chunk->transfer.get();
        iov[n++] = {const_cast<std::byte*>(seg.external) + seg.done, left};
      } else {
        // Cancelled mid-payload: the header promised `size` bytes, so keep
        // the stream framed with zeros instead of the caller's memory. The
        // remote range of a failed write is unspecified.
        iov[n++] = {const_cast<uint8_t*>(kZeros), std::min(left, sizeof kZeros)};
        break;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t sent = ::sendmsg(sock_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    int err = errno;
    for (int i = 0; i < ntouched; ++i)
      touched[i]->end_touch();
    if (sent < 0) {
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EINTR) continue;
      // An owner that closed an idle connection said goodbye first: take
      // that (and go again on a new connection) before calling it lost.
      pump_recv();
      if (sock_.valid()) {
        broken("connection to " + peer_->address.to_string() + " lost: " + errno_text(err));
      }
      return true;
    }
    progressed = true;
    last_io_ = Clock::now();
    advance_tx(static_cast<size_t>(sent));
    encode();
  }
  return progressed;
}

// --- receiving ----------------------------------------------------------------

bool Stream::fill_rx(size_t limit) {
  if (rx_begin_ == rx_end_) {
    rx_begin_ = rx_end_ = 0;
  } else if (rx_begin_ > 0 && kRxBytes - rx_end_ < sizeof(ResponseHeader)) {
    std::memmove(rx_.get(), rx_.get() + rx_begin_, rx_end_ - rx_begin_);
    rx_end_ -= rx_begin_;
    rx_begin_ = 0;
  }
  size_t want = std::min(kRxBytes - rx_end_, limit);
  ssize_t n = ::recv(sock_.get(), rx_.get() + rx_end_, want, MSG_DONTWAIT);
  if (n > 0) {
    rx_end_ += static_cast<size_t>(n);
    last_io_ = Clock::now();
    return true;
  }
  if (n == 0) {
    broken("connection to " + peer_->address.to_string() + " closed by the owner");
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    broken("connection to " + peer_->address.to_string() + " lost: " + errno_text(errno));
  }
  return false;
}

void Stream::on_response(const ResponseHeader& h) {
  if (h.kind == kGoodbye) {
    if (h.status != 0 || h.request_id != 0 || h.payload != 0 || h.reserved0 != 0 ||
        h.reserved1 != 0) {
      protocol_error("owner at " + peer_->address.to_string() + " sent a malformed goodbye");
      return;
    }
    start_over();
    return;
  }
  if (inflight_.empty()) {
    protocol_error("owner at " + peer_->address.to_string() + " sent an unrequested reply");
    return;
  }
  Chunk& c = inflight_.front();
  if (h.request_id != c.request_id || h.kind != (static_cast<uint8_t>(c.kind) | kResponseBit) ||
      h.reserved0 != 0 || h.reserved1 != 0 || !is_response_status(h.status)) {
    protocol_error("owner at " + peer_->address.to_string() + " sent a malformed reply");
    return;
  }
  if (h.status != 0) {
    if (h.payload != 0 || c.payload_unsent) {
      protocol_error("owner at " + peer_->address.to_string() + " sent a malformed reply");
      return;
    }
    Status st =
        c.transfer->cancelled()
            ? Status(static_cast<StatusCode>(h.status), "")
            : Status(static_cast<StatusCode>(h.status),
                     describe_op(c.transfer->op(c.op)) + ": " + owner_refused(h.status, c.kind));
    finish(c, st);
    inflight_.pop_front();
    return;
  }
  // A read's reply carries its bytes; an atomic's, the word's previous value.
  if (is_read(static_cast<uint8_t>(c.kind)) || is_atomic(static_cast<uint8_t>(c.kind))) {
    if (h.payload != c.length) {
      protocol_error("owner at " + peer_->address.to_string() + " sent a reply of the wrong size");
      return;
    }
    c.moved = 0;
    in_payload_ = true;
    return;
  }
  // A write's reply may only come once its whole payload has been sent: the
  // owner reads the payload first. Anything else would let us release the
  // caller's memory while a send still reads it.
  if (h.payload != 0 || c.payload_unsent) {
    protocol_error("owner at " + peer_->address.to_string() + " replied to an unfinished write");
    return;
  }
  finish(c, Status::Ok());
  inflight_.pop_front();
}

// Moves payload bytes of the read at the front; true on progress.
bool Stream::read_payload() {
  Chunk& c = inflight_.front();
  const Op& op = c.transfer->op(c.op);
  uint64_t left = c.length - c.moved;
  size_t buffered = rx_end_ - rx_begin_;
  if (buffered > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buffered, left));
    if (c.transfer->begin_touch()) {
      const uint8_t* from = rx_.get() + rx_begin_;
      for_each_extent(op, c.op_offset + c.moved, n, [&](const Extent& e) {
        std::memcpy(op.local.data() + e.local_offset, from, e.length);
        from += e.length;
      });
      c.transfer->end_touch();
    }
    rx_begin_ += n;
    c.moved += n;
  } else if (left >= kDirectRecvMin) {
    ssize_t n;
    int err;
    if (c.transfer->begin_touch()) {
      // Straight into local memory, extent after extent.
      iovec iov[kMaxRecvIov];
      size_t count = 0;
      ExtentCursor cursor(op, c.op_offset + c.moved);
      for (uint64_t want = left; want > 0 && count < kMaxRecvIov;) {
        const Extent e = cursor.next(want);
        iov[count++] = {op.local.data() + e.local_offset, e.length};
        want -= e.length;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      n = ::recvmsg(sock_.get(), &msg, MSG_DONTWAIT);
      err = errno;
      c.transfer->end_touch();
    } else {  // cancelled: drain the bytes, never into the caller's memory
      const std::span<uint8_t> scratch = loop_.scratch();
      n = ::recv(sock_.get(), scratch.data(), std::min<uint64_t>(left, scratch.size()),
                 MSG_DONTWAIT);
      err = errno;
    }
    if (n == 0) {
      broken("connection to " + peer_->address.to_string() + " closed by the owner");
      return true;
    }
    if (n < 0) {
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return false;
      broken("connection to " + peer_->address.to_string() + " lost: " + errno_text(err));
      return true;
    }
    last_io_ = Clock::now();
    c.moved += static_cast<uint64_t>(n);
  } else if (!fill_rx(kRxBytes)) {
    return !sock_.valid();
  }
  if (c.moved == c.length) {
    in_payload_ = false;
    finish(c, Status::Ok());
    inflight_.pop_front();
  }
  return true;
}

bool Stream::pump_recv() {
  bool progressed = false;
  while (sock_.valid()) {
    if (in_payload_) {
      if (!read_payload()) return progressed;
      progressed = true;
      continue;
    }
    size_t buffered = rx_end_ - rx_begin_;
    if (buffered >= sizeof(ResponseHeader)) {
      ResponseHeader h;
      std::memcpy(&h, rx_.get() + rx_begin_, sizeof h);
      rx_begin_ += sizeof h;
      on_response(h);
      progressed = true;
      continue;
    }
    // Before a large read payload, take just the header so that the payload
    // can go straight into local memory.
    size_t limit = kRxBytes;
    if (!inflight_.empty() && is_read(static_cast<uint8_t>(inflight_.front().kind)) &&
        inflight_.front().length >= kDirectRecvMin) {
      limit = sizeof(ResponseHeader) - buffered;
    }
    if (!fill_rx(limit)) return progressed || !sock_.valid();
    progressed = true;
  }
  return progressed;
}

// --- Peer ---------------------------------------------------------------------

Peer::Peer(PeerContext context, int streams, EventLoops& loops)
    : context_(std::make_shared<const PeerContext>(std::move(context))) {
  for (int i = 0; i < streams; ++i)
    streams_.push_back(std::make_shared<Stream>(context_, i, loops.next()));
}

Peer::~Peer() {
  stop();
}

void Peer::submit(const std::shared_ptr<TransferState>& transfer, std::span<const uint32_t> ops,
                  uint64_t chunk_size) {
  const size_t n = streams_.size();
  std::vector<uint64_t> load(n), cost(n);
  std::vector<std::vector<Chunk>> assigned(n);
  uint64_t total = 0;
  for (size_t s = 0; s < n; ++s)
    load[s] = streams_[s]->load();
  for (uint32_t i : ops)
    total += transfer->op(i).bytes();
  auto least_loaded = [&] {
    return static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
  };
  const bool spread = total >= kSpreadBytes;
  const size_t single = least_loaded();
  for (uint32_t i : ops) {
    const Op& op = transfer->op(i);
    const RequestKind kind = request_kind(op);
    uint32_t parts = 0;
    cut_into_chunks(op, chunk_size, [&](uint64_t begin, uint64_t length) {
      Chunk c;
      c.transfer = transfer;
      c.op = i;
      c.kind = kind;
      c.op_offset = begin;
      c.length = length;
      c.cost = c.length + kRequestCost;
      size_t s = spread ? least_loaded() : single;
      load[s] += c.cost;
      cost[s] += c.cost;
      assigned[s].push_back(std::move(c));
      ++parts;
    });
    // Before the chunks are enqueued, so before any part can finish.
    if (parts > 1) transfer->expect_parts(i, parts);
  }
  for (size_t s = 0; s < n; ++s) {
    if (!assigned[s].empty()) streams_[s]->enqueue(assigned[s], cost[s]);
  }
}

void Peer::stop() {
  for (auto& s : streams_)
    s->stop();
}

bool Peer::idle() {
  for (auto& s : streams_) {
    if (!s->idle()) return false;
  }
  return true;
}

}  // namespace rdmabuf::tcp
