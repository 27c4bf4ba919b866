// The endpoint's life (creation, closing, breaking), its calls that pass
// handles and tagged writes, and the public Endpoint, PendingReceive and
// PendingSend (rdmabuf/endpoint.h), which forward to EndpointImpl.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/strings.h"
#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// Messages of more than kInlineLimit bytes and up to this size travel in
// parts through a channel; larger ones by a one-sided write. Through the
// shared-memory rings a 64 KiB message has the lower latency (two copies,
// on two cores at once, no system call) and, since the rings are 2 MiB,
// the higher bandwidth in a stream too: 22-24 GB/s against the write's
// 7.8-7.9 on an AMD EPYC host, where the 512 KiB rings had carried a
// stream's 64 KiB messages slower than the write. From 128 KiB on the
// write's single copy carried 1.4-2.4 times the rings' bandwidth, at the
// same or a lower latency. Over an RDMA channel the
// same: parts are SENDs, larger messages one RDMA WRITE into the receive.
// Over TCP, parts while a one-sided write would go over TCP anyway (no RDMA
// backend here): one trip on one connection, rather than a write, its reply
// and a kSent; with an RDMA backend, the NIC moves large messages better
// (and the control connection stays free): only inline messages.
constexpr uint64_t kStreamLimit = 64 * 1024;

uint64_t stream_limit_for(const FrameChannel::Kind& kind, endpoint::EndpointHost& host) {
  if (!std::holds_alternative<endpoint::TcpFrames>(kind)) return kStreamLimit;
  for (const BackendInfo& backend : host.backends()) {
    if (backend.viable && backend.level == TransportLevel::kNic) return endpoint::kInlineLimit;
  }
  return kStreamLimit;
}

FrameChannel::Kind kind_of(endpoint::ChannelChoice& choice, int socket) {
  if (choice.shm) return endpoint::ShmFrames(std::move(choice.shm));
  if (choice.rdma) return endpoint::RdmaFrames(std::move(choice.rdma));
  return endpoint::TcpFrames(socket);
}

}  // namespace

// --- life -------------------------------------------------------------------

EndpointImpl::EndpointImpl(endpoint::EndpointHost& host, Fd fd, FrameChannel::Kind kind,
                           uint64_t stream_limit, std::string channel, std::string peer,
                           const endpoint::Hello& mine, const endpoint::Hello& theirs, Fd stop,
                           Fd wake, Fd sends_wake, Fd events)
    : host_(host),
      fd_(std::move(fd)),
      channel_(std::move(kind), fd_.get(), stream_limit, std::move(channel)),
      stop_(std::move(stop)),
      wake_(std::move(wake)),
      sends_wake_(std::move(sends_wake)),
      events_(std::move(events)),
      peer_(std::move(peer)),
      peer_manager_id_(theirs.manager_id),
      notice_key_(mine.notice_key),
      peer_notice_key_(theirs.notice_key) {
  reading_.in = std::make_unique<uint8_t[]>(endpoint::kInCapacity);
  host_.notice_routes().add(notice_key_, this);
}

Status EndpointImpl::start_serving(const std::shared_ptr<EndpointImpl>& endpoint) {
  RDMABUF_ASSIGN_OR_RETURN(EventLoop * loop, endpoint->host_.endpoint_loop());
  Fd events(::fcntl(endpoint->events_.get(), F_DUPFD_CLOEXEC, 0));  // the server's own
  if (!events.valid()) return ResourceExhausted("dup: " + errno_text(errno));
  endpoint->served_out_ = false;  // before the loop can run the server
  std::shared_ptr<EndpointServer> server =
      EndpointServer::start(endpoint, std::move(events), *loop, endpoint->host_.endpoint_workers());
  if (!server) {
    endpoint->served_out_ = true;
    return Cancelled("the manager is shutting down");
  }
  endpoint->server_task_ = server;
  return Status::Ok();
}

Result<std::shared_ptr<EndpointImpl>> EndpointImpl::create(endpoint::EndpointHost& host, Fd fd,
                                                           endpoint::ChannelChoice choice,
                                                           std::string peer,
                                                           const endpoint::Hello& mine,
                                                           const endpoint::Hello& theirs) {
  RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
  RDMABUF_ASSIGN_OR_RETURN(Fd wake, make_eventfd());
  RDMABUF_ASSIGN_OR_RETURN(Fd sends_wake, make_eventfd());
  Fd events(::epoll_create1(EPOLL_CLOEXEC));
  if (!events.valid()) return Internal("epoll_create1: " + errno_text(errno));
  // The endpoint's server watches `stop` and `wake` (level), and the socket
  // and the RDMA channel's wakeups (one-shot, armed: watch_socket()).
  const int wakeups = choice.rdma ? choice.rdma->wakeup_fd() : -1;
  for (int watched : {stop.get(), wake.get(), fd.get(), wakeups}) {
    if (watched < 0) continue;
    epoll_event e{};
    e.events = watched == fd.get() || watched == wakeups ? EPOLLIN | EPOLLONESHOT : EPOLLIN;
    e.data.fd = watched;
    if (::epoll_ctl(events.get(), EPOLL_CTL_ADD, watched, &e) != 0) {
      return Internal("epoll_ctl: " + errno_text(errno));
    }
  }
  std::string description = std::move(choice.description);
  FrameChannel::Kind kind = kind_of(choice, fd.get());
  const uint64_t stream_limit = stream_limit_for(kind, host);
  auto endpoint = std::make_shared<EndpointImpl>(
      host, std::move(fd), std::move(kind), stream_limit, std::move(description), std::move(peer),
      mine, theirs, std::move(stop), std::move(wake), std::move(sends_wake), std::move(events));
  RDMABUF_RETURN_IF_ERROR(start_serving(endpoint));
  return endpoint;
}

// No step of the server is under way (each holds the endpoint), and none
// starts: the server lets go of its loop.
EndpointImpl::~EndpointImpl() {
  close(Cancelled("the endpoint was closed"), /*wait_for_server=*/false);
  EndpointServer::release(server_task_);
}

void EndpointImpl::close(const Status& why, bool wait_for_server) {
  host_.notice_routes().remove(notice_key_);  // no notice, and no look, comes in after this
  break_with(why);
  wait_for_looks();  // those under way end: the endpoint is broken
  // Broken, the server soon takes its last turn (its stop_ watch fired),
  // which delivers what was read before: waited for with no lock held (a
  // handler in that turn may close this endpoint too). Not where it might
  // not come: inside one of the server's steps (a handler closing its own
  // endpoint), or on any loop's thread (a transfer's on_done; the server's
  // loop, or another's whose on_done waits for this one). The turn then
  // still runs later, while the endpoint lives.
  if (wait_for_server && !EndpointServer::serving(this) && !EventLoop::on_a_loop_thread()) {
    std::unique_lock served(served_mu_);
    served_cv_.wait(served, [&] { return served_out_; });
  }
  {
    std::lock_guard join(join_mu_);  // a second close waits for the first's joins
    std::thread lease_keeper;
    {
      std::lock_guard threads(threads_mu_);
      joined_ = true;
      lease_keeper.swap(lease_keeper_);
    }
    if (lease_keeper.joinable()) lease_keeper.join();
    // Loans made while no lease keeper ran yet (one starts with the first)
    // are reclaimed here, before a second close may return: broken, it
    // releases every loan and returns.
    keep_leases();
  }
  cancel_writes();
}

Status EndpointImpl::usable() {
  StateLock lock(mu_);
  return broken_;
}

bool EndpointImpl::stopping() {
  StateLock lock(mu_);
  return !broken_.ok();
}

void EndpointImpl::break_with(const Status& why) {
  {
    StateLock lock(mu_);  // also the frames lock of channels whose writes never wait
    if (broken_.ok()) {
      broken_ = why;
      // Closed on this side: the peer reads every frame written before the
      // end, which over RDMA may still be on its way.
      if (why.code() == StatusCode::kCancelled) channel_.drain(endpoint::kDrainLimit);
    }
  }
  signal_eventfd(stop_.get());
  ::shutdown(fd_.get(), SHUT_RDWR);  // the peer sees the end at once
  cv_.notify_all();
  leases_cv_.notify_all();
}

void EndpointImpl::fail_reading(Status st) {
  if (st.code() != StatusCode::kProtocolError && st.code() != StatusCode::kCancelled &&
      st.code() != StatusCode::kResourceExhausted) {
    st = Unavailable("the peer closed the endpoint (" + st.message() + ")");
  }
  break_with(st);
}

Result<EndpointImpl::AwaitedReply> EndpointImpl::call(Frame type, endpoint::Request request,
                                                      std::chrono::milliseconds timeout) {
  WaitDeadline deadline(timeout);
  {
    StateLock lock(mu_);
    RDMABUF_RETURN_IF_ERROR(broken_);
    request.id = next_request_++;
    replies_[request.id] = AwaitedReply{};
  }
  const uint64_t id = request.id;
  Status sent = write_frame(endpoint::request_frame(type, request));
  StateLock lock(mu_);
  if (sent.ok()) {
    await(lock, deadline, [&] { return replies_[id].arrived || !broken_.ok(); });
  }
  AwaitedReply reply = std::move(replies_[id]);
  replies_.erase(id);  // a late reply is then ignored
  if (!sent.ok()) return sent;
  if (!reply.arrived) {
    return broken_.ok() ? DeadlineExceeded("the peer did not answer in time") : broken_;
  }
  if (!reply.status.ok()) return reply.status;
  return reply;
}

// --- writes with notifications, handles ---------------------------------------

Status EndpointImpl::write(const RemoteBuffer& dst, const LocalMemory& src, uint32_t tag,
                           std::chrono::milliseconds timeout) {
  if (!dst.valid() || dst.owner().manager_id != peer_manager_id_) {
    return InvalidArgument("a tagged write goes into a buffer of the endpoint's peer; " +
                           (dst.valid() ? dst.describe() : std::string("an empty handle")) +
                           " is not one");
  }
  RDMABUF_RETURN_IF_ERROR(usable());
  bool notice_sent = false;
  RDMABUF_RETURN_IF_ERROR(
      host_.write_noticed(dst, src, WriteNotice{tag, peer_notice_key_}, timeout, notice_sent));
  if (notice_sent) return Status::Ok();  // the backend sent it behind the bytes
  return write_frame(endpoint::notify_frame(
      {tag, dst.id(), dst.offset(), std::min<uint64_t>(src.size(), dst.size())}));
}

Status EndpointImpl::send_buffer(const RemoteBuffer& buffer) {
  if (!buffer.valid()) return InvalidArgument("cannot send an empty handle");
  RDMABUF_RETURN_IF_ERROR(usable());
  return write_frame(endpoint::buffer_frame(buffer.to_bytes()));
}

Result<RemoteBuffer> EndpointImpl::receive_buffer(std::chrono::milliseconds timeout) {
  return take_next(remote_buffers_, timeout, "no handle came in time");
}

// --- Endpoint ---------------------------------------------------------------

Endpoint::Endpoint(std::shared_ptr<EndpointImpl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() {
  close();
}

Status Endpoint::send(const LocalMemory& message, std::chrono::milliseconds timeout) {
  uint64_t id;
  Status posted = impl_->post_send(message, timeout, id);
  if (id == endpoint::SendQueue::kRefused || id == endpoint::SendQueue::kAnswered) return posted;
  return impl_->wait_send(id, timeout);
}

Result<PendingSend> Endpoint::post_send(const LocalMemory& message) {
  uint64_t id;
  Status posted = impl_->post_send(message, impl_->host().config().default_timeout, id);
  if (id == endpoint::SendQueue::kRefused) return posted;
  if (id == endpoint::SendQueue::kAnswered) return PendingSend(std::move(posted));
  return PendingSend(impl_, id);
}

Result<uint64_t> Endpoint::receive(const LocalMemory& into, std::chrono::milliseconds timeout) {
  RDMABUF_ASSIGN_OR_RETURN(uint64_t seq, impl_->post_receive(into));
  return impl_->wait_receive(seq, timeout);
}

Result<PendingReceive> Endpoint::post_receive(const LocalMemory& into) {
  RDMABUF_ASSIGN_OR_RETURN(uint64_t seq, impl_->post_receive(into));
  return PendingReceive(impl_, seq);
}

void PendingReceive::withdraw() {
  endpoint_->abandon_receive(seq_);
}

Result<uint64_t> PendingReceive::wait(std::chrono::milliseconds timeout) {
  if (!endpoint_) return FailedPrecondition("this receive was waited for already");
  auto endpoint = std::move(endpoint_);
  return endpoint->wait_receive(seq_, timeout);
}

void PendingSend::cancel() {
  endpoint_->wait_send(id_, std::chrono::milliseconds(0)).ignore();
}

Status PendingSend::wait(std::chrono::milliseconds timeout) {
  if (waited_) return FailedPrecondition("this send was waited for already");
  waited_ = true;
  if (!endpoint_) return std::move(done_);
  auto endpoint = std::move(endpoint_);
  return endpoint->wait_send(id_, timeout);
}

Status Endpoint::write(const RemoteBuffer& dst, const LocalMemory& src, uint32_t tag,
                       std::chrono::milliseconds timeout) {
  return impl_->write(dst, src, tag, timeout);
}

Result<Lease> Endpoint::request_remote_buffer(uint64_t size, std::chrono::milliseconds lease,
                                              std::chrono::milliseconds timeout) {
  return impl_->request_remote_buffer(size, lease, timeout);
}

Result<std::chrono::milliseconds> Endpoint::renew(const RemoteBuffer& lent,
                                                  std::chrono::milliseconds lease,
                                                  std::chrono::milliseconds timeout) {
  return impl_->renew(lent, lease, timeout);
}

Status Endpoint::send_buffer(const RemoteBuffer& buffer, std::chrono::milliseconds /*timeout*/) {
  return impl_->send_buffer(buffer);
}

Result<RemoteBuffer> Endpoint::receive_buffer(std::chrono::milliseconds timeout) {
  return impl_->receive_buffer(timeout);
}

Result<LocalMemory> Endpoint::receive_local_buffer(std::chrono::milliseconds timeout) {
  return impl_->receive_local_buffer(timeout);
}

std::string Endpoint::peer() const {
  return impl_->peer();
}

std::string Endpoint::channel() const {
  return impl_->channel();
}

void Endpoint::close() {
  impl_->close(Cancelled("the endpoint was closed"));
}

}  // namespace rdmabuf
