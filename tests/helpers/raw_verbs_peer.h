// A reader written with raw verbs against an owner's ibverbs backend: it
// runs the handshake (backends/ibverbs/handshake.h) presenting whatever
// handle it likes, asks for access to buffers, and posts READs, WRITEs and
// SENDs with any key and address: what a hostile peer that can reach the
// owner's listener and its NIC could do. Needs an RDMA device.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <span>
#include <thread>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/hello.h"
#include "common/socket.h"
#include "rdmabuf/manager.h"

namespace rdmabuf::testing {

class RawVerbsPeer {
 public:
  static constexpr size_t kBytes = 4096;

  // A pair with `owner`, presenting `claim`, as a reader whose hello says it
  // is manager `caller`. The owner's refusal when it sets up none.
  static Result<std::unique_ptr<RawVerbsPeer>> connect(const ibverbs::Device& device,
                                                       const Manager& owner, uint64_t caller,
                                                       const ibverbs::HandleClaim& claim) {
    std::unique_ptr<RawVerbsPeer> peer(new RawVerbsPeer);
    const Deadline deadline = Clock::now() + std::chrono::seconds(30);
    RDMABUF_ASSIGN_OR_RETURN(peer->qp_, ibverbs::QueuePair::create(device, 8));
    RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(owner.address()));
    RDMABUF_ASSIGN_OR_RETURN(peer->control_, connect_tcp(where, deadline));
    Hello hello{Channel::kIbverbs, caller, owner.identity().manager_id};
    RDMABUF_RETURN_IF_ERROR(exchange_hello(peer->control_.get(), hello, deadline).status());
    RDMABUF_RETURN_IF_ERROR(ibverbs::send_connect(peer->control_.get(), device.name(),
                                                  peer->qp_->local(), claim, deadline, -1));
    RDMABUF_ASSIGN_OR_RETURN(ibverbs::Endpoint theirs,
                             ibverbs::read_accepted(peer->control_.get(), deadline, -1));
    RDMABUF_RETURN_IF_ERROR(peer->qp_->connect(theirs));
    RDMABUF_ASSIGN_OR_RETURN(
        peer->region_, ibverbs::register_range(device, peer->bytes_.data(), peer->bytes_.size(),
                                               IBV_ACCESS_LOCAL_WRITE));
    return peer;
  }

  // Asks for access to the buffer `claim` names: the owner's answer.
  Result<ibverbs::BufferAnswer> ask(const ibverbs::HandleClaim& claim) {
    const Deadline deadline = Clock::now() + std::chrono::seconds(30);
    RDMABUF_RETURN_IF_ERROR(ibverbs::send_query(control_.get(), claim, deadline, -1));
    std::array<uint8_t, ibverbs::kAnswerBytes> answer{};
    RDMABUF_RETURN_IF_ERROR(recv_exact(control_.get(), answer.data(), answer.size(), deadline));
    return ibverbs::parse_answer(answer);
  }

  // The peer's own bytes: what READs land in and WRITEs send.
  std::span<uint8_t> bytes() { return bytes_; }

  // One READ into bytes(), or one WRITE from them, of `length` (at most
  // kBytes) at `addr` with `rkey`: its completion's status.
  ibv_wc_status read(uint64_t addr, uint32_t rkey, uint32_t length) {
    return post(IBV_WR_RDMA_READ, addr, rkey, length);
  }
  ibv_wc_status write(uint64_t addr, uint32_t rkey, uint32_t length) {
    return post(IBV_WR_RDMA_WRITE, addr, rkey, length);
  }
  // `message` (at most kBytes) as one SEND.
  ibv_wc_status send(std::span<const uint8_t> message) {
    std::copy(message.begin(), message.end(), bytes_.begin());
    return post(IBV_WR_SEND, 0, 0, static_cast<uint32_t>(message.size()));
  }

 private:
  RawVerbsPeer() = default;

  ibv_wc_status post(ibv_wr_opcode opcode, uint64_t addr, uint32_t rkey, uint32_t length) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(bytes_.data()), std::min<uint32_t>(length, kBytes),
                region_->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp_->qp(), &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    const auto until = Clock::now() + std::chrono::seconds(30);
    ibv_wc wc{};
    while (Clock::now() < until) {
      const int n = ibv_poll_cq(qp_->cq(), 1, &wc);
      if (n < 0) return IBV_WC_GENERAL_ERR;
      if (n == 1) return wc.status;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return IBV_WC_RESP_TIMEOUT_ERR;  // (no completion in time)
  }

  std::array<uint8_t, kBytes> bytes_{};
  Fd control_;  // the owner keeps its side of the pair while this is open
  std::shared_ptr<ibverbs::MemoryRegion> region_;
  std::unique_ptr<ibverbs::QueuePair> qp_;
};

}  // namespace rdmabuf::testing
