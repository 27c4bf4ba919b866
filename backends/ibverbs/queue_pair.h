// An RC queue pair with its own completion queues or a shared one, and its
// state changes.
#pragma once

#include <cstdint>
#include <memory>

#include "backends/ibverbs/completion_queue.h"
#include "backends/ibverbs/device.h"

namespace rdmabuf::ibverbs {

// What one side tells the other to connect a pair.
struct Endpoint {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
  ibv_gid gid{};
  uint16_t lid = 0;
  uint8_t mtu = 0;  // ibv_mtu
};

class QueuePair {
 public:
  // What a pair holds.
  struct Shape {
    uint32_t send_depth = 16;  // work requests posted and not completed
    // Receives posted at once. 0: the pair takes none (one-sided ops
    // only), and one completion queue serves both queues; else the
    // receives complete on a queue of their own (recv_cq()).
    uint32_t receive_depth = 0;
    // Where the receive queue's completion events go (null: none); its
    // file descriptor must not block (the destructor takes the events left).
    ibv_comp_channel* receive_events = nullptr;
    // The protection domain (null: the device's), and what the peer may do
    // through the pair in memory registered in it for remote access.
    ibv_pd* pd = nullptr;
    int remote_access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    // Bytes a SEND may carry in its work request (IBV_SEND_INLINE), asked
    // for; the pair gets what the device grants, or none (inline_bytes()).
    uint32_t inline_bytes = 0;
    // Local pieces one work request gathers (a write's) or scatters into (a
    // read's): at most the device's max_sge.
    uint32_t send_sge = 1;
  };
  // Completion queues and a queue pair in INIT, allowing the peer
  // `shape.remote_access` into memory registered for it.
  static Result<std::unique_ptr<QueuePair>> create(const Device& device, const Shape& shape);
  static Result<std::unique_ptr<QueuePair>> create(const Device& device, uint32_t depth) {
    return create(device, Shape{depth});
  }
  // Which of a pair's queues completes into a shared queue.
  enum class Shared { kSends, kReceives };
  // The same, with the sends (and the receives: `shape` must take none) or
  // the receives completing on the shared queue `room` is on; the other
  // queue gets one of its own. The room goes back after the pair.
  static Result<std::unique_ptr<QueuePair>> create(const Device& device, const Shape& shape,
                                                   CqRoom room, Shared shared);
  ~QueuePair();  // the queue pair first, then its completion queues (or room)
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  Endpoint local() const;
  // INIT -> RTR -> RTS towards `remote`.
  Status connect(const Endpoint& remote);
  // Any state -> ERR: every posted work request completes (flushed).
  Status to_error();

  ibv_qp* qp() const { return qp_; }
  // The send queue's completion queue (and the receives', when they have
  // none of their own).
  ibv_cq* cq() const { return cq_; }
  ibv_cq* recv_cq() const { return recv_cq_ ? recv_cq_ : cq_; }
  uint32_t depth() const { return depth_; }
  // The most a work request posted with IBV_SEND_INLINE may carry.
  uint32_t inline_bytes() const { return inline_bytes_; }

 private:
  QueuePair(const Device& device) : device_(device) {}
  // Creates what cq_ does not have yet, and the pair, and moves it to INIT.
  Status init(const Shape& shape);

  const Device& device_;
  CqRoom shared_;  // when cq_ is a shared queue's
  ibv_cq* cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;  // null: cq_
  ibv_qp* qp_ = nullptr;
  uint32_t depth_ = 0;
  uint32_t inline_bytes_ = 0;
  uint32_t psn_ = 0;
  uint8_t rd_atomic_ = 1;
};

}  // namespace rdmabuf::ibverbs
