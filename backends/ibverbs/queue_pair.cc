#include "backends/ibverbs/queue_pair.h"

#include <algorithm>
#include <cerrno>

#include "common/host.h"
#include "common/socket.h"

namespace rdmabuf::ibverbs {
namespace {

// Transport retry settings (as common practice and Monarch use): a lost peer
// is reported after about 4 s of retries.
constexpr uint8_t kTimeout = 14;  // 4.096 us * 2^14 = 67 ms per try
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetry = 7;
constexpr uint8_t kMinRnrTimer = 12;
constexpr uint8_t kMaxRdAtomic = 16;

Status modify(const IbvLib& lib, ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* state) {
  int rc = lib.modify_qp(qp, &attr, mask);
  if (rc != 0) {
    return Unavailable(std::string("cannot move the queue pair to ") + state + ": " +
                       errno_text(rc > 0 ? rc : errno));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<QueuePair>> QueuePair::create(const Device& device, const Shape& shape,
                                                     CqRoom room, Shared shared) {
  if (!room) return Internal("no room on a shared completion queue");
  if (shared == Shared::kSends && shape.receive_depth > 0) {
    return Internal("a queue pair whose sends share a completion queue takes no receives");
  }
  if (shared == Shared::kReceives && shape.receive_depth == 0) {
    return Internal("a queue pair whose receives share a completion queue must take some");
  }
  std::unique_ptr<QueuePair> qp(new QueuePair(device));
  qp->shared_ = std::move(room);
  (shared == Shared::kSends ? qp->cq_ : qp->recv_cq_) = qp->shared_.cq();
  RDMABUF_RETURN_IF_ERROR(qp->init(shape));
  return qp;
}

Result<std::unique_ptr<QueuePair>> QueuePair::create(const Device& device, const Shape& shape) {
  std::unique_ptr<QueuePair> qp(new QueuePair(device));
  RDMABUF_RETURN_IF_ERROR(qp->init(shape));
  return qp;
}

Status QueuePair::init(const Shape& shape) {
  const Device& device = device_;
  const IbvLib& lib = device.lib();
  const auto most_wr = static_cast<uint32_t>(device.attr().max_qp_wr);
  depth_ = std::min(shape.send_depth, most_wr);
  rd_atomic_ = static_cast<uint8_t>(
      std::clamp(device.attr().max_qp_rd_atom, 1, static_cast<int>(kMaxRdAtomic)));
  if (!cq_) {
    cq_ = lib.create_cq(device.context(), static_cast<int>(depth_ + 1), nullptr, nullptr, 0);
    if (!cq_) {
      return ResourceExhausted("cannot create a completion queue: " + errno_text(errno));
    }
  }
  const uint32_t receive_depth = std::min(shape.receive_depth, most_wr);
  if (receive_depth > 0 && !recv_cq_) {
    recv_cq_ = lib.create_cq(device.context(), static_cast<int>(receive_depth + 1), nullptr,
                             shape.receive_events, 0);
    if (!recv_cq_) {
      return ResourceExhausted("cannot create a completion queue: " + errno_text(errno));
    }
  }
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = recv_cq();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = depth_;
  init.cap.max_recv_wr = std::max<uint32_t>(receive_depth, 1);
  // An inline SEND gathers on the stack; a READ or WRITE, the chunk's pieces.
  init.cap.max_send_sge = std::clamp<uint32_t>(
      shape.send_sge, 1, static_cast<uint32_t>(std::max(device.attr().max_sge, 1)));
  init.cap.max_recv_sge = 1;
  init.sq_sig_all = 0;
  init.cap.max_inline_data = shape.inline_bytes;
  ibv_pd* pd = shape.pd ? shape.pd : device.pd();
  qp_ = lib.create_qp(pd, &init);
  if (!qp_ && init.cap.max_inline_data > 0) {
    // More than the device carries: the least then.
    init.cap.max_inline_data = 0;
    qp_ = lib.create_qp(pd, &init);
  }
  if (!qp_) return ResourceExhausted("cannot create a queue pair: " + errno_text(errno));
  inline_bytes_ = init.cap.max_inline_data;  // what the device granted
  psn_ = static_cast<uint32_t>(secure_random_u64() & 0xffffff);

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = device.port();
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | shape.remote_access;
  return modify(lib, qp_, attr,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
}

QueuePair::~QueuePair() {
  const IbvLib& lib = device_.lib();
  if (qp_) lib.destroy_qp(qp_);
  const bool shared_recv = shared_ && recv_cq_ == shared_.cq();
  if (recv_cq_ && !shared_recv && recv_cq_->channel) {
    // Destroying a completion queue waits until each of its events was
    // acknowledged: take those nobody took (the channel does not block; the
    // queue pair is gone, so no more come).
    lib.take_cq_events(recv_cq_->channel);
  }
  if (recv_cq_ && !shared_recv) lib.destroy_cq(recv_cq_);
  if (cq_ && cq_ != shared_.cq()) lib.destroy_cq(cq_);
}

Endpoint QueuePair::local() const {
  Endpoint e;
  e.qpn = qp_->qp_num;
  e.psn = psn_;
  e.gid = device_.gid();
  e.lid = device_.lid();
  e.mtu = static_cast<uint8_t>(device_.mtu());
  return e;
}

Status QueuePair::connect(const Endpoint& remote) {
  const IbvLib& lib = device_.lib();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(std::min<uint8_t>(remote.mtu, device_.mtu()));
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = rd_atomic_;
  attr.min_rnr_timer = kMinRnrTimer;
  attr.ah_attr.port_num = device_.port();
  attr.ah_attr.dlid = remote.lid;
  if (device_.is_roce()) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = remote.gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_.gid_index());
    attr.ah_attr.grh.hop_limit = 64;
  }
  RDMABUF_RETURN_IF_ERROR(modify(lib, qp_, attr,
                                 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                     IBV_QP_MIN_RNR_TIMER,
                                 "RTR"));
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = kTimeout;
  attr.retry_cnt = kRetryCount;
  attr.rnr_retry = kRnrRetry;
  attr.sq_psn = psn_;
  attr.max_rd_atomic = rd_atomic_;
  return modify(lib, qp_, attr,
                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                "RTS");
}

Status QueuePair::to_error() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return modify(device_.lib(), qp_, attr, IBV_QP_STATE, "ERR");
}

}  // namespace rdmabuf::ibverbs
