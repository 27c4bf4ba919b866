// The endpoint's server: reads the endpoint's channel while no caller does,
// sends the credits no call sends, and delivers notifications (progress.cc
// says when; docs/threads.md). It holds no thread of its own. A task on one
// of the manager's event loops waits for the endpoint's events (its epoll
// set: the socket, the RDMA channel's wakeups, the eventfds that call for
// the server) and times its looks; a look that finds nothing to do ends
// there. Every other turn (frames to read, notifications to deliver, a
// write) runs on one of the manager's endpoint workers (WorkerPool), where
// it may block as a thread of the endpoint's own would: a notification
// handler, a full notification queue, a write waiting for the peer to
// read. So an idle endpoint costs no thread, and a busy one a worker for
// the length of its turn.
//
// The server's steps run one at a time, each on the loop's thread or a
// worker: a turn's worker hands the server back by a kick, and the loop
// hands it to a worker through the pool's queue, so each step sees what
// the one before it wrote.
#pragma once

#include <memory>

#include "common/event_loop.h"
#include "common/socket.h"
#include "common/worker_pool.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

class EndpointImpl;

// What a wait's end calls for (EndpointImpl::server_look).
enum class ServerLook {
  kDone,         // nothing: a timed look while callers read; the loop waits again
  kSendCredits,  // such a look, with credits due to send: a turn sends them
  kTurn,         // a turn: read, deliver, move sends on
  kFailed,       // the epoll set failed: a turn breaks the endpoint
};

class EndpointServer final : public LoopTask, public std::enable_shared_from_this<EndpointServer> {
 public:
  // Starts serving `endpoint`, waiting on `events` (a descriptor of its
  // epoll set of its own, so that it outlives the endpoint's), on `loop`
  // and `workers`: the server, or null when the loop has ended. Each step
  // holds the endpoint (a reference from `endpoint`), so an endpoint lives
  // until the step under way ends, and a step that finds it gone lets go
  // of the loop. The server takes its last step after the endpoint breaks
  // (a turn sees it stopping), or when the loop or the pool stops first
  // (the manager shut down); either way it then tells the endpoint
  // (EndpointImpl::served_out).
  static std::shared_ptr<EndpointServer> start(const std::shared_ptr<EndpointImpl>& endpoint,
                                               Fd events, EventLoop& loop, WorkerPool& workers);
  // For the endpoint's destruction: has the server let go of its loop at
  // once (the endpoint's descriptors close, so its events may never come).
  static void release(const std::weak_ptr<EndpointServer>& server);
  // Whether the calling thread is inside a step of `endpoint`'s server (a
  // notification handler, say).
  static bool serving(const EndpointImpl* endpoint);

  EndpointServer(std::weak_ptr<EndpointImpl> endpoint, Fd events, EventLoop& loop,
                 WorkerPool& workers)
      : endpoint_(std::move(endpoint)),
        events_(std::move(events)),
        loop_(loop),
        workers_(workers) {}
  ~EndpointServer() override;
  EndpointServer(const EndpointServer&) = delete;
  EndpointServer& operator=(const EndpointServer&) = delete;

  void on_run(EventLoop& loop) override;

 private:
  // The loop's thread: waits as the endpoint asks (EndpointImpl::server_wait),
  // or goes on at once.
  void wait(EventLoop& loop, EndpointImpl& endpoint);
  // The loop's thread: the wait ended, with `woken` events (0: none; -1:
  // the epoll set failed).
  void after_wait(EventLoop& loop, EndpointImpl& endpoint, int woken);
  // A worker's: one turn, then the server back to the loop.
  void take_turn(ServerLook look);
  // Tells the endpoint that the server takes no more steps.
  void tell_done(EndpointImpl& endpoint);

  const std::weak_ptr<EndpointImpl> endpoint_;
  const Fd events_;
  EventLoop& loop_;
  WorkerPool& workers_;
  // The server's steps alone (one at a time), and its destructor.
  bool told_ = false;    // tell_done ran
  bool in_turn_ = true;  // a worker has the server (or, at first, the start's kick)
  bool watching_ = false;
  Deadline look_at_ = Deadline::max();  // the timed look's, or none
};

}  // namespace rdmabuf
