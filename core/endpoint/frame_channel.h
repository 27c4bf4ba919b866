// How an endpoint's frames travel between its two sides: one interface,
// FrameChannel, with three kinds behind it, chosen by the handshake from
// an ordered list (handshake.h): shared-memory rings between two managers
// on one host, an RDMA backend's SEND/RECV (MessageChannel), and the TCP
// connection itself, which every endpoint has and which also carries the
// rings' doorbells and, by its end, the peer's.
//
// The endpoint asks a channel what it can do (its traits), never which
// kind it is:
//   frames_in_place()  frames can be looked at where they lie (peek(),
//                      consume(), has_incoming()): the rings. Otherwise
//                      bytes come only through read_some() (TCP).
//   writes_may_wait()  a write may wait for the peer to read (TCP): writers
//                      then take a frames lock of their own. Otherwise a
//                      write goes whole or not at all without waiting
//                      (try_write), under the endpoint's state lock.
//   cheap_writes()     a write is a few stores in memory, no system call
//                      (shared memory): credits may go whenever a wait idles.
//   keeps_views()      a view peek() gave stays valid through consume() of
//                      its front (RDMA), so one view serves several frames.
//
// Calls go to the kind with no virtual call: the shared-memory rings, on
// the path of every message between two processes on one host, are
// inline. Thread safety: readers (the reader role's holder) and writers
// (the frames lock's holder) may use one channel at once; the traits and
// describe() may be read by anyone.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>

#include "core/endpoint/message_parts.h"
#include "core/endpoint/shm_channel.h"
#include "rdmabuf/backend.h"
#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf::endpoint {

// Shared-memory rings (ShmChannel); doorbells over the TCP connection.
class ShmFrames {
 public:
  explicit ShmFrames(std::unique_ptr<ShmChannel> rings) : rings_(std::move(rings)) {}
  ShmChannel* rings() const { return rings_.get(); }
  Result<bool> try_write(std::span<const uint8_t> first,
                         std::span<const std::span<const uint8_t>> pieces, bool& doorbell) {
    Result<bool> wrote = rings_->write_whole(first, pieces);
    doorbell = wrote.ok() && *wrote && rings_->doorbell_requested();
    return wrote;
  }
  bool has_incoming() const { return rings_->has_incoming(); }
  Result<std::span<const uint8_t>> peek() { return rings_->peek(); }
  void consume(size_t size) { rings_->consume(size); }
  Result<size_t> read_some(uint8_t* out, size_t size) { return rings_->read_some(out, size); }
  bool prepare_sleep() { return rings_->request_doorbell(); }
  bool peer_waits_on_this_cpu() { return rings_->peer_waits_on_this_cpu(); }

 private:
  std::unique_ptr<ShmChannel> rings_;
};

// An RDMA backend's SEND/RECV (MessageChannel); its reader sleeps on the
// channel's wakeup_fd().
class RdmaFrames {
 public:
  explicit RdmaFrames(std::unique_ptr<MessageChannel> channel) : channel_(std::move(channel)) {}
  Result<bool> try_write(std::span<const uint8_t> first,
                         std::span<const std::span<const uint8_t>> pieces, bool& doorbell) {
    doorbell = false;  // the peer's NIC wakes its reader
    return channel_->write_whole(first, pieces);
  }
  bool has_incoming() const { return channel_->has_incoming(); }
  Result<std::span<const uint8_t>> peek() { return channel_->peek(); }
  void consume(size_t size) { channel_->consume(size); }
  Result<size_t> read_some(uint8_t* out, size_t size) { return channel_->read_some(out, size); }
  bool prepare_sleep() { return channel_->arm_wakeup(); }
  int wakeup_fd() const { return channel_->wakeup_fd(); }
  bool take_wakeups() { return channel_->take_wakeups(); }
  size_t write_unit() const { return channel_->write_unit(); }
  void drain(std::chrono::milliseconds limit) { channel_->drain(limit); }

 private:
  std::unique_ptr<MessageChannel> channel_;
};

// The TCP connection itself: frames as a byte stream.
class TcpFrames {
 public:
  explicit TcpFrames(int socket) : socket_(socket) {}
  // The whole of `pieces` before `deadline`, gathered; while the socket has
  // no room, `while_blocked` runs between waits.
  Status write(std::span<iovec> pieces, Deadline deadline, int stop_fd,
               const std::function<void()>& while_blocked);
  Result<size_t> read_some(uint8_t* out, size_t size);

 private:
  int socket_;
};

class FrameChannel {
 public:
  // The kinds, in the order the handshake prefers them.
  using Kind = std::variant<ShmFrames, RdmaFrames, TcpFrames>;

  // `socket`: the endpoint's TCP connection (not owned). `stream_limit`:
  // messages of more than kInlineLimit bytes and up to this size travel in
  // kSentPart frames; larger ones by a one-sided write.
  FrameChannel(Kind kind, int socket, uint64_t stream_limit, std::string description);

  // --- traits (see the top of this file) ---
  bool frames_in_place() const { return !std::holds_alternative<TcpFrames>(kind_); }
  bool writes_may_wait() const { return std::holds_alternative<TcpFrames>(kind_); }
  bool cheap_writes() const { return std::holds_alternative<ShmFrames>(kind_); }
  bool keeps_views() const { return std::holds_alternative<RdmaFrames>(kind_); }
  uint64_t stream_limit() const { return stream_limit_; }
  // How a message in parts is cut (message_parts.h).
  const PartShape& parts() const { return parts_; }
  const std::string& describe() const { return description_; }

  // --- writing ---
  // frames_in_place() channels: all of `first` then `pieces`, or nothing
  // when there is no room now: whether it did. `doorbell`: the peer's
  // reader asked to be woken; ring_doorbell() once the caller's locks are
  // free.
  Result<bool> try_write(std::span<const uint8_t> first,
                         std::span<const std::span<const uint8_t>> pieces, bool& doorbell) {
    if (shm_) [[likely]] {
      Result<bool> wrote = shm_->write_whole(first, pieces);
      doorbell = wrote.ok() && *wrote && shm_->doorbell_requested();
      return wrote;
    }
    return std::get<RdmaFrames>(kind_).try_write(first, pieces, doorbell);
  }
  // One byte on the TCP connection, for the peer's reader asleep on it.
  void ring_doorbell();
  // writes_may_wait() channels: as TcpFrames::write.
  Status write(std::span<iovec> pieces, Deadline deadline, int stop_fd,
               const std::function<void()>& while_blocked) {
    return std::get<TcpFrames>(kind_).write(pieces, deadline, stop_fd, while_blocked);
  }

  // --- reading (the reader role's holder) ---
  // frames_in_place() channels: one look (a load on the rings).
  bool has_incoming() {
    if (shm_) [[likely]]
      return shm_->has_incoming();
    return std::get<RdmaFrames>(kind_).has_incoming();
  }
  // frames_in_place() channels: the bytes waiting from the read position
  // on, as far as they lie in one piece (empty: none), valid through
  // consume() of bytes before those a frame still needs when keeps_views().
  // The peer may write into them meanwhile: read each byte once.
  Result<std::span<const uint8_t>> peek() {
    if (shm_) [[likely]]
      return shm_->peek();
    return std::get<RdmaFrames>(kind_).peek();
  }
  void consume(size_t size) {
    if (shm_) [[likely]] {
      shm_->consume(size);
    } else {
      std::get<RdmaFrames>(kind_).consume(size);
    }
  }
  // Copies up to `size` waiting bytes out, without waiting: how many, 0
  // when none. kUnavailable at the peer's end (TCP).
  Result<size_t> read_some(uint8_t* out, size_t size) {
    return std::visit([&](auto& c) { return c.read_some(out, size); }, kind_);
  }

  // --- sleeping (the reader role's holder) ---
  // Before a reader sleeps on the TCP connection and wakeup_fd(): false when
  // bytes came meanwhile (read them). The rings ask the peer's writer for a
  // doorbell; an RDMA channel arms its wakeups; TCP needs neither.
  bool prepare_sleep() {
    if (auto* shm = std::get_if<ShmFrames>(&kind_)) return shm->prepare_sleep();
    if (auto* rdma = std::get_if<RdmaFrames>(&kind_)) return rdma->prepare_sleep();
    return true;
  }
  // Readable once bytes came for an armed reader (RDMA); else -1.
  int wakeup_fd() const {
    const auto* rdma = std::get_if<RdmaFrames>(&kind_);
    return rdma ? rdma->wakeup_fd() : -1;
  }
  // frames_in_place() channels: empties the TCP connection of doorbells (it
  // carries nothing else; at most a few reads, so that a peer flooding it
  // cannot keep the reader here), setting `peer_closed` at its end, and
  // takes what made wakeup_fd() readable: whether anything came.
  bool take_doorbells(bool& peer_closed);
  // Whether the peer's reader last waited on this thread's CPU (the rings
  // tell; false elsewhere: this side cannot see the peer's CPU).
  bool peer_waits_on_this_cpu() {
    auto* shm = std::get_if<ShmFrames>(&kind_);
    return shm && shm->peer_waits_on_this_cpu();
  }

  // Before the TCP connection ends: the frames written reach the peer
  // first (RDMA; the rings hold them already, TCP sends them before its
  // end). Frames lock held.
  void drain(std::chrono::milliseconds limit) {
    if (auto* rdma = std::get_if<RdmaFrames>(&kind_)) rdma->drain(limit);
  }

 private:
  Kind kind_;
  // The shared-memory rings when they are the kind (the path of every
  // message between two processes on one host: one test, then inline).
  ShmChannel* const shm_;
  const int socket_;
  const uint64_t stream_limit_;
  const PartShape parts_;
  const std::string description_;
};

}  // namespace rdmabuf::endpoint
