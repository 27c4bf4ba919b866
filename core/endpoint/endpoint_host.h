// What an endpoint needs of the manager it belongs to: the internal
// interface between the two (core/manager.cc implements it). An endpoint
// registers receives and lent memory, submits the one-sided writes of
// large messages, hands notifications to the manager's queue, and asks for
// an RDMA message channel; the manager routes notices from its backends to
// endpoints (NoticeRoutes). The manager outlives its endpoints.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "common/event_loop.h"
#include "common/worker_pool.h"
#include "core/notifications.h"
#include "rdmabuf/backend.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/config.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/op.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf::endpoint {

class EndpointHost {
 public:
  virtual ~EndpointHost() = default;

  virtual const Config& config() const = 0;
  virtual const PeerIdentity& identity() const = 0;
  // As Manager::backends().
  virtual std::vector<BackendInfo> backends() const = 0;
  // As Manager::register_buffer(), release() and submit().
  virtual Result<RemoteBuffer> register_buffer(LocalMemory memory) = 0;
  virtual Status release(const RemoteBuffer& handle) = 0;
  virtual Transfer submit(std::vector<Op> ops, std::chrono::milliseconds timeout,
                          std::function<void()> on_done) = 0;
  // The write of Endpoint::write: it carries `notice`, and `notice_sent`
  // says whether the backend that ran it sent it (TransferState::
  // notice_sent; set whatever the status).
  virtual Status write_noticed(const RemoteBuffer& dst, const LocalMemory& src,
                               const WriteNotice& notice, std::chrono::milliseconds timeout,
                               bool& notice_sent) = 0;
  // A message channel for an endpoint: from the best RDMA backend that
  // offers one, or why none did.
  virtual Result<std::unique_ptr<MessageChannel>> open_message_channel() = 0;

  // Shared by the manager's endpoints. Their servers (server.h) wait on
  // the manager's event loops, one each, and take their turns on its
  // endpoint workers; kCancelled once the manager shut down.
  virtual Result<EventLoop*> endpoint_loop() = 0;
  virtual WorkerPool& endpoint_workers() = 0;
  virtual NotificationQueue& notifications() = 0;
  virtual NoticeRoutes& notice_routes() = 0;
  virtual LendBudget& lend_budget() = 0;
};

}  // namespace rdmabuf::endpoint
