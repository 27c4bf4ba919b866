#include "core/endpoint/server.h"

#include <sys/epoll.h>

#include <cerrno>

#include "common/log.h"
#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {

bool EndpointServer::start(EndpointImpl& endpoint, EventLoop& loop, WorkerPool& workers) {
  return loop.kick(std::make_shared<EndpointServer>(endpoint, loop, workers));
}

EndpointServer::~EndpointServer() {
  endpoint_.served_out();
}

void EndpointServer::on_run(EventLoop& loop) {
  if (in_turn_) {  // the only kick while a worker has it: its turn ended
    in_turn_ = false;
    loop.quiet();  // re-arming a wait is no activity to spin after
    wait(loop);
    return;
  }
  epoll_event events[4];
  int woken = ::epoll_wait(endpoint_.server_events(), events, 4, 0);
  if (woken < 0 && errno == EINTR) woken = 0;
  if (woken == 0 && Clock::now() < look_at_ && look_at_ != Deadline::max()) {
    loop.wake_at(shared_from_this(), look_at_);  // early: the look's time has not come
    loop.quiet();
    return;
  }
  if (woken == 0 && look_at_ == Deadline::max()) {
    loop.quiet();  // nothing came after all (another waiter took it): wait on
    return;
  }
  after_wait(loop, woken);
}

void EndpointServer::wait(EventLoop& loop) {
  const int ms = endpoint_.server_wait();
  if (ms == EndpointImpl::kNoWait) {
    look_at_ = Deadline::max();
    after_wait(loop, 0);
    return;
  }
  if (!watching_) {
    Status watched = loop.watch(shared_from_this(), endpoint_.server_events(), EPOLLIN);
    if (!watched.ok()) {
      RDMABUF_LOG_ERROR("endpoint: " + watched.to_string());
      after_wait(loop, -1);
      return;
    }
    watching_ = true;
  }
  look_at_ = ms < 0 ? Deadline::max() : Clock::now() + std::chrono::milliseconds(ms);
  loop.wake_at(shared_from_this(), look_at_);
}

void EndpointServer::after_wait(EventLoop& loop, int woken) {
  const ServerLook look = woken < 0 ? ServerLook::kFailed : endpoint_.server_look(woken);
  if (look == ServerLook::kDone) {
    loop.quiet();
    wait(loop);
    return;
  }
  // The rest may block: on a worker, while the loop neither watches (the
  // set stays readable until the turn takes what came) nor times.
  if (watching_) {
    loop.unwatch(endpoint_.server_events());
    watching_ = false;
  }
  look_at_ = Deadline::max();
  in_turn_ = true;
  // A pool that stopped drops the job, and with it this server.
  workers_.run([self = shared_from_this(), look] { self->take_turn(look); });
}

void EndpointServer::take_turn(ServerLook look) {
  if (!endpoint_.serve_turn(look)) return;  // ended: the last reference goes with this job
  loop_.kick(shared_from_this());           // false once the loop ended: so does this server
}

}  // namespace rdmabuf
