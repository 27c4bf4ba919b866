#include "core/endpoint/server.h"

#include <sys/epoll.h>

#include <cerrno>

#include "common/log.h"
#include "common/socket.h"
#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// The endpoint whose server's step this thread runs.
thread_local const EndpointImpl* t_serving = nullptr;

}  // namespace

std::shared_ptr<EndpointServer> EndpointServer::start(const std::shared_ptr<EndpointImpl>& endpoint,
                                                      Fd events, EventLoop& loop,
                                                      WorkerPool& workers) {
  auto server = std::make_shared<EndpointServer>(endpoint, std::move(events), loop, workers);
  if (!loop.kick(server)) {
    server->told_ = true;  // goes with this call, and tells no one
    return nullptr;
  }
  return server;
}

void EndpointServer::release(const std::weak_ptr<EndpointServer>& server) {
  if (auto held = server.lock()) held->loop_.kick(held);  // its next run finds the endpoint gone
}

bool EndpointServer::serving(const EndpointImpl* endpoint) {
  return t_serving == endpoint;
}

EndpointServer::~EndpointServer() {
  // Let go of without a last step (its loop or the pool stopped first).
  if (told_) return;
  if (std::shared_ptr<EndpointImpl> endpoint = endpoint_.lock()) tell_done(*endpoint);
}

void EndpointServer::tell_done(EndpointImpl& endpoint) {
  if (told_) return;
  told_ = true;
  endpoint.served_out();
}

void EndpointServer::on_run(EventLoop& loop) {
  const std::shared_ptr<EndpointImpl> endpoint = endpoint_.lock();
  if (!endpoint) {  // gone: let go of the loop (no watch, no time)
    if (watching_) loop.unwatch(events_.get());
    watching_ = false;
    loop.quiet();
    return;
  }
  if (in_turn_) {  // the only kick while a worker has it: its turn ended
    in_turn_ = false;
    loop.quiet();  // re-arming a wait is no activity to spin after
    wait(loop, *endpoint);
    return;
  }
  epoll_event events[4];
  int woken = ::epoll_wait(events_.get(), events, 4, 0);
  if (woken < 0 && errno == EINTR) woken = 0;
  if (woken < 0) RDMABUF_LOG_ERROR("endpoint: epoll_wait: " + errno_text(errno));  // it breaks
  if (woken == 0 && look_at_ != Deadline::max() && Clock::now() < look_at_) {
    loop.wake_at(shared_from_this(), look_at_);  // early: the look's time has not come
    loop.quiet();
    return;
  }
  if (woken == 0 && look_at_ == Deadline::max()) {
    loop.quiet();  // nothing came after all: wait on
    return;
  }
  after_wait(loop, *endpoint, woken);
}

void EndpointServer::wait(EventLoop& loop, EndpointImpl& endpoint) {
  const int ms = endpoint.server_wait();
  if (ms == EndpointImpl::kNoWait) {
    look_at_ = Deadline::max();
    after_wait(loop, endpoint, 0);
    return;
  }
  if (!watching_) {
    Status watched = loop.watch(shared_from_this(), events_.get(), EPOLLIN);
    if (!watched.ok()) {
      RDMABUF_LOG_ERROR("endpoint: " + watched.to_string());
      after_wait(loop, endpoint, -1);
      return;
    }
    watching_ = true;
  }
  look_at_ = ms < 0 ? Deadline::max() : Clock::now() + std::chrono::milliseconds(ms);
  loop.wake_at(shared_from_this(), look_at_);
}

void EndpointServer::after_wait(EventLoop& loop, EndpointImpl& endpoint, int woken) {
  const ServerLook look = woken < 0 ? ServerLook::kFailed : endpoint.server_look(woken);
  if (look == ServerLook::kDone) {
    loop.quiet();
    wait(loop, endpoint);
    return;
  }
  // The rest may block: on a worker, while the loop neither watches (the
  // set stays readable until the turn takes what came) nor times.
  if (watching_) {
    loop.unwatch(events_.get());
    watching_ = false;
  }
  look_at_ = Deadline::max();
  in_turn_ = true;
  // A pool that stopped drops the job; this server then goes with the
  // loop's reference, and tells the endpoint.
  workers_.run([self = shared_from_this(), look] { self->take_turn(look); });
}

void EndpointServer::take_turn(ServerLook look) {
  {
    const std::shared_ptr<EndpointImpl> endpoint = endpoint_.lock();
    if (!endpoint) return;  // gone: this job's reference was the last
    t_serving = endpoint.get();
    const bool go_on = endpoint->serve_turn(look);
    t_serving = nullptr;
    if (!go_on) {
      tell_done(*endpoint);
      return;
    }
  }                                // (an endpoint let go meanwhile goes here, on this worker)
  loop_.kick(shared_from_this());  // false once the loop ended: this job's reference was the last
}

}  // namespace rdmabuf
