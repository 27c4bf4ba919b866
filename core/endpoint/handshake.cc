#include "core/endpoint/handshake.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "common/host.h"
#include "common/socket_holder.h"

namespace rdmabuf::endpoint {
namespace {

// The accepting side's read through a new RDMA channel (MessageChannel::
// start_probe) is given up after kRdmaProbeLimit, and kRdmaProbeMargin
// before the handshake's limit, so that its answer still goes out in time.
// A real NIC whose peer is out of reach reports it once its retries run
// out (seconds: backends/ibverbs/queue_pair.cc); Soft-RoCE never does,
// and the limit ends it.
constexpr auto kRdmaProbeLimit = std::chrono::seconds(3);
constexpr auto kRdmaProbeMargin = std::chrono::milliseconds(500);
// How often a handshake looks whether such a read was answered (it has no
// descriptor to wait on), while one is under way.
constexpr auto kProbeLook = std::chrono::milliseconds(1);

// The channels an endpoint's frames may take besides the TCP connection,
// in the order both sides prefer them: each when the manager has a viable
// backend of its transport level. (Manager::backends() is taken once per
// handshake: it asks every backend, and ibverbs opens every device for it.)
struct ChannelKind {
  TransportLevel level;
  const char* none;  // why not, when the manager has no backend of that level
  bool its_backend;  // why not: "its memory backend: ..." (else "ibverbs: ...")
};
constexpr ChannelKind kSharedMemory{TransportLevel::kMemory, "it has no memory backend", true};
constexpr ChannelKind kRdma{TransportLevel::kNic, "it has no RDMA backend", false};
constexpr ChannelKind kPreference[] = {kSharedMemory, kRdma};
static_assert(kPreference[0].level > kPreference[1].level, "the faster channel first");

// Whether a manager whose backends are `backends` may take channel `kind`:
// as far as it is concerned, when one of its backends of that level is
// viable; else why not ("its memory backend: ...").
Status allowed(const ChannelKind& kind, std::span<const BackendInfo> backends) {
  std::string why;
  for (const BackendInfo& backend : backends) {
    if (backend.level != kind.level) continue;
    if (backend.viable) return Status::Ok();
    why += (why.empty() ? "" : "; ") +
           (kind.its_backend ? "its " + backend.name + " backend" : backend.name) + ": " +
           backend.reason;
  }
  return FailedPrecondition(why.empty() ? std::string(kind.none) : why);
}

std::string this_side(const Status& why) {
  return "this side: " + why.message();
}
std::string the_peer(const std::string& why) {
  if (why.empty()) return "the peer: it gave no reason";
  return "the peer: " + why;
}

// Frames over TCP: why neither channel was taken, each reason said as
// "this side: ..." or "the peer: ...".
ChannelChoice tcp_channel(const std::string& no_shared_memory, const std::string& no_rdma) {
  return ChannelChoice{nullptr, nullptr,
                       "tcp (shared memory: " + no_shared_memory + "; RDMA: " + no_rdma + ")"};
}

// Reads one frame before `deadline`.
Status read_frame(int fd, Deadline deadline, int stop_fd, Frame& type,
                  std::vector<uint8_t>& payload) {
  uint8_t header[kHeaderSize];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, header, sizeof header, deadline, stop_fd));
  const FrameHeader h = read_header(header);
  if (h.size > kMaxPayload) return payload_too_large(h.size);
  type = h.type;
  payload.resize(h.size);
  return recv_exact(fd, payload.data(), h.size, deadline, stop_fd);
}

// Sends one frame before `deadline` (the handshake, before the endpoint's
// threads exist).
Status send_frame(int fd, FrameBuilder&& frame, Deadline deadline, int stop_fd = -1) {
  auto bytes = frame.done();
  return send_exact(fd, bytes.data(), bytes.size(), deadline, stop_fd);
}

Status send_ready(int fd, const Status& status, std::span<const uint8_t> address, Deadline deadline,
                  int stop_fd) {
  return send_frame(fd, channel_ready_frame(status, address), deadline, stop_fd);
}

// The peer's kChannelReady: its address (or nothing), or why it did not
// connect (kFailedPrecondition, "the peer: ...").
Result<std::vector<uint8_t>> read_ready(int fd, Deadline deadline, int stop_fd) {
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, stop_fd, type, payload));
  RDMABUF_ASSIGN_OR_RETURN(ChannelReady ready, decode_channel_ready(type, payload));
  if (!ready.ok) {
    return FailedPrecondition(
        the_peer(std::string(ready.address_or_why.begin(), ready.address_or_why.end())));
  }
  return std::move(ready.address_or_why);
}

// The accepting side: opens the rings the peer offered, when it offered
// some and this manager may use them; else an RDMA channel, when both
// sides may; and says which (or why neither). RDMA taken, the channel is
// not settled yet: `*rdma_pending` (finish_rdma_channel goes on).
Result<ChannelChoice> answer_channels(int fd, EndpointHost& host, Deadline deadline, int stop_fd,
                                      bool* rdma_pending) {
  *rdma_pending = false;
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, stop_fd, type, payload));
  RDMABUF_ASSIGN_OR_RETURN(ChannelOffer offer, decode_channel_offer(type, payload));
  const std::vector<BackendInfo> backends =
      offer.shared_memory || offer.rdma ? host.backends() : std::vector<BackendInfo>();
  // In the order of kPreference: shared memory first; its refusal, said by
  // this side, goes to the peer.
  std::unique_ptr<ShmChannel> shm;
  Status no_shm = offer.shared_memory ? allowed(kSharedMemory, backends) : Status::Ok();
  if (offer.shared_memory && no_shm.ok()) {
    // The pid must be the peer's own before any file of it is opened: else
    // a peer could have this process open another process's descriptors.
    no_shm =
        check_socket_holder(fd, static_cast<pid_t>(offer.pid), static_cast<int>(offer.socket_fd));
  }
  if (offer.shared_memory && no_shm.ok()) {
    ShmChannel::Offer rings{offer.pid,           offer.fd,    offer.socket_fd,
                            offer.pid_namespace, offer.nonce, offer.host_id};
    auto opened = ShmChannel::open(rings);
    no_shm = opened.status();
    if (opened.ok()) shm = std::move(opened).value();
  }
  const std::string shm_why =
      offer.shared_memory ? this_side(no_shm) : the_peer(offer.no_shared_memory);
  // Else RDMA, when both sides may.
  std::unique_ptr<MessageChannel> rdma;
  Status no_rdma = shm || !offer.rdma ? Status::Ok() : allowed(kRdma, backends);
  if (!shm && offer.rdma && no_rdma.ok()) {
    auto opened = host.open_message_channel();
    no_rdma = opened.status();
    if (opened.ok()) rdma = std::move(opened).value();
  }
  ChannelAnswer answer;
  answer.taken = shm ? Taken::kSharedMemory : rdma ? Taken::kRdma : Taken::kTcp;
  if (!no_shm.ok()) answer.no_shared_memory = no_shm.message();
  if (!no_rdma.ok()) answer.no_rdma = no_rdma.message();
  if (rdma) answer.address = rdma->address();
  RDMABUF_RETURN_IF_ERROR(send_frame(fd, channel_answer_frame(answer), deadline, stop_fd));
  if (shm) return ChannelChoice{std::move(shm), nullptr, "shared memory"};
  if (!rdma) return tcp_channel(shm_why, offer.rdma ? this_side(no_rdma) : the_peer(offer.no_rdma));
  // The peer connects to this side's channel, then sends its address: the
  // handshake goes on with finish_rdma_channel() once it came (not waiting
  // here: the listener serves other handshakes meanwhile).
  *rdma_pending = true;
  return ChannelChoice{nullptr, std::move(rdma), shm_why};
}

// The accepting side, its read through the channel answered (`outcome`
// OK) or not: says so to the peer (kChannelReady), and takes the channel
// or TCP.
Result<ChannelChoice> conclude_probe(int fd, ChannelChoice pending, const Status& outcome,
                                     Deadline deadline, int stop_fd) {
  RDMABUF_RETURN_IF_ERROR(send_ready(fd, outcome, {}, deadline, stop_fd));
  if (!outcome.ok()) return tcp_channel(pending.description, this_side(outcome));
  std::string description = pending.rdma->describe();
  return ChannelChoice{nullptr, std::move(pending.rdma), std::move(description)};
}

// The accepting side, once the peer's kChannelReady came: connects
// `pending`'s channel to the peer's and starts a read through it (the
// NICs may not reach each other: connect() looks at addresses alone).
// `*probing` when the read is out (conclude_probe follows once it was
// answered or failed); when it could not connect, says so and gives TCP.
// A malformed address ends the handshake (the peer reads its end, not a
// kChannelReady, so that neither side goes on with a channel the other
// refused).
Result<ChannelChoice> finish_rdma_channel(int fd, ChannelChoice pending, Deadline deadline,
                                          int stop_fd, bool* probing) {
  *probing = false;
  auto ready = read_ready(fd, deadline, stop_fd);
  if (!ready.ok()) {
    if (ready.status().code() != StatusCode::kFailedPrecondition) return ready.status();
    return tcp_channel(pending.description, ready.status().message());
  }
  Status connected = pending.rdma->connect(*ready);
  if (connected.code() == StatusCode::kProtocolError) return connected;
  if (connected.ok()) connected = pending.rdma->start_probe();
  if (!connected.ok()) return conclude_probe(fd, std::move(pending), connected, deadline, stop_fd);
  *probing = true;
  return pending;
}

// Why a handshake whose connection turned readable while this side waited
// for its read through the RDMA channel (when the peer has nothing to
// send) is dropped: the peer left, or broke the protocol.
Status peer_spoke_while_probed(int fd) {
  uint8_t byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return ProtocolError("the peer sent a frame before the RDMA channel was settled");
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    return Unavailable("the connection turned readable with nothing to read");
  }
  return Unavailable("the peer left during the handshake");
}

}  // namespace

Hello my_hello(EndpointHost& host) {
  return {host.identity().manager_id, secure_random_u64() | 1};
}

Status send_hello(int fd, const Hello& mine, Deadline deadline, int stop_fd) {
  return send_frame(fd, hello_frame(mine), deadline, stop_fd);
}

Result<Hello> read_hello(int fd, Deadline deadline, int stop_fd) {
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, stop_fd, type, payload));
  return decode_hello(type, payload);
}

Result<ChannelChoice> offer_channels(int fd, EndpointHost& host, Deadline deadline) {
  const std::vector<BackendInfo> backends = host.backends();
  Status shm_allowed = allowed(kSharedMemory, backends);
  std::unique_ptr<ShmChannel> shm;
  if (shm_allowed.ok()) {
    auto created = ShmChannel::create();
    if (created.ok()) {
      shm = std::move(created).value();
    } else {
      shm_allowed = created.status();
    }
  }
  const Status rdma_allowed = allowed(kRdma, backends);
  ChannelOffer offer;
  offer.shared_memory = shm != nullptr;
  if (shm) {
    const ShmChannel::Offer o = shm->offer();
    offer.pid = o.pid;
    offer.fd = o.fd;
    offer.socket_fd = static_cast<uint32_t>(fd);
    offer.pid_namespace = o.pid_namespace;
    offer.nonce = o.nonce;
    offer.host_id = o.host_id;
  } else {
    offer.no_shared_memory = shm_allowed.message();
  }
  offer.rdma = rdma_allowed.ok();
  if (!offer.rdma) offer.no_rdma = rdma_allowed.message();
  RDMABUF_RETURN_IF_ERROR(send_frame(fd, channel_offer_frame(offer), deadline));
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, -1, type, payload));
  RDMABUF_ASSIGN_OR_RETURN(ChannelAnswer answer, decode_channel_answer(type, payload));
  if ((answer.taken == Taken::kSharedMemory && !shm) ||
      (answer.taken == Taken::kRdma && !rdma_allowed.ok())) {
    return ProtocolError("malformed endpoint channel answer");
  }
  if (answer.taken == Taken::kSharedMemory) {
    return ChannelChoice{std::move(shm), nullptr, "shared memory"};
  }
  const std::string shm_why = shm ? the_peer(answer.no_shared_memory) : this_side(shm_allowed);
  if (answer.taken == Taken::kTcp) {
    return tcp_channel(shm_why,
                       rdma_allowed.ok() ? the_peer(answer.no_rdma) : this_side(rdma_allowed));
  }
  // RDMA: open this side's channel and connect it to the peer's.
  auto opened = host.open_message_channel();
  Status connected = opened.status();
  if (opened.ok()) connected = (*opened)->connect(answer.address);
  // Malformed: no kChannelReady; the peer reads the end (see
  // finish_rdma_channel).
  if (connected.code() == StatusCode::kProtocolError) return connected;
  RDMABUF_RETURN_IF_ERROR(send_ready(
      fd, connected, connected.ok() ? (*opened)->address() : std::vector<uint8_t>(), deadline, -1));
  if (!connected.ok()) return tcp_channel(shm_why, this_side(connected));
  auto ready = read_ready(fd, deadline, -1);
  if (!ready.ok()) {
    if (ready.status().code() != StatusCode::kFailedPrecondition) return ready.status();
    return tcp_channel(shm_why, ready.status().message());
  }
  if (!ready->empty()) return ProtocolError("malformed endpoint channel readiness");
  std::string description = (*opened)->describe();
  return ChannelChoice{nullptr, std::move(opened).value(), std::move(description)};
}

// --- the accepting side --------------------------------------------------------

AcceptingHandshake::AcceptingHandshake(Fd fd, std::string peer, EndpointHost& host, int stop_fd)
    : fd_(std::move(fd)),
      peer_(std::move(peer)),
      host_(&host),
      stop_fd_(stop_fd),
      limit_(Clock::now() + kHandshakeLimit) {}

Result<AcceptingHandshake> AcceptingHandshake::start(Fd fd, std::string peer, EndpointHost& host,
                                                     int stop_fd) {
  AcceptingHandshake h(std::move(fd), std::move(peer), host, stop_fd);
  // Ours first, as the connecting side does: neither waits for the other's.
  h.mine_ = my_hello(host);
  RDMABUF_RETURN_IF_ERROR(send_hello(h.fd(), h.mine_, h.limit_, stop_fd));
  return h;
}

Deadline AcceptingHandshake::wake_at(Deadline now) const {
  return state_ == State::kProbe ? std::min(limit_, now + kProbeLook) : limit_;
}

Status AcceptingHandshake::advance(bool readable, Deadline now) {
  switch (state_) {
    case State::kHello: {
      if (!readable) break;
      RDMABUF_ASSIGN_OR_RETURN(theirs_, read_hello(fd(), limit_, stop_fd_));
      state_ = State::kOffer;
      return Status::Ok();
    }
    case State::kOffer: {
      if (!readable) break;
      bool rdma_pending = false;
      RDMABUF_ASSIGN_OR_RETURN(ChannelChoice answered,
                               answer_channels(fd(), *host_, limit_, stop_fd_, &rdma_pending));
      channel_ = std::move(answered);
      state_ = rdma_pending ? State::kReady : State::kSettled;
      return Status::Ok();
    }
    case State::kReady: {
      if (!readable) break;
      bool probing = false;
      RDMABUF_ASSIGN_OR_RETURN(
          ChannelChoice finished,
          finish_rdma_channel(fd(), std::move(*channel_), limit_, stop_fd_, &probing));
      channel_ = std::move(finished);
      if (probing) {
        // The read's answer goes out with time left before the limit.
        probe_limit_ = std::min(limit_ - kRdmaProbeMargin, Clock::now() + kRdmaProbeLimit);
        state_ = State::kProbe;
      } else {
        state_ = State::kSettled;
      }
      return Status::Ok();
    }
    case State::kProbe: {
      // The peer sends nothing until this side's kChannelReady: its
      // connection readable now has ended, or carries what it must not.
      if (readable) return peer_spoke_while_probed(fd());
      if (now >= limit_) break;
      auto answered = channel_->rdma->probe_answered();
      if (answered.ok() && !*answered && now < probe_limit_) return Status::Ok();
      const Status outcome =
          !answered.ok() ? answered.status()
          : *answered    ? Status::Ok()
                         : Unavailable("the peer's queue pair did not answer a read in time");
      RDMABUF_ASSIGN_OR_RETURN(ChannelChoice concluded, conclude_probe(fd(), std::move(*channel_),
                                                                       outcome, limit_, stop_fd_));
      channel_ = std::move(concluded);
      state_ = State::kSettled;
      return Status::Ok();
    }
    case State::kSettled:
      return Status::Ok();
  }
  if (now >= limit_) return DeadlineExceeded("its handshake's limit passed");
  return Status::Ok();
}

}  // namespace rdmabuf::endpoint
