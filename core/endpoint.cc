// Endpoints (rdmabuf/endpoint.h): two-sided messages, handles, lent memory
// and notifications over a control connection between two managers; the
// bytes of large messages and of writes move by one-sided ops.
//
// The control connection carries frames: u32 payload length, u8 type, the
// payload (little-endian). Both sides start with kHello. docs/wire-format.md
// has every frame; in short:
//   messages  kPosted (a receive: its seq, capacity and handle; a credit),
//             answered by exactly one of kSent (the message is in the
//             buffer), kSentInline (the message itself, when small),
//             kSentPart (the message itself, in as many frames as it
//             takes, when the channel is the better way for its size; see
//             stream_limit_), kTooLarge (it does not fit; both calls fail)
//             or kNotTaken (nothing was written; after kWithdrawn, the
//             receiver giving up on a receive whose buffer it released
//             already).
//   handles   kBuffer.
//             A receive too large for an inline message registers its
//             memory when it is posted, or, while the messages lately
//             were inline, only once a message needs it: its kPosted then
//             carries no handle, and the sender asks with kHandleWanted,
//             answered by kReceiveHandle (the handle, or why not).
//   lending   kLendRequest -> kLent; kRenew -> kRenewed.
//   writes    kNotify, after the write of a tagged write completed.
//
// After the hellos the connecting side sends kChannelOffer: shared-memory
// rings (core/shm_channel.h) when its manager may use same-host memory, or
// why not; the accepting side answers kChannelAnswer: whether it opened
// them. Accepted, every later frame travels through the rings, and the TCP
// connection carries only doorbells (one byte each, for a reader that
// sleeps) and, by its end, the peer's.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "common/copy.h"
#include "common/futex_mutex.h"
#include "common/host.h"
#include "common/log.h"
#include "common/ring_queue.h"
#include "common/socket.h"
#include "common/socket_holder.h"
#include "common/strings.h"
#include "common/wire.h"
#include "core/message_parts.h"
#include "core/notifications.h"
#include "core/numbered_slots.h"
#include "core/shm_channel.h"
#include "core/spin_stretch.h"
#include "rdmabuf/endpoint.h"
#include "rdmabuf/manager.h"

namespace rdmabuf {
namespace {

constexpr uint32_t kMagic = 0x50454252;  // "RBEP"
// 2: the channel offer; 3: messages in parts; 4: RDMA channels; 5: notice keys in the hello;
// 6: the offerer's socket in the channel offer
constexpr uint16_t kVersion = 6;
// Messages up to this size travel inside the control frame (one frame, no
// one-sided write): small messages cost one trip, not three.
constexpr uint64_t kInlineLimit = 4096;
// The frames' sizes, and the shape of a message's parts (kSentPart).
using namespace endpoint_wire;  // NOLINT(google-build-using-namespace)
// Messages up to this size travel in parts through the shared-memory
// channel; larger ones by a one-sided write (process_vm_writev on one
// host). Through the rings a 64 KiB message has the lower latency (two
// copies, on two cores at once, no system call) and, since the rings are
// 2 MiB, the higher bandwidth in a stream too: 22-24 GB/s against the
// write's 7.8-7.9 on an AMD EPYC host, where the 512 KiB rings had carried
// a stream's 64 KiB messages slower than the write (docs/performance.md,
// twenty-first session). From 128 KiB on the write's single copy carried
// 1.4-2.4 times the rings' bandwidth, at the same or a lower latency
// (docs/performance.md, "Messages over endpoints").
constexpr uint64_t kShmStreamLimit = 64 * 1024;
// Over an RDMA channel, messages up to this size travel in parts (SENDs):
// larger ones by a one-sided RDMA WRITE into the receive, which is
// registered for it.
constexpr uint64_t kRdmaStreamLimit = 64 * 1024;
// Over a TCP channel, messages up to this size travel in parts when a
// one-sided write would go over TCP anyway (no RDMA backend here): one
// trip on one connection, rather than a write, its reply and a kSent.
constexpr uint64_t kTcpStreamLimit = 64 * 1024;
// Frames other than messages up to this many payload bytes are taken from
// the shared ring where they lie, through a copy on the stack (credits,
// answers, notifications); larger ones (handles) through the read buffer.
constexpr size_t kSmallFrame = 256;
// Handles passed (kBuffer) and not yet taken by receive_buffer: beyond this
// the peer is flooding us and the endpoint is closed.
constexpr size_t kMaxQueuedBuffers = 4096;
// Credits held back (hold_credit) go at once when their frames reach this
// many bytes: about 170 receives' worth.
constexpr size_t kMostHeldBack = 4096;
// How long a withdrawn receive waits for the sender's answer before the
// endpoint is closed (then nobody can tell whether the message landed).
constexpr auto kWithdrawGrace = std::chrono::seconds(5);
// How long closing an endpoint waits for its last frames to reach the peer
// (RDMA channel).
constexpr auto kDrainLimit = std::chrono::milliseconds(500);
// A peer that does not read its control frames for this long is dropped.
constexpr auto kFrameWriteLimit = std::chrono::seconds(10);
// How long a connection accept() took may take over its handshake (the
// hellos and the channel offer), so that a silent client cannot hold
// accept() for the caller's whole timeout.
constexpr auto kHandshakeLimit = std::chrono::seconds(5);
// The accepting side's read through a new RDMA channel (MessageChannel::
// start_probe) is given up after kRdmaProbeLimit, and kRdmaProbeMargin
// before the handshake's limit, so that its answer still goes out in time.
// A real NIC whose peer is out of reach reports it once its retries run
// out (seconds: backends/ibverbs/queue_pair.cc); Soft-RoCE never does,
// and the limit ends it.
constexpr auto kRdmaProbeLimit = std::chrono::seconds(3);
constexpr auto kRdmaProbeMargin = std::chrono::milliseconds(500);
// How often accept() looks whether such a read was answered (it has no
// descriptor to wait on), while one is under way.
constexpr auto kProbeLook = std::chrono::milliseconds(1);
// Bytes read from the control connection at once: many small frames.
constexpr size_t kInCapacity = 64 * 1024;
static_assert(kInCapacity >= kHeaderSize + kMaxPayload, "a whole frame fits");
// Notifications read but not yet delivered by the endpoint's thread; at
// this many, reading stops until it catches up (backpressure on the writer).
constexpr size_t kMaxPendingNotes = 1024;
// How long after a caller last read the endpoint's thread leaves the
// socket to callers (see "progress" below): kLinger at first, twice as long
// at each look that finds callers read meanwhile, up to kMostLinger. A look
// takes a core from whoever runs there: in the Soft-RoCE VM, where a
// ping-pong's two processes keep both cores busy, a look every kLinger
// held the median 8 B message at 24.5-25.3 us one way against 20.9-21.7
// with looks backing off to 8 ms (16 ms gained nothing more), and its
// 90th percentile at 96-185 us against 47-50 (docs/performance.md). The
// price: a frame that comes just after callers stop reading, while no call
// waits, may wait for the look after next (about 2 * kMostLinger), and so
// may a credit held back (see serve: a look while callers read sends only
// the credits that are due).
constexpr auto kLinger = std::chrono::milliseconds(1);
constexpr auto kMostLinger = std::chrono::milliseconds(8);
constexpr int kLingerMs = static_cast<int>(kLinger.count());  // for epoll_wait
constexpr int kMostLingerMs = static_cast<int>(kMostLinger.count());
// A writer over TCP waiting for the write lock looks at what it may read
// meanwhile: between two looks it yields kLockSpins times, then sleeps
// kLockLook. (Not a timed mutex: ThreadSanitizer does not see its timed
// lock, and reports its unlock.)
constexpr int kLockSpins = 64;
constexpr auto kLockLook = std::chrono::microseconds(200);

enum class Frame : uint8_t {
  kHello = 1,
  kPosted = 2,
  kSent = 3,
  kTooLarge = 4,
  kWithdrawn = 5,
  kNotTaken = 6,
  kSentInline = 7,
  kNotify = 8,
  kLendRequest = 9,
  kLent = 10,
  kRenew = 11,
  kRenewed = 12,
  kBuffer = 13,
  kChannelOffer = 14,
  kChannelAnswer = 15,
  kHandleWanted = 16,
  kReceiveHandle = 17,
  kSentPart = 18,
  kChannelReady = 19,
};

// Bytes in place up to kInPlace, on the heap beyond: a frame being built
// (every frame on the messages' path fits in place), or the credits held
// back to go with the next frame.
template <size_t kInPlace>
class SmallBytes {
 public:
  SmallBytes() = default;
  SmallBytes(const SmallBytes&) = delete;  // data_ may point into in_place_
  SmallBytes& operator=(const SmallBytes&) = delete;
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  operator std::span<const uint8_t>() const { return {data_, size_}; }
  void resize(size_t size) {
    if (size > capacity_) [[unlikely]]
      grow(size);
    size_ = size;
  }
  void append(std::span<const uint8_t> bytes) {
    const size_t at = size_;
    resize(at + bytes.size());
    if (!bytes.empty()) std::memcpy(data_ + at, bytes.data(), bytes.size());
  }
  void clear() { size_ = 0; }

 private:
  // Out of line: resize() is on every frame's path, growing on few.
  [[gnu::noinline]] void grow(size_t size) {
    heap_.resize(std::max(size, 2 * capacity_));
    if (data_ == in_place_.data()) std::memcpy(heap_.data(), in_place_.data(), size_);
    data_ = heap_.data();
    capacity_ = heap_.size();
  }

  std::array<uint8_t, kInPlace> in_place_;
  std::vector<uint8_t> heap_;
  uint8_t* data_ = in_place_.data();  // in_place_, or heap_ once grown
  size_t capacity_ = kInPlace;
  size_t size_ = 0;
};
using FrameBytes = SmallBytes<64>;

// A frame's header: the size of its payload, which follows, and its type.
struct FrameHeader {
  uint32_t size;
  Frame type;
};
// The header in the first kHeaderSize bytes at `at` (a copy, when they lie
// in the shared ring: the peer may write it meanwhile).
// `at`: kHeaderSize bytes (no bounds to check).
inline FrameHeader read_header(const uint8_t* at) {
  uint32_t size;
  std::memcpy(&size, at, sizeof size);
  return {size, static_cast<Frame>(at[sizeof size])};
}
// Writes `header` into the kHeaderSize bytes at `at`.
inline void write_header(uint8_t* at, FrameHeader header) {
  std::memcpy(at, &header.size, sizeof header.size);
  at[sizeof header.size] = static_cast<uint8_t>(header.type);
}

// The head of a kSentInline frame: its header and the receive's seq, which
// the message's `size` bytes follow. Built in place, with no FrameBuilder:
// every small message has one.
using InlineHead = std::array<uint8_t, kHeaderSize + sizeof(uint64_t)>;
inline InlineHead inline_head(uint64_t seq, uint64_t size) {
  InlineHead head;
  write_header(head.data(), {static_cast<uint32_t>(sizeof seq + size), Frame::kSentInline});
  std::memcpy(head.data() + kHeaderSize, &seq, sizeof seq);  // little-endian, as the host
  return head;
}

// Builds a frame: the header, then fields appended with the writer.
class FrameBuilder {
 public:
  explicit FrameBuilder(Frame type) : w_(bytes_), type_(type) {
    bytes_.resize(kHeaderSize);  // written by done(), once the size is known
  }
  FrameBuilder(const FrameBuilder&) = delete;  // w_ refers to bytes_
  FrameBuilder& operator=(const FrameBuilder&) = delete;
  BasicWireWriter<FrameBytes>& fields() { return w_; }
  [[gnu::always_inline]] FrameBuilder& u64(uint64_t v) {
    w_.put<uint64_t>(v);
    return *this;
  }
  // A u16 length, then the bytes.
  FrameBuilder& blob(std::span<const uint8_t> data) {
    w_.put<uint16_t>(static_cast<uint16_t>(data.size()));
    w_.bytes(data.data(), data.size());
    return *this;
  }
  // The frame's bytes, valid while the builder lives; `tail_size` more
  // payload bytes follow them (sent separately, so a message is not copied
  // into the frame).
  std::span<const uint8_t> done(size_t tail_size = 0) {
    write_header(bytes_.data(),
                 {static_cast<uint32_t>(bytes_.size() - kHeaderSize + tail_size), type_});
    return {bytes_.data(), bytes_.size()};
  }

 private:
  FrameBytes bytes_;
  BasicWireWriter<FrameBytes> w_;
  Frame type_;
};

std::span<const uint8_t> text_bytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), std::min<size_t>(text.size(), 1024)};
}

Status payload_too_large(uint32_t size) {
  return ProtocolError("endpoint frame of " + std::to_string(size) + " bytes (at most " +
                       std::to_string(kMaxPayload) + ")");
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
Status send_frame(int fd, FrameBuilder& frame, Deadline deadline, int stop_fd = -1) {
  auto bytes = frame.done();
  return send_exact(fd, bytes.data(), bytes.size(), deadline, stop_fd);
}

// What a side says of itself in its hello.
struct EndpointHello {
  uint64_t manager_id = 0;
  // A fresh random number that names this side's endpoint to its manager's
  // backends: the peer puts it into the notices of its tagged writes
  // (WriteNotice), and a notice without it is not believed.
  uint64_t notice_key = 0;

  static EndpointHello mine(Manager& manager) {
    return {manager.identity().manager_id, secure_random_u64() | 1};
  }
};

// Both sides send a hello (send_hello) and check the other's (read_hello).
// kCancelled when `stop_fd` (-1: none) fires meanwhile, as in the rest of
// the handshake.
Status send_hello(int fd, const EndpointHello& mine, Deadline deadline, int stop_fd = -1) {
  FrameBuilder hello(Frame::kHello);
  hello.fields().put<uint32_t>(kMagic);
  hello.fields().put<uint16_t>(kVersion);
  hello.u64(mine.manager_id).u64(mine.notice_key);
  return send_frame(fd, hello, deadline, stop_fd);
}
Result<EndpointHello> read_hello(int fd, Deadline deadline, int stop_fd = -1) {
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, stop_fd, type, payload));
  WireReader r(payload);
  uint32_t magic = r.get<uint32_t>();
  uint16_t version = r.get<uint16_t>();
  EndpointHello peer;
  peer.manager_id = r.get<uint64_t>();
  peer.notice_key = r.get<uint64_t>();
  if (type != Frame::kHello || magic != kMagic) {
    return ProtocolError("the peer is not an rdmabuf endpoint");
  }
  if (version != kVersion) {
    return ProtocolError("endpoint protocol version " + std::to_string(version) +
                         " (this side speaks " + std::to_string(kVersion) + ")");
  }
  if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint hello");
  return peer;
}

// --- the channel: shared-memory rings when both managers share a host ------------

// Whether a manager whose Manager::backends() are `backends` may move
// endpoint frames through shared memory: as far as it is concerned, when
// its memory backend is viable. (The list is taken once per handshake:
// it asks every backend, and ibverbs opens every device for it.)
Status shared_memory_allowed(std::span<const BackendInfo> backends) {
  for (const BackendInfo& backend : backends) {
    if (backend.name != "memory") continue;
    if (backend.viable) return Status::Ok();
    return FailedPrecondition("its memory backend: " + backend.reason);
  }
  return FailedPrecondition("it has no memory backend");
}

// The same for an RDMA message channel (MessageChannel): when one of its
// RDMA backends is viable. (The channel itself is opened only once the
// peer wants it.)
Status rdma_messages_allowed(std::span<const BackendInfo> backends) {
  std::string why;
  for (const BackendInfo& backend : backends) {
    if (backend.level != TransportLevel::kNic) continue;
    if (backend.viable) return Status::Ok();
    why += (why.empty() ? "" : "; ") + backend.name + ": " + backend.reason;
  }
  return FailedPrecondition(why.empty() ? "it has no RDMA backend" : why);
}

// Opens an RDMA message channel through `manager` (defined after
// EndpointImpl, the Manager's friend, which it asks).
Result<std::unique_ptr<MessageChannel>> open_message_channel(Manager& manager);

// How the frames travel: through one of the two channels, or the TCP
// connection when both are null.
struct Channel {
  std::unique_ptr<ShmChannel> shm;          // shared-memory rings
  std::unique_ptr<MessageChannel> message;  // an RDMA backend's SEND/RECV
  std::string description;                  // Endpoint::channel()
  // The accepting side, RDMA taken, before the channel is settled: which
  // step it waits on; `description` says, meanwhile, why not shared memory.
  enum class Waiting : uint8_t {
    kNothing,  // settled
    kReady,    // the peer's kChannelReady (finish_rdma_channel)
    kProbe,    // its read through the channel answered (conclude_probe)
  };
  Waiting waiting = Waiting::kNothing;
};

// What a channel offer's answer took.
enum class Taken : uint8_t { kTcp = 0, kSharedMemory = 1, kRdma = 2 };

// Frames over TCP: why neither channel was taken, each reason said as
// "this side: ..." or "the peer: ...".
Channel tcp_channel(const std::string& no_shared_memory, const std::string& no_rdma) {
  return Channel{nullptr, nullptr,
                 "tcp (shared memory: " + no_shared_memory + "; RDMA: " + no_rdma + ")"};
}
std::string this_side(const Status& why) {
  return "this side: " + why.message();
}
std::string the_peer(std::span<const uint8_t> why) {
  if (why.empty()) return "the peer: it gave no reason";
  return "the peer: " + std::string(why.begin(), why.end());
}

// kChannelReady: whether this side connected its RDMA channel (`status`),
// and its address (the connecting side's, when it did) or why not.
Status send_ready(int fd, const Status& status, std::span<const uint8_t> address, Deadline deadline,
                  int stop_fd) {
  FrameBuilder ready(Frame::kChannelReady);
  ready.fields().put<uint8_t>(status.ok() ? 1 : 0);
  ready.blob(status.ok() ? address : text_bytes(status.message()));
  return send_frame(fd, ready, deadline, stop_fd);
}
// The peer's kChannelReady: its address (or nothing), or why it did not
// connect (kFailedPrecondition, "the peer: ...").
Result<std::vector<uint8_t>> read_ready(int fd, Deadline deadline, int stop_fd) {
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, stop_fd, type, payload));
  WireReader r(payload);
  const uint8_t ok = r.get<uint8_t>();
  auto bytes = r.view(r.get<uint16_t>());
  if (type != Frame::kChannelReady || ok > 1 || !r.ok() || r.remaining() != 0) {
    return ProtocolError("malformed endpoint channel readiness");
  }
  if (ok == 0) return FailedPrecondition(the_peer(bytes));
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

// The connecting side: offers shared rings when this manager may use them,
// and an RDMA channel when it may open one; learns which the peer took.
// Over RDMA the two then swap their channels' addresses (kChannelReady each
// way, the connecting side's first), each connecting its queue pair before
// it sends its own: once the second has come, both ends take frames.
Result<Channel> offer_channel(int fd, Manager& manager, Deadline deadline) {
  const std::vector<BackendInfo> backends = manager.backends();
  Status allowed = shared_memory_allowed(backends);
  std::unique_ptr<ShmChannel> shm;
  if (allowed.ok()) {
    auto created = ShmChannel::create();
    if (created.ok()) {
      shm = std::move(created).value();
    } else {
      allowed = created.status();
    }
  }
  const Status rdma_allowed = rdma_messages_allowed(backends);
  FrameBuilder offer(Frame::kChannelOffer);
  if (shm) {
    const ShmChannel::Offer o = shm->offer();
    offer.fields().put<uint8_t>(1);
    offer.fields().put<uint32_t>(o.pid);
    offer.fields().put<uint32_t>(o.fd);
    offer.fields().put<uint32_t>(static_cast<uint32_t>(fd));
    offer.u64(o.pid_namespace).u64(o.nonce).blob(text_bytes(o.host_id));
  } else {
    offer.fields().put<uint8_t>(0);
    offer.blob(text_bytes(allowed.message()));
  }
  offer.fields().put<uint8_t>(rdma_allowed.ok() ? 1 : 0);
  offer.blob(rdma_allowed.ok() ? std::span<const uint8_t>() : text_bytes(rdma_allowed.message()));
  RDMABUF_RETURN_IF_ERROR(send_frame(fd, offer, deadline));
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, -1, type, payload));
  WireReader r(payload);
  const auto taken = static_cast<Taken>(r.get<uint8_t>());
  auto no_shm = r.view(r.get<uint16_t>());
  auto no_rdma = r.view(r.get<uint16_t>());
  auto address = r.view(r.get<uint16_t>());
  if (type != Frame::kChannelAnswer || taken > Taken::kRdma || !r.ok() || r.remaining() != 0 ||
      (taken == Taken::kSharedMemory && !shm) || (taken == Taken::kRdma && !rdma_allowed.ok())) {
    return ProtocolError("malformed endpoint channel answer");
  }
  if (taken == Taken::kSharedMemory) return Channel{std::move(shm), nullptr, "shared memory"};
  const std::string shm_why = shm ? the_peer(no_shm) : this_side(allowed);
  if (taken == Taken::kTcp) {
    return tcp_channel(shm_why, rdma_allowed.ok() ? the_peer(no_rdma) : this_side(rdma_allowed));
  }
  // RDMA: open this side's channel and connect it to the peer's.
  auto opened = open_message_channel(manager);
  Status connected = opened.status();
  if (opened.ok()) connected = (*opened)->connect(address);
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
  return Channel{nullptr, std::move(opened).value(), std::move(description)};
}

// The accepting side: opens the rings the peer offered, when it offered
// some and this manager may use them; else an RDMA channel, when both
// sides may; and says which (or why neither).
Result<Channel> answer_channel(int fd, Manager& manager, Deadline deadline, int stop_fd) {
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, stop_fd, type, payload));
  WireReader r(payload);
  const uint8_t offered = r.get<uint8_t>();
  ShmChannel::Offer offer;
  std::span<const uint8_t> reason;
  if (offered == 1) {
    offer.pid = r.get<uint32_t>();
    offer.fd = r.get<uint32_t>();
    offer.socket_fd = r.get<uint32_t>();
    offer.pid_namespace = r.get<uint64_t>();
    offer.nonce = r.get<uint64_t>();
    auto host = r.view(r.get<uint16_t>());
    offer.host_id.assign(host.begin(), host.end());
  } else {
    reason = r.view(r.get<uint16_t>());
  }
  const uint8_t rdma_offered = r.get<uint8_t>();
  auto rdma_reason = r.view(r.get<uint16_t>());
  if (type != Frame::kChannelOffer || offered > 1 || rdma_offered > 1 || !r.ok() ||
      r.remaining() != 0) {
    return ProtocolError("malformed endpoint channel offer");
  }
  const std::vector<BackendInfo> backends =
      offered == 1 || rdma_offered == 1 ? manager.backends() : std::vector<BackendInfo>();
  // Shared memory first; its refusal, said by this side, goes to the peer.
  std::unique_ptr<ShmChannel> shm;
  Status no_shm = offered == 1 ? shared_memory_allowed(backends) : Status::Ok();
  if (offered == 1 && no_shm.ok()) {
    // The pid must be the peer's own before any file of it is opened: else
    // a peer could have this process open another process's descriptors.
    no_shm =
        check_socket_holder(fd, static_cast<pid_t>(offer.pid), static_cast<int>(offer.socket_fd));
  }
  if (offered == 1 && no_shm.ok()) {
    auto opened = ShmChannel::open(offer);
    no_shm = opened.status();
    if (opened.ok()) shm = std::move(opened).value();
  }
  const std::string shm_why = offered == 1 ? this_side(no_shm) : the_peer(reason);
  // Else RDMA, when both sides may.
  std::unique_ptr<MessageChannel> rdma;
  Status no_rdma = shm || rdma_offered != 1 ? Status::Ok() : rdma_messages_allowed(backends);
  if (!shm && rdma_offered == 1 && no_rdma.ok()) {
    auto opened = open_message_channel(manager);
    no_rdma = opened.status();
    if (opened.ok()) rdma = std::move(opened).value();
  }
  const Taken taken = shm ? Taken::kSharedMemory : rdma ? Taken::kRdma : Taken::kTcp;
  FrameBuilder answer(Frame::kChannelAnswer);
  answer.fields().put<uint8_t>(static_cast<uint8_t>(taken));
  answer.blob(no_shm.ok() ? std::span<const uint8_t>() : text_bytes(no_shm.message()));
  answer.blob(no_rdma.ok() ? std::span<const uint8_t>() : text_bytes(no_rdma.message()));
  answer.blob(rdma ? rdma->address() : std::vector<uint8_t>());
  RDMABUF_RETURN_IF_ERROR(send_frame(fd, answer, deadline, stop_fd));
  if (shm) return Channel{std::move(shm), nullptr, "shared memory"};
  if (!rdma) {
    return tcp_channel(shm_why, rdma_offered == 1 ? this_side(no_rdma) : the_peer(rdma_reason));
  }
  // The peer connects to this side's channel, then sends its address: the
  // caller goes on with finish_rdma_channel() once it came (not waiting
  // here: accept() serves other handshakes meanwhile).
  Channel pending{nullptr, std::move(rdma), shm_why};
  pending.waiting = Channel::Waiting::kReady;
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

// The accepting side, its read through the channel answered (`outcome`
// OK) or not: says so to the peer (kChannelReady), and takes the channel
// or TCP.
Result<Channel> conclude_probe(int fd, Channel pending, const Status& outcome, Deadline deadline,
                               int stop_fd) {
  RDMABUF_RETURN_IF_ERROR(send_ready(fd, outcome, {}, deadline, stop_fd));
  if (!outcome.ok()) return tcp_channel(pending.description, this_side(outcome));
  std::string description = pending.message->describe();
  return Channel{nullptr, std::move(pending.message), std::move(description)};
}

// The accepting side, once the peer's kChannelReady came: connects
// `pending`'s channel to the peer's and starts a read through it (the
// NICs may not reach each other: connect() looks at addresses alone).
// Returns the channel waiting for kProbe (the caller goes on with conclude_probe()
// once the read was answered or failed, serving other handshakes
// meanwhile), or, when it could not connect, says so and gives TCP. A
// malformed address ends the handshake (the peer reads its end, not a
// kChannelReady, so that neither side goes on with a channel the other
// refused).
Result<Channel> finish_rdma_channel(int fd, Channel pending, Deadline deadline, int stop_fd) {
  auto ready = read_ready(fd, deadline, stop_fd);
  if (!ready.ok()) {
    if (ready.status().code() != StatusCode::kFailedPrecondition) return ready.status();
    return tcp_channel(pending.description, ready.status().message());
  }
  Status connected = pending.message->connect(*ready);
  if (connected.code() == StatusCode::kProtocolError) return connected;
  if (connected.ok()) connected = pending.message->start_probe();
  if (!connected.ok()) return conclude_probe(fd, std::move(pending), connected, deadline, stop_fd);
  pending.waiting = Channel::Waiting::kProbe;
  return pending;
}

// The channel frames travel through instead of the TCP connection, when
// one was taken: shared-memory rings, or an RDMA backend's SEND/RECV. The
// endpoint calls the same few functions either way; the rings' are inline
// (the path of messages between two processes on one host), the other's
// behind MessageChannel. Empty: frames travel in the TCP connection.
class RingChannel {
 public:
  RingChannel(std::unique_ptr<ShmChannel> shm, std::unique_ptr<MessageChannel> rdma)
      : shm_(std::move(shm)), rdma_(std::move(rdma)) {}

  explicit operator bool() const { return shm_ || rdma_; }
  bool is_shm() const { return shm_ != nullptr; }
  bool is_rdma() const { return rdma_ != nullptr; }

  // As ShmChannel's (MessageChannel's).
  Result<bool> write_whole(std::span<const uint8_t> first,
                           std::span<const std::span<const uint8_t>> pieces) {
    if (shm_) [[likely]]
      return shm_->write_whole(first, pieces);
    return rdma_->write_whole(first, pieces);
  }
  bool has_incoming() { return shm_ ? shm_->has_incoming() : rdma_->has_incoming(); }
  Result<std::span<const uint8_t>> peek() { return shm_ ? shm_->peek() : rdma_->peek(); }
  void consume(size_t size) {
    if (shm_) [[likely]] {
      shm_->consume(size);
    } else {
      rdma_->consume(size);
    }
  }
  Result<size_t> read_some(uint8_t* out, size_t size) {
    return shm_ ? shm_->read_some(out, size) : rdma_->read_some(out, size);
  }

  // Before a reader sleeps: false when bytes came meanwhile. The rings ask
  // the peer's writer for a doorbell (over the TCP connection); an RDMA
  // channel arms its wakeup_fd().
  bool request_doorbell() { return shm_ ? shm_->request_doorbell() : rdma_->arm_wakeup(); }
  // After a write: whether the peer's reader asked for a doorbell (never
  // over RDMA, whose reader its own NIC wakes).
  bool doorbell_requested() { return shm_ && shm_->doorbell_requested(); }
  // As ShmChannel's; false over RDMA, whose peer's CPU this side cannot see.
  bool peer_waits_on_this_cpu() { return shm_ && shm_->peer_waits_on_this_cpu(); }
  // Over RDMA, the channel's MessageChannel::write_unit(); the rings have
  // none (0).
  size_t write_unit() const { return rdma_ ? rdma_->write_unit() : 0; }
  // Over RDMA, readable once bytes came for an armed reader; else -1.
  int wakeup_fd() const { return rdma_ ? rdma_->wakeup_fd() : -1; }
  // Takes what made wakeup_fd() readable: whether there was any.
  bool take_wakeups() { return rdma_ && rdma_->take_wakeups(); }
  // Before the TCP connection ends: the frames written reach the peer
  // first (RDMA; the rings hold them already). Frames lock held.
  void drain(std::chrono::milliseconds limit) {
    if (rdma_) rdma_->drain(limit);
  }

 private:
  std::unique_ptr<ShmChannel> shm_;
  std::unique_ptr<MessageChannel> rdma_;
};

// How send_in_frames() cuts a message in kSentPart frames, for `ring`'s
// kind of channel (part_shape above).
PartShape part_shape(const RingChannel& ring) {
  return endpoint_wire::part_shape(static_cast<bool>(ring), ring.write_unit());
}

// Over a TCP channel: the size up to which messages travel in parts. Only
// while a one-sided write would copy with the CPU over TCP too: an RDMA
// backend here moves large messages better (the NIC writes them, and the
// control connection stays free).
uint64_t tcp_stream_limit(Manager& manager) {
  for (const BackendInfo& backend : manager.backends()) {
    if (backend.viable && backend.name != "tcp" && backend.name != "memory") return kInlineLimit;
  }
  return kTcpStreamLimit;
}

// The endpoint whose TCP connection this thread is writing, write lock held.
thread_local const EndpointImpl* t_writing_socket = nullptr;

Deadline deadline_after(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

// When a wait on an endpoint gives up: `timeout` after the wait first found
// nothing to take, read from the clock only then. A wait whose answer is
// there already reads no clock (a read costs about 40 ns here: as much as
// the rest of taking a small message).
class WaitDeadline {
 public:
  explicit WaitDeadline(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  Deadline get() {
    if (at_ == Deadline::min()) at_ = deadline_after(timeout_);
    return at_;
  }

 private:
  std::chrono::milliseconds timeout_;
  Deadline at_ = Deadline::min();  // not read yet
};

}  // namespace

class EndpointImpl final : public NoticeTaker {
 public:
  // `events`: an epoll set watching `stop` and `wake` (both level) and `fd`
  // (one-shot, armed) and the RDMA channel's wakeups (the same), made by
  // create(). `mine` and `theirs`: the two hellos.
  EndpointImpl(Manager& manager, Fd fd, Channel channel, std::string peer,
               const EndpointHello& mine, const EndpointHello& theirs, Fd stop, Fd wake,
               Fd sends_wake, Fd events)
      : manager_(manager),
        fd_(std::move(fd)),
        ring_(std::move(channel.shm), std::move(channel.message)),
        channel_(std::move(channel.description)),
        stop_(std::move(stop)),
        wake_(std::move(wake)),
        sends_wake_(std::move(sends_wake)),
        events_(std::move(events)),
        in_(std::make_unique<uint8_t[]>(kInCapacity)),
        peer_(std::move(peer)),
        peer_manager_id_(theirs.manager_id),
        notice_key_(mine.notice_key),
        peer_notice_key_(theirs.notice_key),
        stream_limit_(ring_.is_shm()    ? kShmStreamLimit
                      : ring_.is_rdma() ? kRdmaStreamLimit
                                        : tcp_stream_limit(manager)),
        parts_(part_shape(ring_)) {
    reader_ = std::thread([this] { serve(); });
    lease_keeper_ = std::thread([this] { keep_leases(); });
    manager_.notice_routes().add(notice_key_, this);
  }

  static Result<std::unique_ptr<EndpointImpl>> create(Manager& manager, Fd fd, Channel channel,
                                                      std::string peer, const EndpointHello& mine,
                                                      const EndpointHello& theirs) {
    RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
    RDMABUF_ASSIGN_OR_RETURN(Fd wake, make_eventfd());
    RDMABUF_ASSIGN_OR_RETURN(Fd sends_wake, make_eventfd());
    Fd events(::epoll_create1(EPOLL_CLOEXEC));
    if (!events.valid()) return Internal("epoll_create1: " + errno_text(errno));
    const int wakeups = channel.message ? channel.message->wakeup_fd() : -1;
    for (int watched : {stop.get(), wake.get(), fd.get(), wakeups}) {
      if (watched < 0) continue;
      epoll_event e{};
      e.events = watched == fd.get() || watched == wakeups ? EPOLLIN | EPOLLONESHOT : EPOLLIN;
      e.data.fd = watched;
      if (::epoll_ctl(events.get(), EPOLL_CTL_ADD, watched, &e) != 0) {
        return Internal("epoll_ctl: " + errno_text(errno));
      }
    }
    return std::make_unique<EndpointImpl>(
        manager, std::move(fd), std::move(channel), std::move(peer), mine, theirs, std::move(stop),
        std::move(wake), std::move(sends_wake), std::move(events));
  }

  ~EndpointImpl() { close(Cancelled("the endpoint was closed")); }

  Manager& manager() const { return manager_; }
  const std::string& peer() const { return peer_; }
  static Result<std::unique_ptr<MessageChannel>> open_message_channel(Manager& manager) {
    return manager.open_message_channel();
  }
  const std::string& channel() const { return channel_; }

  void close(const Status& why) {
    manager_.notice_routes().remove(notice_key_);  // no notice, and no look, comes in after this
    break_with(why);
    wait_for_looks();  // those under way end: the endpoint is broken
    {
      std::lock_guard join(join_mu_);
      if (reader_.joinable()) reader_.join();
      if (lease_keeper_.joinable()) lease_keeper_.join();
    }
    cancel_writes();
  }

  // --- messages: sends ----------------------------------------------------------
  //
  // Posted sends take the peer's credits in the order they were posted. A
  // matched send that frames answer (an inline message, one in parts, or
  // kTooLarge) is done once they are written. A larger message asks for the
  // receive's handle when its credit came without one, then is a one-sided
  // write submitted without waiting, then a kSent frame. Whoever comes by
  // moves posted sends on (progress_sends): a caller posting or waiting, a
  // caller reading the control channel, or the endpoint's thread, woken by
  // a write that finished. Each step is claimed under mu_, so any number of
  // threads may do so at once.

  // What post_send() set its `id` to when it did not queue the message.
  static constexpr uint64_t kRefused = 0;              // the endpoint is broken: nothing posted
  static constexpr uint64_t kAnswered = ~uint64_t{0};  // its outcome was known at once

  // Posts `message` (see Endpoint::post_send). `write_timeout` bounds its
  // one-sided write. With `id` kAnswered, the outcome (a free credit, and
  // one frame answered it); with kRefused, why nothing was posted; else
  // OK, and `id` is the number of its record for wait_send(). (No Result
  // of a variant to build, test and take apart on every message's path.)
  Status post_send(const LocalMemory& message, std::chrono::milliseconds write_timeout,
                   uint64_t& id) {
    id = kRefused;
    {
      FutexLock lock(mu_);
      RDMABUF_RETURN_IF_ERROR(broken_);
      id = kAnswered;
      if (queued_sends_.empty() && !credits_.empty() && answered_by_frames(message)) {
        Credit credit = credits_.take_front();
        if (ring_ && message.size() <= std::min(kInlineLimit, credit.capacity)) {
          // Into the ring under this hold of mu_ (the ring's frames lock),
          // when it has room now: a small send takes one lock.
          const InlineHead head = inline_head(credit.seq, message.size());
          const std::span<const uint8_t> pieces[] = {
              head, {reinterpret_cast<const uint8_t*>(message.data()), message.size()}};
          bool doorbell = false;
          Result<bool> wrote = try_write_to_ring(pieces, doorbell);
          if (!wrote.ok() || *wrote) {
            lock.unlock();
            if (doorbell) ring_doorbell();
            return wrote.ok() ? Status::Ok() : broke_while_sending(wrote.status());
          }
        }
        lock.unlock();
        return send_in_frames(credit, message);
      }
      id = next_send_++;
      Outgoing& out = sends_.add(id);
      out.message = message;
      out.write_timeout = write_timeout;
      queued_sends_.push_back(id);
    }
    progress_sends();
    return Status::Ok();
  }

  // Waits for posted send `id`; at the deadline, cancels it.
  Status wait_send(uint64_t id, std::chrono::milliseconds timeout) {
    WaitDeadline deadline(timeout);
    FutexLock lock(mu_);
    Outgoing* found = sends_.find(id);
    if (found == nullptr) return FailedPrecondition("this send was waited for already");
    Outgoing& out = *found;  // stays put; only this call erases it
    while (out.stage != Stage::kDone) {
      if (!broken_.ok() || Clock::now() >= deadline.get()) {
        cut_short(lock, id, out);  // (progress_sends does nothing once broken)
        continue;
      }
      if (send_work_ready()) {
        lock.unlock();
        progress_sends();
        lock.lock();
        continue;
      }
      await(lock, deadline,
            [&] { return out.stage == Stage::kDone || !broken_.ok() || send_work_ready(); });
    }
    Status status = std::move(out.status);
    sends_.erase(id);
    return status;
  }

  // --- messages: receives -------------------------------------------------------

  // Posts `into` for the next message: the receive's sequence number, for
  // wait_receive() or abandon_receive().
  Result<uint64_t> post_receive(const LocalMemory& into) {
    // A receive that only inline messages fit needs no registration; a
    // larger one registers now only while the messages lately were too
    // large for a frame (else when the sender asks: kHandleWanted).
    if (into.size() > kInlineLimit && register_when_posted_.load(std::memory_order_relaxed))
        [[unlikely]] {
      RDMABUF_RETURN_IF_ERROR(usable());
      RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer handle, manager_.register_buffer(into));
      const std::vector<uint8_t> handle_bytes = handle.to_bytes();
      return post_receive(into, std::move(handle), handle_bytes);
    }
    return post_receive(into, RemoteBuffer(), {});
  }

  // post_receive() of `into`, with its `handle` (and the handle's bytes)
  // when it was registered, else an empty one.
  [[gnu::always_inline]] Result<uint64_t> post_receive(const LocalMemory& into, RemoteBuffer handle,
                                                       std::span<const uint8_t> handle_bytes) {
    uint64_t seq;
    bool full = false;
    {
      FutexLock lock(mu_);
      if (!broken_.ok()) {
        Status why = broken_;
        lock.unlock();
        if (handle.valid()) manager_.release(handle).ignore();
        return why;
      }
      seq = next_seq_++;
      Receive& posted = waiting_.add(seq);
      posted.into = into;
      if (handle.valid()) posted.handle = std::move(handle);  // a slot starts without one
      // With the next frame, or by a wait (see hold_credit).
      if (ring_) full = hold_credit(seq, into.size(), handle_bytes);  // mu_: the ring's frames lock
    }
    if (!ring_) {
      std::lock_guard lock(write_mu_);
      full = hold_credit(seq, into.size(), handle_bytes);
    }
    if (full) {
      flush().ignore();  // a failure breaks the endpoint: its waits say so
    } else if (serve_sleeping_.load()) {
      signal_eventfd(wake_.get());
    }
    return seq;
  }

  // Waits for the message of receive `seq`: its size. At the deadline the
  // receive is withdrawn (see Endpoint::receive).
  Result<uint64_t> wait_receive(uint64_t seq, std::chrono::milliseconds timeout) {
    WaitDeadline deadline(timeout);
    // Credits held back go now, even when the message is here already, once
    // they are due (credits_due): a receiver that keeps up with a fast
    // sender would otherwise hold them until it falls behind, and the
    // sender would stall meanwhile. Fewer wait for the next frame: one send
    // then carries several.
    if (credits_due()) {
      flush().ignore();  // a failure breaks the endpoint: the wait says so
    }
    FutexLock lock(mu_);
    Receive* waited = waiting_.find(seq);
    if (waited == nullptr || waited->abandoned) {
      return FailedPrecondition("this receive was waited for already");
    }
    Receive& receive = *waited;  // stays put; only this call erases it
    auto answered = [&] { return receive.answered || !broken_.ok(); };
    if (!await(lock, deadline, answered)) {
      // Withdraw: no byte may land once we return. Release first (it waits
      // for a write in flight), then ask the sender what became of it.
      receive.withdrawn = true;  // a handle registered from now on is released
      const RemoteBuffer handle = receive.handle;
      lock.unlock();
      if (handle.valid()) manager_.release(handle).ignore();
      Status withdrawn = write_frame(FrameBuilder(Frame::kWithdrawn).u64(seq).u64(0));
      lock.lock();
      WaitDeadline grace(kWithdrawGrace);
      if (withdrawn.ok() && !await(lock, grace, answered)) {
        lock.unlock();
        break_with(DeadlineExceeded("the peer did not answer a withdrawn receive"));
        lock.lock();
      }
    }
    Status status = std::move(receive.status);
    if (!receive.answered) {
      status = broken_;
      if (status.ok()) status = DeadlineExceeded("no message came in time");
    }
    const uint64_t size = receive.size;
    const RemoteBuffer handle = std::move(receive.handle);
    waiting_.erase(seq);
    lock.unlock();
    if (handle.valid()) manager_.release(handle).ignore();  // NotFound when withdrawn
    if (!status.ok()) return status;
    return size;
  }

  // Gives up receive `seq` without waiting: once this returns, no byte lands
  // in its memory; a message that landed already is dropped.
  void abandon_receive(uint64_t seq) {
    RemoteBuffer handle;
    bool withdraw = false;
    {
      std::lock_guard lock(mu_);
      Receive* receive = waiting_.find(seq);
      if (receive == nullptr || receive->abandoned) return;
      handle = receive->handle;
      withdraw = !receive->answered && broken_.ok();
      if (withdraw) {
        receive->abandoned = true;  // its answer is dropped when it comes
      } else {
        waiting_.erase(seq);
      }
    }
    if (handle.valid()) manager_.release(handle).ignore();
    if (withdraw) write_frame(FrameBuilder(Frame::kWithdrawn).u64(seq).u64(0)).ignore();
  }

  // --- writes with notifications -------------------------------------------------

  Status write(const RemoteBuffer& dst, const LocalMemory& src, uint32_t tag,
               std::chrono::milliseconds timeout) {
    if (!dst.valid() || dst.owner().manager_id != peer_manager_id_) {
      return InvalidArgument("a tagged write goes into a buffer of the endpoint's peer; " +
                             (dst.valid() ? dst.describe() : std::string("an empty handle")) +
                             " is not one");
    }
    RDMABUF_RETURN_IF_ERROR(usable());
    bool notice_sent = false;
    RDMABUF_RETURN_IF_ERROR(
        manager_.write_noticed(dst, src, WriteNotice{tag, peer_notice_key_}, timeout, notice_sent));
    if (notice_sent) return Status::Ok();  // the backend sent it behind the bytes
    FrameBuilder notify(Frame::kNotify);
    notify.fields().put<uint32_t>(tag);
    notify.u64(dst.id()).u64(dst.offset()).u64(std::min<uint64_t>(src.size(), dst.size()));
    return write_frame(notify);
  }

  // --- lending -----------------------------------------------------------------------

  Result<Lease> request_remote_buffer(uint64_t size, std::chrono::milliseconds lease,
                                      std::chrono::milliseconds timeout) {
    if (size == 0) return InvalidArgument("cannot lend 0 bytes");
    if (lease.count() <= 0) return InvalidArgument("a lease must be > 0 ms");
    FrameBuilder request(Frame::kLendRequest);
    RDMABUF_ASSIGN_OR_RETURN(
        Reply reply,
        call(
            request, [&](uint64_t id) { request.u64(id).u64(size).u64(lease.count()); }, timeout));
    RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer buffer, RemoteBuffer::from_bytes(reply.body));
    if (buffer.owner().manager_id != peer_manager_id_ || buffer.size() != size) {
      return ProtocolError("the peer lent a buffer that is not its own or not the size asked");
    }
    return Lease{std::move(buffer), std::chrono::milliseconds(reply.value)};
  }

  Result<std::chrono::milliseconds> renew(const RemoteBuffer& lent, std::chrono::milliseconds lease,
                                          std::chrono::milliseconds timeout) {
    if (!lent.valid() || lent.owner().manager_id != peer_manager_id_) {
      return InvalidArgument("only a buffer the peer lent can be renewed");
    }
    if (lease.count() <= 0) return InvalidArgument("a lease must be > 0 ms");
    FrameBuilder request(Frame::kRenew);
    RDMABUF_ASSIGN_OR_RETURN(
        Reply reply,
        call(
            request, [&](uint64_t id) { request.u64(id).u64(lent.id()).u64(lease.count()); },
            timeout));
    return std::chrono::milliseconds(reply.value);
  }

  // --- handles -----------------------------------------------------------------------

  Status send_buffer(const RemoteBuffer& buffer, std::chrono::milliseconds /*timeout*/) {
    if (!buffer.valid()) return InvalidArgument("cannot send an empty handle");
    RDMABUF_RETURN_IF_ERROR(usable());
    FrameBuilder frame(Frame::kBuffer);
    frame.blob(buffer.to_bytes());
    return write_frame(frame);
  }

  Result<RemoteBuffer> receive_buffer(std::chrono::milliseconds timeout) {
    return take_next(remote_buffers_, timeout, "no handle came in time");
  }

  Result<LocalMemory> receive_local_buffer(std::chrono::milliseconds timeout) {
    return take_next(returned_, timeout, "no lent buffer came back in time");
  }

 private:
  struct Credit {
    uint64_t seq = 0;
    uint64_t capacity = 0;
    RemoteBuffer buffer;  // empty when only inline messages fit
  };
  // A posted send's way: kQueued (waiting for a credit) -> kAskingHandle
  // (when its credit came without a handle) -> kWriting (the one-sided
  // write) -> kDone. kBusy: a thread is writing a frame for it or starting
  // its write, and moves it on next; nobody else touches it meanwhile.
  enum class Stage { kQueued, kAskingHandle, kWriting, kBusy, kDone };
  struct Outgoing {
    LocalMemory message;
    std::chrono::milliseconds write_timeout{0};
    Stage stage = Stage::kQueued;
    Credit credit;            // from kAskingHandle on
    uint64_t request = 0;     // kAskingHandle: the handle request's id
    Transfer write;           // kWriting
    bool write_done = false;  // kWriting: the write finished (its on_done ran)
    Status status;            // kDone

    // As a new one, touching only what may be set (as Receive::reset):
    // an assignment from Outgoing() would zero its every byte first.
    void reset() {
      message = LocalMemory();
      write_timeout = std::chrono::milliseconds(0);
      stage = Stage::kQueued;
      credit.seq = credit.capacity = 0;
      if (credit.buffer.valid()) credit.buffer = RemoteBuffer();
      request = 0;
      write = Transfer();  // moved out by whoever ran it, but for a cut short one
      write_done = false;
      if (!status.ok()) status = Status();
    }
  };

  // Whether the frames the sender writes answer the oldest credit with
  // `message` (lock held): no one-sided write (see send_in_frames).
  bool answered_by_frames(const LocalMemory& message) const {
    return answered_by_frames(message, credits_.front());
  }
  // The same for `message` against `credit`: in frames when it is small
  // enough, or too large for the receive (kTooLarge).
  bool answered_by_frames(const LocalMemory& message, const Credit& credit) const {
    return message.size() <= stream_limit_ || message.size() > credit.capacity;
  }

  // Something for progress_sends() to do (mu_ held).
  bool send_work_ready() const {
    return (!queued_sends_.empty() && !credits_.empty()) || !send_events_.empty();
  }

  // Answers `credit` with frames: kTooLarge when `message` does not fit;
  // else the message itself, in one kSentInline frame when small, or in
  // kSentPart frames cut and written as parts_ says (part_shape).
  Status send_in_frames(const Credit& credit, const LocalMemory& message) {
    const uint64_t size = message.size();
    if (size > credit.capacity) {
      RDMABUF_RETURN_IF_ERROR(
          write_frame(FrameBuilder(Frame::kTooLarge).u64(credit.seq).u64(size)));
      return InvalidArgument("a message of " + std::to_string(size) +
                             " bytes does not fit the receive the peer posted (" +
                             std::to_string(credit.capacity) + " bytes)");
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(message.data());
    if (size <= kInlineLimit) {
      const InlineHead head = inline_head(credit.seq, size);
      const std::span<const uint8_t> pieces[] = {head, {bytes, size}};
      return write_pieces(pieces);
    }
    const int parts_per_write = parts_.parts_per_write;
    std::vector<uint8_t> heads;  // each part's header and fields, back to back
    std::vector<std::span<const uint8_t>> pieces;
    for (uint64_t at = 0; at < size;) {
      heads.clear();
      pieces.clear();
      // Reserved up front: `pieces` points into `heads`.
      heads.reserve(parts_per_write * kPartOverhead);
      for (int i = 0; i < parts_per_write && at < size; ++i) {
        const uint64_t n = std::min(parts_.part_bytes, size - at);
        FrameBuilder part(Frame::kSentPart);
        part.u64(credit.seq).u64(size);
        const std::span<const uint8_t> head = part.done(n);
        heads.insert(heads.end(), head.begin(), head.end());
        pieces.emplace_back(heads.data() + heads.size() - head.size(), head.size());
        pieces.emplace_back(bytes + at, n);
        at += n;
      }
      RDMABUF_RETURN_IF_ERROR(write_pieces(pieces));
    }
    return Status::Ok();
  }

  // Moves posted sends on as far as they go without waiting for the peer:
  // matches queued sends with credits, and takes up the handles that came
  // and the writes that finished. No lock held; blocks only to write frames.
  void progress_sends() {
    FutexLock lock(mu_);
    while (broken_.ok()) {  // once broken, each wait ends its own send
      if (!queued_sends_.empty() && !credits_.empty()) {
        if (send_queued_inline(lock)) continue;
        const uint64_t id = queued_sends_.front();
        queued_sends_.pop_front();
        Outgoing& out = *sends_.find(id);  // queued: its wait has not ended
        out.credit = credits_.take_front();
        if (answered_by_frames(out.message, out.credit)) {
          out.stage = Stage::kBusy;
          lock.unlock();
          Status sent = send_in_frames(out.credit, out.message);
          lock.lock();
          finish(out, std::move(sent));
          continue;
        }
        in_send_[out.credit.seq] = false;  // taken, not withdrawn
        if (out.credit.buffer.valid()) {
          start_write(lock, id, out);
        } else {
          ask_for_handle(lock, id, out);
        }
        continue;
      }
      if (send_events_.empty()) return;
      const uint64_t id = send_events_.front();
      send_events_.pop_front();
      Outgoing* found = sends_.find(id);
      if (found == nullptr) continue;
      Outgoing& out = *found;
      if (out.stage == Stage::kAskingHandle) {
        take_handle(lock, id, out);
      } else if (out.stage == Stage::kWriting && out.write_done) {
        out.stage = Stage::kBusy;
        Transfer write = std::move(out.write);
        lock.unlock();
        Status wrote = write.status();
        write = Transfer();  // its on_done has run: this does not wait
        conclude_write(lock, id, out, std::move(wrote), /*may_retry=*/true);
      }
    }
  }

  // Sends the queued messages at the front that go inline, as far as the
  // credits here reach, up to kMostGathered of them in one write (lock
  // held; let go for the write): over TCP one system call for them all,
  // where a stream of small messages made one each. False when the first
  // queued message does not go inline (larger than kInlineLimit, or than
  // the oldest credit's receive: progress_sends() answers it).
  bool send_queued_inline(FutexLock& lock) {
    constexpr size_t kMostGathered = 16;
    std::array<InlineHead, kMostGathered> heads;
    std::array<std::span<const uint8_t>, 2 * kMostGathered> pieces;
    std::array<Outgoing*, kMostGathered> gathered;
    size_t count = 0;
    while (count < kMostGathered && !queued_sends_.empty() && !credits_.empty()) {
      Outgoing& out = *sends_.find(queued_sends_.front());  // queued: its wait has not ended
      const uint64_t size = out.message.size();
      if (size > kInlineLimit || size > credits_.front().capacity) break;
      queued_sends_.pop_front();
      out.credit = credits_.take_front();
      out.stage = Stage::kBusy;
      heads[count] = inline_head(out.credit.seq, size);
      pieces[2 * count] = heads[count];
      pieces[2 * count + 1] = {reinterpret_cast<const uint8_t*>(out.message.data()), size};
      gathered[count++] = &out;
    }
    if (count == 0) return false;
    lock.unlock();
    Status sent = write_pieces(std::span(pieces.data(), 2 * count));
    lock.lock();
    for (size_t i = 0; i < count; ++i)
      mark_done(*gathered[i], sent);
    announce_done();
    return true;
  }

  // The receiver registers its memory only now that a message needs it:
  // asks for the handle of `out`'s receive (lock held; kAskingHandle after).
  void ask_for_handle(FutexLock& lock, uint64_t id, Outgoing& out) {
    out.stage = Stage::kBusy;
    out.request = next_request_++;
    Reply& slot = replies_[out.request];
    slot.for_send = true;
    slot.send = id;
    const uint64_t seq = out.credit.seq;
    const uint64_t request = out.request;
    lock.unlock();
    // A failure breaks the endpoint: the send's wait says so.
    write_frame(FrameBuilder(Frame::kHandleWanted).u64(request).u64(seq)).ignore();
    lock.lock();
    out.stage = Stage::kAskingHandle;
    // Its event, when the reply came meanwhile, may have been taken (and
    // dropped) while the send was kBusy.
    if (replies_.count(request) != 0 && replies_[request].arrived) send_events_.push_back(id);
    wake_sleepers();
  }

  // The answer to `out`'s handle request came (lock held).
  void take_handle(FutexLock& lock, uint64_t id, Outgoing& out) {
    auto it = replies_.find(out.request);
    if (it == replies_.end() || !it->second.arrived) return;
    Reply reply = std::move(it->second);
    replies_.erase(it);
    Status st = reply.status;
    if (st.ok()) {
      auto buffer = RemoteBuffer::from_bytes(reply.body);
      if (!buffer.ok()) {
        st = buffer.status();
      } else if (buffer->owner().manager_id != peer_manager_id_) {
        st = ProtocolError("the peer sent a receive's handle that is not its own");
      } else {
        out.credit.buffer = std::move(buffer).value();
      }
    }
    if (st.ok()) {
      start_write(lock, id, out);
      return;
    }
    out.stage = Stage::kBusy;
    lock.unlock();
    conclude_write(lock, id, out, std::move(st), /*may_retry=*/true);
  }

  // Submits `out`'s one-sided write into its receive (lock held; kWriting
  // after). The write's on_done reports to send_events_.
  void start_write(FutexLock& lock, uint64_t id, Outgoing& out) {
    out.stage = Stage::kBusy;
    out.write_done = false;
    auto target = out.credit.buffer.slice(0, out.message.size());
    if (!target.ok()) {
      lock.unlock();
      conclude_write(lock, id, out, target.status(), /*may_retry=*/false);
      return;
    }
    std::vector<Op> ops;
    ops.push_back(Op::write(std::move(target).value(), out.message));
    const auto timeout = out.write_timeout;
    lock.unlock();
    Transfer write = manager_.submit(std::move(ops), timeout, [this, id] { write_finished(id); });
    lock.lock();
    out.write = std::move(write);
    out.stage = Stage::kWriting;
    // As in ask_for_handle: a write that finished already may have lost its event.
    if (out.write_done) send_events_.push_back(id);
    wake_sleepers();  // a wait that wants to cut it short may now
  }

  // A send's one-sided write finished (its on_done, on a library thread).
  void write_finished(uint64_t id) {
    bool reading;
    bool serve_waits;
    {
      std::lock_guard lock(mu_);
      Outgoing* out = sends_.find(id);
      if (out == nullptr) return;
      out->write_done = true;
      send_events_.push_back(id);
      reading = reading_;
      serve_waits = role_wanted_.load(std::memory_order_relaxed);
    }
    cv_.notify_all();
    // A caller reading the channel may be asleep on it; so may the
    // endpoint's thread. Either moves the send on. With no caller reading,
    // the thread is woken even between its looks (up to kMostLinger
    // apart): the peer waits for this send's kSent. Not while it waits for
    // the reading caller to give the role back: that caller moves it on.
    if (reading) signal_eventfd(sends_wake_.get());
    if (!reading || (serve_sleeping_.load() && !serve_waits)) signal_eventfd(wake_.get());
  }

  // Ends `out`'s use of its credit, after its write (kBusy, claimed by the
  // caller; no lock held, and held again on return): a kSent frame when
  // `wrote`, else kNotTaken, so that every credit gets its answer. A send
  // whose receive was withdrawn meanwhile then goes back to the front of
  // the queue, for the next receive, when `may_retry`.
  void conclude_write(FutexLock& lock, uint64_t id, Outgoing& out, Status wrote, bool may_retry) {
    const uint64_t seq = out.credit.seq;
    const bool withdrawn = finish_send(seq);
    if (wrote.ok()) {
      Status sent = write_frame(FrameBuilder(Frame::kSent).u64(seq).u64(out.message.size()));
      lock.lock();
      finish(out, std::move(sent));
      return;
    }
    Status answered = write_frame(FrameBuilder(Frame::kNotTaken).u64(seq).u64(0));
    // A receive withdrawn meanwhile refuses the write (NotFound: its buffer
    // is released, perhaps before its withdrawal reached us).
    const bool retry =
        answered.ok() && may_retry && (withdrawn || wrote.code() == StatusCode::kNotFound);
    lock.lock();
    if (retry && broken_.ok()) {
      out.stage = Stage::kQueued;
      out.credit = Credit{};
      queued_sends_.push_front(id);
      wake_sleepers();
      return;
    }
    finish(out, answered.ok() ? wrote.with_context("writing the message into the peer's receive")
                              : answered);
  }

  // `out` is done with `status` (lock held). Its wait may be the reader
  // role's holder, asleep on the channel rather than on cv_: woken too.
  void finish(Outgoing& out, Status status) {
    mark_done(out, std::move(status));
    announce_done();
  }
  void mark_done(Outgoing& out, Status status) {
    out.stage = Stage::kDone;
    out.status = std::move(status);
  }
  // Sends were marked done (mu_ held): wakes their waits, and a reader that
  // sleeps on the channel, whose caller may wait for one of them.
  void announce_done() {
    wake_sleepers();
    if (reading_ && reader_id_ != std::this_thread::get_id()) signal_eventfd(sends_wake_.get());
  }

  // Ends posted send `id` before its time, at its wait's deadline or once
  // the endpoint broke (lock held, and held on return; it may wait a moment
  // for a thread that moves it on). Once kDone, no byte of its message is
  // read any more.
  void cut_short(FutexLock& lock, uint64_t id, Outgoing& out) {
    const Status why = broken_;
    switch (out.stage) {
      case Stage::kQueued:
        queued_sends_.erase(std::find(queued_sends_.begin(), queued_sends_.end(), id));
        finish(out, why.ok() ? DeadlineExceeded("the peer posted no receive in time") : why);
        return;
      case Stage::kBusy:
        ++sleepers_;
        cv_.wait(lock, [&] { return out.stage != Stage::kBusy; });
        --sleepers_;
        return;
      case Stage::kAskingHandle:
        replies_.erase(out.request);  // a late answer is ignored
        out.stage = Stage::kBusy;
        lock.unlock();
        conclude_write(lock, id, out,
                       why.ok() ? DeadlineExceeded("the peer did not send its receive's handle "
                                                   "in time")
                                : why,
                       /*may_retry=*/false);
        return;
      case Stage::kWriting: {
        out.stage = Stage::kBusy;
        Transfer write = std::move(out.write);
        lock.unlock();
        write.cancel();  // from now on the message's memory is not read
        Status wrote = write.status();
        write = Transfer();
        if (!wrote.ok() && why.ok()) wrote = DeadlineExceeded("the write did not finish in time");
        conclude_write(lock, id, out, why.ok() ? wrote : why, /*may_retry=*/false);
        return;
      }
      case Stage::kDone:
        return;
    }
  }

  // Posted sends whose wait has not ended: every one cancelled, so that no
  // write's on_done runs after the endpoint is gone (close()).
  void cancel_writes() {
    std::vector<std::pair<Outgoing*, Transfer>> writes;
    FutexLock lock(mu_);
    sends_.for_each([&writes](uint64_t, Outgoing& out) {
      if (out.stage != Stage::kWriting) return;
      out.stage = Stage::kBusy;
      writes.emplace_back(&out, std::move(out.write));
    });
    lock.unlock();
    for (auto& [out, write] : writes)
      write.cancel();
    lock.lock();
    for (auto& [out, write] : writes) {
      out->write = std::move(write);
      out->stage = Stage::kWriting;  // its wait ends it
    }
    cv_.notify_all();
  }

  // One of our posted receives.
  struct Receive {
    LocalMemory into;
    RemoteBuffer handle;     // `into`, registered, once a message may need it
    bool abandoned = false;  // given up unanswered: drop the answer
    bool withdrawn = false;  // timed out: its memory is not the peer's any more
    bool answered = false;
    Status status;  // kSent: OK; kTooLarge: InvalidArgument; kNotTaken: DeadlineExceeded
    uint64_t size = 0;
    // A message coming in kSentPart frames: its size, and the bytes come.
    uint64_t parts_size = 0;
    uint64_t parts_came = 0;

    // As a new one: lets go of its memory, and touches only what is set
    // (an assignment from Receive() would store every field and take the
    // status' and handle's references apart, on every message's path).
    void reset() {
      into = LocalMemory();
      if (handle.valid()) handle = RemoteBuffer();
      if (!status.ok()) status = Status();
      abandoned = withdrawn = answered = false;
      size = parts_size = parts_came = 0;
    }
  };
  // Memory this side lent to the peer.
  struct Lent {
    LocalMemory memory;
    RemoteBuffer handle;
    Deadline expires;
  };
  // The answer to one of our requests (kLent, kRenewed).
  struct Reply {
    bool for_send = false;  // a send's handle request: its arrival is a send event
    uint64_t send = 0;      // that send's id
    bool arrived = false;
    Status status;
    uint64_t value = 0;  // the lease granted, in ms
    std::vector<uint8_t> body;
  };

  Status usable() {
    std::lock_guard lock(mu_);
    return broken_;
  }

  void break_with(const Status& why) {
    {
      std::lock_guard lock(mu_);  // also the RDMA channel's frames lock
      if (broken_.ok()) {
        broken_ = why;
        // Closed on this side: the peer reads every frame written before
        // the end, which over RDMA may still be on its way.
        if (why.code() == StatusCode::kCancelled) ring_.drain(kDrainLimit);
      }
    }
    signal_eventfd(stop_.get());
    ::shutdown(fd_.get(), SHUT_RDWR);  // the peer sees the end at once
    cv_.notify_all();
    leases_cv_.notify_all();
  }

  bool stopping() {
    std::lock_guard lock(mu_);
    return !broken_.ok();
  }

  // The credits this side sent that the peer has not answered yet: a count
  // for a heuristic, read without a lock. (A moment off, even below 0: the
  // peer may answer a credit before credits_sent_ counts it.)
  int64_t peer_credits() const {
    const int64_t used = credits_used_.load();
    return credits_sent_.load() - used;
  }

  // Whether the credits held back are due now, not with the next frame:
  // once they are as many as the peer still holds (or it holds none). A
  // sender with more credits left than that is not waiting for these: the
  // receive it answers next is an older one. A wait that ends with the
  // credits due sends them (lead), and so does the endpoint's thread at
  // its next look; it sends them all at its first look after callers
  // stopped reading.
  bool credits_due() const {
    return held_credits_.load(std::memory_order_relaxed) >= peer_credits();
  }

  // Whether a wait about to idle (nothing to take, or a look found
  // nothing) sends the credits held back. Through the shared-memory rings,
  // always: a write there is no system call (but for a doorbell to a peer
  // whose reader sleeps), and a credit written while this side idles is
  // off the way of the next message, which would carry it otherwise (44
  // bytes for an 8 B message, not 21: most likely a cache line more from
  // one core to the other; 8 B went one way 12% slower on the host with
  // the credit held, docs/performance.md). Over TCP each write is a system
  // call, over RDMA a SEND the NIC carries (on Soft-RoCE a system call
  // too), so only once due: a receiver that posts its next receive after
  // it answered a message (an echo) holds the credit through its wait,
  // and the next answer carries it, where it went in a write of its own
  // before the wait.
  bool credits_go_when_idle() const { return ring_.is_shm() || credits_due(); }

  // A message or an answer used one of the credits sent (mu_ held, which
  // every change of credits_used_ holds: no read-modify-write).
  void credit_used() {
    credits_used_.store(credits_used_.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
  }

  // Ends the use of a taken credit; true when the receiver withdrew it.
  bool finish_send(uint64_t seq) {
    std::lock_guard lock(mu_);
    auto it = in_send_.find(seq);
    if (it == in_send_.end()) return false;
    bool withdrawn = it->second;
    in_send_.erase(it);
    return withdrawn;
  }

  // Writes a frame; `tail`: the end of its payload, kept apart (a message).
  [[gnu::always_inline]] Status write_frame(FrameBuilder& builder,
                                            std::span<const uint8_t> tail = {}) {
    const std::span<const uint8_t> head = builder.done(tail.size());
    const std::span<const uint8_t> pieces[] = {head, tail};
    return write_pieces(pieces);
  }
  Status write_frame(FrameBuilder&& builder) { return write_frame(builder); }

  // Writes `pieces` (whole frames, together), after the deferred frames.
  // Written by the dispatch of a frame (a reply), they are held, and
  // written once pump() is done (see pump()).
  [[gnu::always_inline]] Status write_pieces(std::span<const std::span<const uint8_t>> pieces) {
    if (pumping_thread_.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
      for (const auto& piece : pieces)
        held_replies_.insert(held_replies_.end(), piece.begin(), piece.end());
      return Status::Ok();
    }
    Status st = ring_ ? write_to_ring(pieces) : write_to_socket(pieces);
    if (st.ok()) return st;
    return broke_while_sending(st);
  }

  // A frame cut short (by `st`) leaves the stream unusable: closes it for
  // both sides. The endpoint's state after (no lock held).
  Status broke_while_sending(const Status& st) {
    break_with(Unavailable("the endpoint broke while sending: " + st.message()));
    return usable();
  }

  // The TCP connection: the frames held back, then `pieces`, in one
  // gathered send (write_mu_ held throughout; while the socket has no room,
  // or another writer holds write_mu_, this thread reads when it may, as a
  // writer to the ring does: the reader role's holder writing the replies
  // it held must not stop reading while a writer waits for room).
  Status write_to_socket(std::span<const std::span<const uint8_t>> pieces) {
    for (int tries = 0; !write_mu_.try_lock(); ++tries) {
      read_while_blocked();
      if (tries < kLockSpins) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kLockLook);
      }
    }
    std::lock_guard lock(write_mu_, std::adopt_lock);
    std::vector<iovec>& gathered = socket_pieces_;
    gathered.clear();
    gathered.push_back({deferred_.data(), deferred_.size()});
    for (const auto& piece : pieces)
      gathered.push_back({const_cast<uint8_t*>(piece.data()), piece.size()});
    t_writing_socket = this;
    Status st = send_gathered(fd_.get(), gathered, Clock::now() + kFrameWriteLimit, stop_.get(),
                              [this] { read_while_blocked(); });
    t_writing_socket = nullptr;
    deferred_sent();
    return st;
  }

  // The credits held back went out (frames lock held).
  void deferred_sent() {
    if (deferred_.empty()) return;
    deferred_.clear();
    has_deferred_.store(false, std::memory_order_relaxed);
    // These counts change under the frames lock alone: no read-modify-write.
    credits_sent_.store(credits_sent_.load(std::memory_order_relaxed) +
                            held_credits_.load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
    held_credits_.store(0, std::memory_order_relaxed);
  }

  // The shared ring: the credits held back, then `pieces`; then a doorbell
  // when the peer's reader asked for one. The frames go in whole or not at
  // all, under mu_ (the ring's frames lock: see write_mu_); while the ring
  // has no room for them, this thread waits without it, and reads
  // meanwhile when it may (wait_for_room): the peer may be waiting for
  // room in the other ring.
  Status write_to_ring(std::span<const std::span<const uint8_t>> pieces) {
    Deadline deadline = Deadline::min();  // read the clock only when the ring is full
    Deadline spin_until;
    while (true) {
      bool doorbell = false;
      Result<bool> wrote = [&] {
        std::lock_guard lock(mu_);
        return try_write_to_ring(pieces, doorbell);
      }();
      RDMABUF_RETURN_IF_ERROR(wrote.status());
      if (*wrote) {
        if (doorbell) ring_doorbell();
        return Status::Ok();
      }
      if (deadline == Deadline::min()) {
        const Deadline now = Clock::now();
        deadline = now + kFrameWriteLimit;
        spin_until = now + busy_poll_;
      }
      RDMABUF_RETURN_IF_ERROR(wait_for_room(spin_until, deadline));
    }
  }

  // Writes the credits held back, then `pieces`, into the ring if it has
  // room for them all now (mu_ held): whether it did. `doorbell`: the
  // peer's reader asked for one; ring_doorbell() once mu_ is free.
  Result<bool> try_write_to_ring(std::span<const std::span<const uint8_t>> pieces, bool& doorbell) {
    RDMABUF_ASSIGN_OR_RETURN(bool wrote, ring_.write_whole(deferred_, pieces));
    if (!wrote) return false;
    deferred_sent();
    doorbell = ring_.doorbell_requested();
    return true;
  }

  void ring_doorbell() {
    const uint8_t bell = 1;
    // A full socket holds doorbells the reader has not taken yet: enough.
    // A broken one shows at the reader.
    (void)::send(fd_.get(), &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  // The outgoing ring is full: the peer reads slower than this side writes.
  // Reads the incoming ring meanwhile when this thread may, then waits a
  // little: without sleeping until `spin_until` (Config::busy_poll after
  // the ring first had no room: a reader that keeps up empties it in tens
  // of microseconds, and a millisecond's sleep would leave it idle for the
  // rest), then a millisecond at a time. Fails when the peer has gone, the
  // endpoint closes, or `deadline` passed.
  Status wait_for_room(Deadline spin_until, Deadline deadline) {
    const Deadline now = Clock::now();
    if (now >= deadline) {
      return DeadlineExceeded("the peer stopped reading the endpoint's frames");
    }
    read_while_blocked();
    pollfd watched[2] = {{fd_.get(), POLLRDHUP, 0}, {stop_.get(), POLLIN, 0}};
    ::poll(watched, 2, now < spin_until ? 0 : 1);
    if (watched[1].revents != 0) return Cancelled("the endpoint was closed");
    if ((watched[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      return Unavailable("connection closed by peer");
    }
    return Status::Ok();
  }

  // A writer blocked on a full channel reads what the peer sent, so that
  // two sides that both write more than their channel holds do not wait on
  // each other for ever: when this thread holds the reader role (and is not
  // inside pump(), whose frame is not taken yet) or the role is free. The
  // dispatch of a frame never writes (its replies are held: write_pieces),
  // so reading needs no lock a writer holds. Replies written after a pump
  // may themselves wait and read; a few levels deep, they only wait.
  void read_while_blocked() {
    constexpr int kMostNested = 4;
    bool took = false;
    {
      std::lock_guard lock(mu_);
      if (reading_) {
        if (reader_id_ != std::this_thread::get_id() ||
            pumping_thread_.load(std::memory_order_relaxed) == reader_id_ ||
            reply_depth_ >= kMostNested) {
          return;
        }
      } else {
        reading_ = true;
        reader_id_ = std::this_thread::get_id();
        took = true;
      }
    }
    bool progressed = false;
    Status st = pump(progressed);
    if (progressed) cv_.notify_all();
    // Replies held back inside a write to the socket: the endpoint's thread
    // takes the role next and writes them.
    const bool replies_wait = took && !held_replies_.empty();
    if (took) give_back_role();
    if (replies_wait) signal_eventfd(wake_.get());
    if (!st.ok()) fail_reading(st);
  }

  // Holds a receive's credit (its kPosted frame) back, to go out with the
  // next frame written, or by flush(): a wait on this endpoint (as
  // credits_go_when_idle and credits_due say), or the endpoint's thread
  // (see serve; at once when it sleeps: the caller wakes it). One
  // write then carries, say, a receive's credit and the message that
  // follows it, or several credits. Frames lock held (see write_mu_). True
  // at kMostHeldBack bytes: the caller flushes them at once.
  // The frame (kPosted: u64 seq, u64 capacity, the handle as a u16-length
  // blob) is written where it waits, with no frame built apart and copied.
  bool hold_credit(uint64_t seq, uint64_t capacity, std::span<const uint8_t> handle) {
    const size_t payload = 2 * sizeof(uint64_t) + sizeof(uint16_t) + handle.size();
    const size_t at = deferred_.size();
    deferred_.resize(at + kHeaderSize + payload);
    uint8_t* out = deferred_.data() + at;
    write_header(out, {static_cast<uint32_t>(payload), Frame::kPosted});
    out += kHeaderSize;
    auto put = [&out](auto value) {  // little-endian, as the host (common/wire.h)
      std::memcpy(out, &value, sizeof value);
      out += sizeof value;
    };
    put(seq);
    put(capacity);
    put(static_cast<uint16_t>(handle.size()));
    if (!handle.empty()) std::memcpy(out, handle.data(), handle.size());
    // Seq_cst, against serve_sleeping_ (see serve); stored only when it was
    // false (an exchange's locked instruction less for all but the first of
    // a batch: 4 KiB streams 2% faster). It changes only under the frames
    // lock, so true here means the store that made it so came before, and
    // the flush that clears it will carry this credit too.
    if (!has_deferred_.load(std::memory_order_relaxed)) has_deferred_.store(true);
    held_credits_.store(held_credits_.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
    return deferred_.size() >= kMostHeldBack;
  }

  // Writes the frames held back, if any.
  Status flush() {
    if (!has_deferred_.load()) return Status::Ok();
    return write_pieces({});
  }

  // Sends a request built by `fill(request id)` and waits for its reply.
  template <typename Fill>
  Result<Reply> call(FrameBuilder& request, Fill fill, std::chrono::milliseconds timeout) {
    WaitDeadline deadline(timeout);
    uint64_t id;
    {
      std::lock_guard lock(mu_);
      RDMABUF_RETURN_IF_ERROR(broken_);
      id = next_request_++;
      replies_[id] = Reply{};
    }
    fill(id);
    Status sent = write_frame(request);
    FutexLock lock(mu_);
    if (sent.ok()) {
      await(lock, deadline, [&] { return replies_[id].arrived || !broken_.ok(); });
    }
    Reply reply = std::move(replies_[id]);
    replies_.erase(id);  // a late reply is then ignored
    if (!sent.ok()) return sent;
    if (!reply.arrived) {
      return broken_.ok() ? DeadlineExceeded("the peer did not answer in time") : broken_;
    }
    if (!reply.status.ok()) return reply.status;
    return reply;
  }

  template <typename T>
  Result<T> take_next(std::deque<T>& queue, std::chrono::milliseconds timeout, const char* late) {
    FutexLock lock(mu_);
    WaitDeadline deadline(timeout);
    if (!await(lock, deadline, [&] { return !queue.empty() || !broken_.ok(); })) {
      return DeadlineExceeded(late);
    }
    if (queue.empty()) return broken_;
    T next = std::move(queue.front());
    queue.pop_front();
    return next;
  }

  // --- progress: whoever waits reads --------------------------------------------------
  //
  // Frames are read and dispatched, in order, by whichever thread holds the
  // reader role (reading_). A caller that waits for the peer (a credit, a
  // message, a reply) takes the role and reads the socket itself, so what it
  // waits for reaches it without a hand-off between threads; other callers
  // follow on cv_ and take the role when it comes free. When no caller has
  // held it since the endpoint's thread last looked (kLinger to kMostLinger
  // before), that thread takes it, woken by epoll: callers that read lately
  // are likely back within microseconds, and the endpoint's thread, woken
  // once, then looks again after kLinger, and less often while callers keep
  // reading (up to kMostLinger), rather than at every frame. So frames
  // nobody waits for (withdrawals, lend requests, notifications) are read
  // at once when callers have been gone a while, within about 2 * kLinger
  // after one short call, and within about 2 * kMostLinger after callers
  // read for several milliseconds (one long wait will do), even while no
  // call waits. Once two looks in a row find the role held with no
  // caller's turn ending between (a long wait, which reads whatever comes),
  // the thread sleeps until that caller gives the role back and wakes it
  // (take_role): an idle endpoint costs no wake-ups. Notifications are
  // queued, and delivered by the endpoint's thread alone, so a handler
  // never runs inside a caller's call.

  // Waits (lock held) until `ready`, reading frames meanwhile; false at the
  // deadline. Spins for Config::busy_poll before it sleeps.
  // The clock is read only while waiting, never between what it waited for
  // coming and the return (a read costs about 40 ns here: as much as the
  // rest of taking a small message).
  template <typename Pred>
  bool await(FutexLock& lock, WaitDeadline& deadline, Pred ready) {
    Deadline spin_until = Deadline::min();  // set once this thread spins
    auto may_lead = [&] { return !reading_ && notes_.size() < kMaxPendingNotes; };
    // A message there already is taken leanly (look_leanly); one that
    // comes while this wait leads, leanly too (lead()).
    if (!ready() && may_lead() && may_look_leanly() && look_leanly(lock, ready)) {
      return true;
    }
    // What we wait for may depend on the credits held back: they go before
    // the wait (as credits_go_when_idle says), unless frames wait in the
    // channel, which may hold it already, and this thread is to read them.
    // Then it takes those first, and sends the credits at a look that
    // finds nothing (lead(), as before the wait), or once due, at the
    // wait's end (lead()) or before a wait for a receive (wait_receive): a
    // receiver behind a fast sender sends one frame of credits every eight
    // 4 KiB messages of a stream, not one a message.
    if (has_deferred_.load() && credits_go_when_idle() && !ready() &&
        !(ring_ && may_lead() && ring_.has_incoming())) {
      lock.unlock();
      flush().ignore();  // a failure breaks the endpoint: ready() says so
      lock.lock();
    }
    bool past_deadline = false;  // as lead() found it
    while (!ready()) {
      if (past_deadline) return false;
      if (may_lead()) {
        reading_ = true;
        reader_id_ = std::this_thread::get_id();
        past_deadline = !lead(lock, deadline, ready);  // its first look still under mu_
        continue;
      }
      const Deadline now = Clock::now();
      if (now >= deadline.get()) return false;
      if (spin_until == Deadline::min()) spin_until = std::min(deadline.get(), now + busy_poll_);
      if (now < spin_until) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      } else {
        ++sleepers_;
        cv_.wait_until(lock, deadline.get(), [&] { return ready() || may_lead(); });
        --sleepers_;
      }
    }
    return true;
  }

  // Whether a look may take frames leanly (Take::kLeanly): through a ring,
  // with nothing of a frame in in_ and no replies held for the reader
  // role's holder to write (pump() writes them). Reader role held, or free
  // and mu_ held (the last holder let go of it under mu_).
  bool may_look_leanly() const { return ring_ && in_begin_ == in_end_ && held_replies_.empty(); }

  // Through a ring, after a look took what it could where it lies: whether
  // a read may find more, for pump() to take or to report (a frame came,
  // or the peer's end, which the read says once the ring is read out).
  // Reader role held.
  bool ring_has_more() { return ring_.has_incoming() || peer_closed_; }

  // A wait's first look at a ring, when it may lead and may_look_leanly()
  // (mu_ held through `lock`, and never let go of while it reads):
  // takes the credits and the first inline message at the ring's front
  // where they lie (take_frames_in_place, Take::kLeanly), and then whether
  // `ready`. Nobody may take the reader role while this thread holds mu_,
  // so it reads without taking it, and without pump()'s bookkeeping for
  // replies, which these frames never write: on every message's path, a
  // wait whose message is there costs one hold of mu_ and this one look.
  // Does what lead() does after a look that took frames (moves posted
  // sends on, wakes the waiters, sends the credits that are due), with
  // `lock` held on return. False when the wait goes on (nothing came,
  // another kind of frame comes first, or reading failed): await's full
  // path follows, and meets that frame, or the failure, again.
  template <typename Pred>
  bool look_leanly(FutexLock& lock, Pred ready) {
    bool progressed = false;
    const Result<bool> took = take_frames_in_place(progressed, lock, Take::kLeanly);
    if (!progressed) return false;
    count_lead();  // as a lead: the endpoint's thread leaves the channel to the callers
    wake_sleepers();
    if (send_work_ready()) {
      lock.unlock();
      progress_sends();
      lock.lock();
    }
    if (!took.ok() || !ready()) return false;
    if (has_deferred_.load(std::memory_order_relaxed) && credits_due()) {
      lock.unlock();
      flush().ignore();  // a failure breaks the endpoint: the caller's next look tells
      lock.lock();
    }
    return true;
  }

  // Wakes the callers asleep on cv_ (in await or cut_short; mu_ held): the state they wait on
  // changed. Costs nothing while none sleeps, as on the message path.
  void wake_sleepers() {
    if (sleepers_ > 0) cv_.notify_all();
  }

  // Reads as the reader role's holder (taken by await, which holds mu_
  // through `lock`) until `ready`, the deadline, the endpoint closing or
  // notifications piling up; then gives the role back. The first look at
  // the channel goes on under mu_ (the messages and credits it takes take
  // it anyway), and the function returns with `lock` held, so that a wait
  // whose message is there takes mu_ once: for the look, the role's return
  // and the caller's own look at what it waited for. False when it stopped
  // at the deadline. Once a look finds nothing it spins for the busy-poll
  // window, then keeps looking, yielding, for as long as stretch_ says the
  // waits before needed, then sleeps on the channel.
  template <typename Pred>
  bool lead(FutexLock& lock, WaitDeadline& deadline, Pred ready) {
    Deadline spin_until = Deadline::min();  // set when a look finds nothing
    Deadline idle_since;                    // that look's time
    Deadline yield_until;                   // spin_until and the stretch (SpinStretch)
    bool core_shared = false;               // a peer may run on this core (relax)
    bool slept = false;                     // since idle_since
    Status st;
    bool in_time = true;
    auto done = [&] { return ready() || notes_.size() >= kMaxPendingNotes; };
    while (true) {
      bool progressed = false;
      // One small message per look (Take::kUpToAMessage): the caller
      // returns with it at once, and the receive it posts next adds its
      // credit to those held back (sent once due, or when a look finds
      // nothing) while the messages behind wait in the ring. Taking all the
      // ring held first (a steady sender's 16 messages) left the sender
      // without credits meanwhile: 4 KiB messages streamed at 1.8 M/s, not
      // 2.3 (docs/performance.md).
      if (may_look_leanly()) {
        // As pump() would take them, without its bookkeeping for replies
        // (see look_leanly); what it stops at, pump() takes.
        Result<bool> took = take_frames_in_place(progressed, lock, Take::kLeanly);
        st = took.status();
        if (st.ok() && !*took && ring_has_more()) {
          st = pump(progressed, lock, Take::kUpToAMessage);
        }
      } else {
        st = pump(progressed, lock, Take::kUpToAMessage);
      }
      if (!lock.owns_lock()) lock.lock();
      if (st.ok() && send_work_ready()) {
        // Credits came for posted sends, or their writes finished: whatever
        // this caller waits for, the sends go on.
        lock.unlock();
        progress_sends();
        progressed = true;
        lock.lock();
      }
      if (!st.ok() || done()) {
        // A clock read only after a sleep: none between a message that came
        // while spinning and the return (see await). (Or the notifications
        // piled up, or reading failed: rare enough to learn from alike.)
        if (slept) stretch_.learn_from_sleep(Clock::now() - idle_since, busy_poll_);
        break;
      }
      if (progressed) wake_sleepers();
      lock.unlock();
      const Deadline now = Clock::now();
      if (now >= deadline.get()) {
        // The stretch was spent and nothing came: a quiet peer costs a few
        // stretched waits, not a core (not so a deadline inside the window).
        if (spin_until != Deadline::min() && yield_until > spin_until) stretch_.missed();
        in_time = false;
        lock.lock();
        break;
      }
      if (progressed) {
        // Not what this caller waits for (credits, another caller's
        // message): the stretch learns from answers alone (above).
        spin_until = Deadline::min();  // spin afresh
        slept = false;
        continue;
      }
      // Nothing came: the peer may wait for the credits held back (await).
      if (has_deferred_.load() && credits_go_when_idle()) {
        flush().ignore();  // a failure breaks the endpoint: the next pump tells
        continue;
      }
      if (spin_until == Deadline::min()) {
        idle_since = now;
        spin_until = std::min(deadline.get(), now + busy_poll_);
        yield_until = std::min(deadline.get(), spin_until + stretch_.length());
        // The ring hears where this side waits even when one_cpu_ settles it.
        core_shared = ring_.peer_waits_on_this_cpu() || one_cpu_;
      }
      if (now < spin_until) {
        relax(core_shared);
      } else if (now < yield_until) {
        std::this_thread::yield();  // a peer on this core runs meanwhile
      } else {
        slept = true;
        if (!sleep_on_channel(deadline.get())) {
          lock.lock();
          break;  // closing; other outcomes: the next pump tells
        }
      }
    }
    count_lead();
    release_role();  // and wakes a follower, which may lead now
    if (!st.ok()) {
      lock.unlock();
      fail_reading(st);
      lock.lock();
    } else if (has_deferred_.load(std::memory_order_relaxed) && credits_due()) {
      // The messages read may have left the peer with no more credits than
      // are held back: they go now, not with the next frame.
      lock.unlock();
      flush().ignore();  // a failure breaks the endpoint: the caller's next look tells
      lock.lock();
    }
    return in_time;
  }

  // The endpoint's thread takes the reader role if it is free; if not,
  // and `until_released`, its holder's release_role() wakes this thread
  // (role_wanted_).
  bool take_role(bool until_released) {
    std::lock_guard lock(mu_);
    if (reading_) {
      if (until_released) role_wanted_.store(true, std::memory_order_relaxed);
      return false;
    }
    reading_ = true;
    reader_id_ = std::this_thread::get_id();
    return true;
  }

  void give_back_role() {
    std::lock_guard lock(mu_);
    release_role();
  }

  // Gives the reader role back (mu_ held), waking the callers that wait
  // for it or for what was read, and the endpoint's thread when it waits
  // for the role (take_role): after it found the role held, with no
  // caller's turn ending, at two looks in a row (a wait of some 8 to 16 ms
  // or more, an idle endpoint's), so the write comes once a long wait, not
  // once a message.
  void release_role() {
    reading_ = false;
    wake_sleepers();
    if (role_wanted_.load(std::memory_order_relaxed)) [[unlikely]] {
      role_wanted_.store(false, std::memory_order_relaxed);
      signal_eventfd(wake_.get());
    }
  }

  // A caller (or a look for notifications) is done holding the reader role
  // (held still), or took frames in a lean look (look_leanly): counted for
  // led_lately(). Only under mu_, which orders the changes: no
  // read-modify-write.
  void count_lead() {
    leads_.store(leads_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  // Whether a caller held the reader role since the endpoint's thread last
  // asked (it asks every kLinger to kMostLinger while callers lead). Its
  // thread alone.
  bool led_lately() {
    const uint64_t leads = leads_.load(std::memory_order_relaxed);
    if (leads == leads_seen_) return false;
    leads_seen_ = leads;
    return true;
  }

  // Between two looks at the control channel while spinning. A look at the
  // shared ring is a load: spin on it, a CPU pause at a time (about 25 ns
  // here), for as long as a look at everything else would take about ten
  // times over, and stop as soon as bytes come. So for an RDMA channel,
  // whose look polls the receive queue's completions in user space: in the
  // Soft-RoCE VM an 8 B message went one way in 22.4-23.7 us so against
  // 25.3-25.7 with a yield (three interleaved runs each; 4 KiB the same
  // within noise), and the look at the clock between spins (a system call
  // there) came 32 times less often. A look at the socket is a system call,
  // and a yield lets other threads run meanwhile.
  //
  // `core_shared`: the endpoint's maker may run on one CPU alone
  // (one_cpu_), or the peer's reader began its last wait on this thread's
  // CPU (a same-host ring tells). Then the peer runs only when this side
  // lets go of the core, so a wait yields from its first look: with both
  // processes on one CPU an 8 B message went one way through shared
  // memory in 1.6-2.6 µs so, against 204-210 when the wait spun for its
  // whole window (UCX, whose waits spin until the kernel preempts them:
  // 3200-4000).
  void relax(bool core_shared) {
    if (!ring_ || core_shared) {
      std::this_thread::yield();
      return;
    }
#if defined(__x86_64__) || defined(__i386__)
    for (int i = 0; i < 32 && !ring_.has_incoming(); ++i)
      __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  // Sleeps (reader role held) until the control channel may have bytes, or
  // `deadline`; false when the endpoint is closing.
  // Also wakes when a posted send's write finished (sends_wake_).
  bool sleep_on_channel(Deadline deadline) {
    if (ring_ && !ring_.request_doorbell()) return true;  // bytes came meanwhile
    // The RDMA channel's wakeup last (-1, ignored by poll, without one).
    pollfd watched[4] = {{fd_.get(), POLLIN, 0},
                         {stop_.get(), POLLIN, 0},
                         {sends_wake_.get(), POLLIN, 0},
                         {ring_.wakeup_fd(), POLLIN, 0}};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    // An error (EINTR) or the deadline: the caller looks again.
    if (::poll(watched, 4, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30))) > 0) {
      if (watched[1].revents != 0) return false;
      if (watched[2].revents != 0) drain_eventfd(sends_wake_.get());
    }
    if (ring_) take_doorbells();
    return true;
  }

  // Shared-memory or RDMA channel: empties the TCP connection of doorbells
  // (it carries nothing else) and notes its end; over RDMA, takes the
  // channel's wakeups too (as doorbells). Reader role held.
  //
  // One doorbell wakes every sleeper of this side, but a caller may take it
  // before the endpoint's thread, asleep in epoll_wait, has looked: then
  // that thread would sleep on with its request used up, and frames no call
  // waits for would sit in the ring. So a taken doorbell is counted, and
  // the endpoint's thread, when it sleeps, is woken to look again.
  void take_doorbells() {
    uint8_t bells[64];
    bool took = false;
    // At most kMostReads reads a call: a peer that floods the connection
    // (which carries nothing but doorbells) cannot keep the reader here.
    constexpr int kMostReads = 16;
    for (int reads = 0; reads < kMostReads;) {
      ssize_t n = ::recv(fd_.get(), bells, sizeof bells, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        took = true;
        ++reads;
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) peer_closed_ = true;
      break;
    }
    if (ring_.take_wakeups()) took = true;
    if (!took) return;
    doorbells_taken_.fetch_add(1);  // seq_cst, against serve_sleeping_ (see serve)
    // Not when the endpoint's thread waits for the role's holder, which
    // takes the frames this doorbell rang for (and then wakes it).
    if (serve_sleeping_.load() && !role_wanted_.load(std::memory_order_relaxed)) {
      signal_eventfd(wake_.get());
    }
  }

  // Arms the endpoint thread's one-shot watches on the socket and the RDMA
  // channel's wakeups.
  void watch_socket() {
    for (int watched : {fd_.get(), ring_.wakeup_fd()}) {
      if (watched < 0) continue;
      epoll_event e{};
      e.events = EPOLLIN | EPOLLONESHOT;
      e.data.fd = watched;
      ::epoll_ctl(events_.get(), EPOLL_CTL_MOD, watched, &e);
    }
  }

  // How far one pump takes the frames of the shared ring (see lead()).
  enum class Take {
    kAll,           // all it holds
    kUpToAMessage,  // up to the first inline message, leaving those behind
    // As kUpToAMessage, under the caller's hold of mu_ throughout: stops
    // before a frame it would let go of mu_ for (a part, or a frame other
    // than a credit or an inline message). See look_leanly().
    kLeanly,
  };

  // Dispatches every whole frame held, reads the socket once (what it has,
  // up to kInCapacity) and dispatches what came; never blocks. Reader role
  // held. `progressed`: a frame was taken. One read per call, so that the
  // caller looks at what it waits for, and wakes the others, between reads
  // even while a fast sender keeps the socket full. Stops early, leaving
  // frames unread, while kMaxPendingNotes notifications wait for the
  // endpoint's thread, and, with Take::kUpToAMessage, after the first
  // inline message taken from the shared ring.
  // Reads and dispatches what the channel holds (reader role held). The
  // replies the dispatches wrote are held meanwhile and written at the end;
  // inside a write to the TCP connection (whose lock this thread holds),
  // by the next pump instead.
  // `lock`, on mu_, held or not on entry, may be held on return: the
  // frames taken last were messages or credits, taken under it, and the
  // caller's next step is to take it anyway. `take`: how far it takes the
  // frames of the shared ring.
  Status pump(bool& progressed, FutexLock& lock, Take take = Take::kAll) {
    Status st = pump_holding_replies(progressed, lock, take);
    if (held_replies_.empty() || t_writing_socket == this) return st;
    if (lock.owns_lock()) lock.unlock();  // a write may wait, and read meanwhile
    const std::vector<uint8_t> replies = std::move(held_replies_);
    held_replies_.clear();
    const std::span<const uint8_t> pieces[] = {replies};
    ++reply_depth_;
    Status wrote = write_pieces(pieces);
    --reply_depth_;
    return st.ok() ? wrote : st;
  }
  // pump() short of writing the replies: they stay in held_replies_, for
  // the reader role's next holder to write (its pump()). It never waits
  // for room in the channel.
  Status pump_holding_replies(bool& progressed, FutexLock& lock, Take take) {
    pumping_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    Status st = pump_frames(progressed, lock, take);
    pumping_thread_.store(std::thread::id(), std::memory_order_relaxed);
    return st;
  }
  // pump(), returning with mu_ free.
  Status pump(bool& progressed) {
    FutexLock lock(mu_, std::defer_lock);
    return pump(progressed, lock);
  }
  Status pump_frames(bool& progressed, FutexLock& lock, Take take) {
    bool read_once = false;
    if (in_begin_ != in_end_ && lock.owns_lock()) lock.unlock();  // dispatch takes it
    while (true) {
      while (in_end_ - in_begin_ >= kHeaderSize) {
        const auto [size, type] = read_header(in_.get() + in_begin_);
        if (size > kMaxPayload) return payload_too_large(size);
        if (in_end_ - in_begin_ < kHeaderSize + size) break;
        if (type == Frame::kNotify && notes_full()) {
          signal_eventfd(wake_.get());
          return Status::Ok();
        }
        RDMABUF_RETURN_IF_ERROR(
            dispatch(type, std::span<const uint8_t>(in_.get() + in_begin_ + kHeaderSize, size)));
        in_begin_ += kHeaderSize + size;
        progressed = true;
      }
      if (ring_ && in_begin_ == in_end_) {
        RDMABUF_ASSIGN_OR_RETURN(const bool stopped, take_frames_in_place(progressed, lock, take));
        // Stopped after a message, or nothing more came: no read to try
        // (peer_closed_: the read says so).
        if (stopped || !ring_has_more()) return Status::Ok();
      }
      // One read per call; through shared memory, as many as complete the
      // frame begun (receive_some copies one in two: its header, then the
      // rest).
      if (read_once && !(ring_ && in_end_ > in_begin_)) return Status::Ok();
      if (lock.owns_lock()) lock.unlock();  // dispatch takes it
      // Keep what is left of a frame at the front, then read more.
      std::memmove(in_.get(), in_.get() + in_begin_, in_end_ - in_begin_);
      in_end_ -= in_begin_;
      in_begin_ = 0;
      RDMABUF_ASSIGN_OR_RETURN(size_t n, receive_some(in_.get() + in_end_, kInCapacity - in_end_));
      if (n == 0) return Status::Ok();
      in_end_ += n;
      read_once = true;
    }
  }

  // A ring channel (shared memory or RDMA), nothing buffered: takes the
  // frames at the front of the ring where they lie, with no copy through
  // in_. A message (kSentInline, kSentPart) is copied once, ring to
  // receive; any other frame up to kSmallFrame bytes is copied whole onto
  // the stack first (the peer may write the ring meanwhile), then
  // dispatched. Stops at a larger frame, one not whole in one piece, or a
  // notification while the queue is full: pump() copies those. A run of
  // small messages and credits (kPosted), the frames of a steady stream,
  // is taken under one hold of mu_ (`lock`, which it leaves held after
  // them: see pump()).
  // With Take::kUpToAMessage it stops after the first inline message:
  // true then (more may be there), else false. With Take::kLeanly, the
  // same, and it also stops (false) before a part or any frame other than
  // a credit, never letting go of mu_ once it took it.
  Result<bool> take_frames_in_place(bool& progressed, FutexLock& lock, Take take) {
    constexpr size_t kMostFields = 2 * sizeof(uint64_t);
    // A credit without a handle (kPosted: seq, capacity, a handle length of 0).
    constexpr size_t kBareCredit = kMostFields + sizeof(uint16_t);
    uint8_t copy[kHeaderSize + kSmallFrame];
    // Over RDMA, the unread bytes the last peek() gave, less the frames
    // taken since: the next frame is looked for there first, and peek() is
    // called again only when they end (a credit and the message behind it,
    // one SEND, take one peek() through MessageChannel, not two; each frame
    // is still consumed on its own). Bytes a consume() did not give back
    // stay valid (MessageChannel::peek); `stale`: more may have come since.
    // The rings' peek() is inline and cheap, and a credit there is most
    // often a record of its own: each frame peeks afresh (keeping the view
    // cost the shared-memory ping-pong about 25 instructions a round trip).
    const bool keep_view = ring_.is_rdma();
    std::span<const uint8_t> ring;
    bool stale = false;
    while (true) {
      if (ring.size() < kHeaderSize) {
        RDMABUF_ASSIGN_OR_RETURN(ring, ring_.peek());
        stale = false;
        if (ring.size() < kHeaderSize) return false;
      }
      // A copy of the header and fields: the peer may write the ring meanwhile.
      uint8_t head[kHeaderSize + kMostFields];
      if (ring.size() >= sizeof head) {
        std::memcpy(head, ring.data(), sizeof head);
      } else {
        std::memset(head, 0, sizeof head);
        std::memcpy(head, ring.data(), ring.size());
      }
      const auto [size, type] = read_header(head);
      if (size > kMaxPayload) return false;
      if (ring.size() < kHeaderSize + size) {
        if (!stale) return false;
        ring = {};  // peek() again: the rest of the frame may have come
        continue;
      }
      // The fields, in the copy, which holds them all (zeros past the
      // frame): read with no bounds to check.
      auto field = [&head](int i) {
        uint64_t value;  // little-endian, as the host (common/wire.h)
        std::memcpy(&value, head + kHeaderSize + i * sizeof(uint64_t), sizeof value);
        return value;
      };
      if (type == Frame::kSentInline || type == Frame::kSentPart) {
        const size_t fields = type == Frame::kSentPart ? kMostFields : sizeof(uint64_t);
        if (size < fields) return false;  // malformed: pump() says so
        const uint64_t seq = field(0);
        auto data = ring.subspan(kHeaderSize + fields, size - fields);
        if (!lock.owns_lock()) lock.lock();
        if (type == Frame::kSentPart) {
          if (take == Take::kLeanly) return false;  // its copy lets go of mu_
          const uint64_t message_size = field(1);
          if (data.empty()) return false;  // malformed: pump() says so
          RDMABUF_RETURN_IF_ERROR(fill_receive(seq, message_size, data));
          // A part's copy (up to 8 KiB) is the longest hold of mu_: let go
          // after each, so that a long message keeps other callers out
          // for one part at a time, not for all of it.
          lock.unlock();
        } else {
          RDMABUF_RETURN_IF_ERROR(answer_receive(type, seq, data.size(), data));
          if (take != Take::kAll) {
            ring_.consume(kHeaderSize + size);
            progressed = true;
            return true;
          }
        }
      } else {
        if (size > kSmallFrame) return false;
        if (type == Frame::kPosted) {
          Credit credit;
          if (size == kBareCredit) {
            // A receive's credit, on every message's path: taken from the
            // copy of its head, with no copy of its own and no parse.
            credit.seq = field(0);
            credit.capacity = field(1);
            uint16_t handle_size;  // read once, so as good as a copy
            std::memcpy(&handle_size, ring.data() + kHeaderSize + kMostFields, sizeof handle_size);
            if (handle_size != 0) return ProtocolError("malformed endpoint credit");
          } else {
            std::memcpy(copy, ring.data(), kHeaderSize + size);
            RDMABUF_RETURN_IF_ERROR(
                parse_credit(std::span<const uint8_t>(copy + kHeaderSize, size), credit));
          }
          if (!lock.owns_lock()) lock.lock();
          credits_.push_back(std::move(credit));
        } else {
          if (take == Take::kLeanly) return false;  // its dispatch lets go of mu_
          std::memcpy(copy, ring.data(), kHeaderSize + size);
          if (lock.owns_lock()) lock.unlock();
          if (type == Frame::kNotify && notes_full()) return false;  // pump() waits
          RDMABUF_RETURN_IF_ERROR(
              dispatch(type, std::span<const uint8_t>(copy + kHeaderSize, size)));
        }
      }
      ring_.consume(kHeaderSize + size);
      ring = keep_view ? ring.subspan(kHeaderSize + size) : std::span<const uint8_t>();
      stale = true;
      progressed = true;
    }
  }

  // Shared-memory channel: the bytes of the whole frames at the front of
  // `ring` (which starts with a frame) up to the first message that
  // take_frames_in_place() takes where it lies; 0 when none.
  static size_t frames_before_a_message(std::span<const uint8_t> ring) {
    size_t at = 0;
    while (ring.size() - at >= kHeaderSize) {
      uint8_t head[kHeaderSize];
      std::memcpy(head, ring.data() + at, kHeaderSize);  // the peer may write the ring
      const auto [size, type] = read_header(head);
      if (type == Frame::kSentInline || type == Frame::kSentPart) break;
      if (size > kMaxPayload || ring.size() - at - kHeaderSize < size) break;
      at += kHeaderSize + size;
    }
    return at;
  }

  // Shared-memory channel: how many bytes receive_some() may copy out of
  // the ring, so that no frame take_frames_in_place() could take where it
  // lies goes through in_ (twice copied). At a frame's start, the whole
  // frames in front when they are not messages; else the frame in front
  // is one that it could not take (a large frame other than a message, a
  // notification while the queue is full, or one a peer cut across two
  // records, which this version's writers never do): its header, then the
  // rest of it. (Copying up to kInCapacity there took a tenth of a 4 KiB
  // stream's messages through in_, when the rings were bytes that the
  // ring's end cut.) in_ holds only the start of a frame, if any.
  Result<size_t> ring_bytes_to_copy() {
    const size_t have = in_end_ - in_begin_;
    if (have == 0) {
      RDMABUF_ASSIGN_OR_RETURN(std::span<const uint8_t> ring, ring_.peek());
      const size_t before = frames_before_a_message(ring);
      return before > 0 ? before : kHeaderSize;
    }
    if (have < kHeaderSize) return kHeaderSize - have;
    // Its size was checked when its header came (pump_frames).
    const auto [size, type] = read_header(in_.get() + in_begin_);
    return kHeaderSize + size - have;
  }

  // Takes what the control channel holds, up to `size` bytes, without
  // blocking: how many, 0 when it has none. Reader role held. Through
  // shared memory, only the frames that cannot be taken where they lie
  // (ring_bytes_to_copy).
  Result<size_t> receive_some(uint8_t* out, size_t size) {
    if (ring_) {
      RDMABUF_ASSIGN_OR_RETURN(const size_t most, ring_bytes_to_copy());
      RDMABUF_ASSIGN_OR_RETURN(size_t n, ring_.read_some(out, std::min(size, most)));
      // The peer's frames before its end are all in the ring: read them first.
      if (n == 0 && peer_closed_) return Unavailable("connection closed by peer");
      return n;
    }
    while (true) {
      ssize_t n = ::recv(fd_.get(), out, size, MSG_DONTWAIT);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) return Unavailable("connection closed by peer");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
      return Unavailable("recv: " + errno_text(errno));
    }
  }

  // The answer of `type` (kSent, kTooLarge, kNotTaken, kSentInline with
  // `data`) for receive `seq`; `size`: the message's. mu_ held.
  [[gnu::always_inline]] Status answer_receive(Frame type, uint64_t seq, uint64_t size,
                                               std::span<const uint8_t> data) {
    Receive* answered = waiting_.find(seq);
    if (answered == nullptr || answered->answered) {
      return ProtocolError("endpoint answer for receive " + std::to_string(seq) +
                           ", which is not waiting");
    }
    credit_used();
    Receive& receive = *answered;
    if (receive.parts_came != 0) {
      return ProtocolError("endpoint answer for receive " + std::to_string(seq) +
                           ", amid its message's parts");
    }
    if (receive.abandoned) {
      waiting_.erase(seq);  // nobody waits for it; its memory is not ours to fill
      return Status::Ok();
    }
    if ((type == Frame::kSent || type == Frame::kSentInline) && size > receive.into.size()) {
      return ProtocolError("the peer says it sent more than the receive holds");
    }
    receive.answered = true;
    receive.size = size;
    if (type == Frame::kSent || type == Frame::kSentInline) {
      // The next receives register when posted while messages are large.
      register_when_posted_.store(type == Frame::kSent, std::memory_order_relaxed);
    }
    // kSent, kSentInline: the status stays OK, as every receive starts.
    if (type == Frame::kSentInline) {
      // Under the lock: the receive has not returned, so `into` is valid.
      if (size > 0) copy_received(receive.into.data(), data.data(), size);
    } else if (type == Frame::kTooLarge) {
      receive.status = InvalidArgument("the peer's message of " + std::to_string(size) +
                                       " bytes does not fit this receive");
    } else if (type == Frame::kNotTaken) {
      receive.status = DeadlineExceeded("no message came in time");
    }
    return Status::Ok();
  }

  // The next bytes of the message for receive `seq`, `size` bytes in all:
  // copied into the receive's memory, which the receive is answered with
  // once every byte came (an abandoned one drops them). mu_ held.
  Status fill_receive(uint64_t seq, uint64_t size, std::span<const uint8_t> data) {
    Receive* filled = waiting_.find(seq);
    if (filled == nullptr || filled->answered) {
      return ProtocolError("endpoint message part for receive " + std::to_string(seq) +
                           ", which is not waiting");
    }
    Receive& receive = *filled;
    if (receive.parts_came == 0) {
      if (size > receive.into.size()) {
        return ProtocolError("the peer says it sent more than the receive holds");
      }
      receive.parts_size = size;
    } else if (size != receive.parts_size) {
      return ProtocolError("the parts of one endpoint message disagree on its size");
    }
    if (data.size() > size - receive.parts_came) {
      return ProtocolError("an endpoint message part beyond the message's end");
    }
    // Under the lock: the receive has not returned, nor been abandoned
    // (abandon_receive marks it under the lock), so `into` is valid.
    if (!receive.abandoned) {
      copy_received(receive.into.data() + receive.parts_came, data.data(), data.size());
    }
    receive.parts_came += data.size();
    if (receive.parts_came < size) return Status::Ok();
    credit_used();
    if (receive.abandoned) {
      waiting_.erase(seq);
      return Status::Ok();
    }
    receive.answered = true;  // its status stays OK
    receive.size = size;
    register_when_posted_.store(false, std::memory_order_relaxed);  // parts need no handle
    return Status::Ok();
  }

  bool notes_full() {
    std::lock_guard lock(mu_);
    return notes_.size() >= kMaxPendingNotes;
  }

  void fail_reading(Status st) {
    if (st.code() != StatusCode::kProtocolError && st.code() != StatusCode::kCancelled &&
        st.code() != StatusCode::kResourceExhausted) {
      st = Unavailable("the peer closed the endpoint (" + st.message() + ")");
    }
    break_with(st);
  }

  // The endpoint's thread: reads while no caller does, and delivers the
  // notifications. It arms its watch on the socket only after it read it
  // itself; callers leave the watch as it is. Woken while callers read, it
  // looks again after kLinger, then after twice as long each time callers
  // read meanwhile (up to kMostLinger), until they have been gone since its
  // last look.
  void serve() {
    int timeout_ms = -1;
    int linger_ms = kLingerMs;  // the next look's, while callers read
    int held_looks = 0;         // looks in a row that found the role held (see below)
    auto look_later = [&] {     // callers read: the next look, and the one after
      timeout_ms = linger_ms;
      linger_ms = std::min(2 * linger_ms, kMostLingerMs);
    };
    while (true) {
      epoll_event events[4];
      // Sleeping with no timeout: a frame deferred from now on wakes us.
      serve_sleeping_.store(timeout_ms < 0);
      if (timeout_ms < 0 && ring_ && doorbells_taken_.load() != doorbells_seen_) {
        // A caller took a doorbell since this thread asked for one: it may
        // have been this thread's. Look again soon instead of sleeping on it.
        serve_sleeping_.store(false);
        timeout_ms = kLingerMs;
      }
      int woken = 0;
      if (!(timeout_ms < 0 && has_deferred_.load())) {
        woken = ::epoll_wait(events_.get(), events, 4, timeout_ms);
        if (woken < 0 && errno != EINTR) {
          break_with(Internal("epoll_wait: " + errno_text(errno)));
          return;
        }
      }
      serve_sleeping_.store(false);
      if (woken == 0 && timeout_ms >= 0 && led_lately()) {
        // A look that nothing woke, while callers read. Their waits answer
        // what the peer sends, move sends on after each read and send the
        // credits held back once due; whatever needs this thread (a
        // notification to deliver, a write that finished while no caller
        // read, the end) signals one of its watches. Left for it: held
        // credits that are due (a receive posted with no wait after it).
        // The others wait for the next frame, or this thread's first look
        // after callers stop, as the peer does not need them yet.
        // Otherwise no lock and no write: a look does not meet a caller on
        // mu_ (in the Soft-RoCE VM a futex wake then sat on the caller's
        // message's way) nor send credits of its own (8 B ping-pong: 4.00
        // packets a round trip, against 4.01-4.02 when each look sent what
        // was held). The price: a send that became ready just as a wait
        // ended (at its deadline, or a writer's read while blocked, which
        // moves no sends) moves at the look after next, not the next.
        if (has_deferred_.load(std::memory_order_relaxed) && credits_due()) flush().ignore();
        held_looks = 0;
        look_later();
        continue;
      }
      drain_eventfd(wake_.get());
      flush().ignore();
      progress_sends();  // writes that finished, credits read by callers
      if (!deliver_notes()) {
        break_with(Cancelled("the manager is shutting down"));
        break;
      }
      if (stopping()) break;
      // A waiter that looked for notifications went to sleep (looks_ended):
      // read again now, rather than after callers have been gone a while.
      const bool handed_back = reader_wanted_.exchange(false);
      if (led_lately() && !handed_back) {
        held_looks = 0;
        look_later();
        continue;
      }
      // The role held at this look and the one before, with no caller's
      // turn ending between: one wait that reads every frame that comes
      // (an idle endpoint's receive waiting for a day, say). Its release
      // wakes this thread, which sleeps until then: looking every
      // kMostLinger meanwhile cost each idle endpoint 125 wake-ups a
      // second. (After one such look it looks once more: a wait that ends
      // within it needs no wake-up.) The holder takes the doorbells too,
      // so none is this thread's to wait for.
      const bool until_released = held_looks > 0;
      if (!take_role(until_released)) {
        if (handed_back) reader_wanted_.store(true);  // at the release, or the next look
        if (until_released) {
          held_looks = 0;
          timeout_ms = -1;
          doorbells_seen_ = doorbells_taken_.load();
        } else {
          ++held_looks;
          look_later();
        }
        continue;
      }
      held_looks = 0;
      linger_ms = kLingerMs;
      timeout_ms = -1;
      Status st;
      if (ring_) take_doorbells();
      while (true) {
        bool progressed = true;
        while (st.ok() && progressed && !notes_full()) {
          progressed = false;
          st = pump(progressed);
          if (progressed) cv_.notify_all();
        }
        // Before sleeping, a shared-memory reader asks for a doorbell; bytes
        // that came meanwhile are read first.
        if (!st.ok() || !ring_ || notes_full() || ring_.request_doorbell()) break;
      }
      doorbells_seen_ = doorbells_taken_.load();
      watch_socket();
      give_back_role();
      if (!st.ok()) {
        fail_reading(st);
        break;
      }
      progress_sends();  // with the credits just read
    }
    deliver_notes();  // what was read before the end, while the queue has room
  }

  // A notice from a backend (NoticeSink), its buffer, token and range
  // checked by the manager: the notification a kNotify frame would give.
  Result<Notification> notification_for(uint64_t writer, const NoticeRecord& notice) override {
    if (writer != peer_manager_id_) {
      return PermissionDenied("a notice for the endpoint to " + peer_ + " came from manager " +
                              hex_id(writer) + ", not its peer");
    }
    return Notification{notice.tag, notice.buffer_id, notice.offset, notice.length, peer_};
  }

  // NoticeTaker::look_for_notes: one look at the channel, as the reader
  // role's holder, when the role is free and frames (or, over TCP, maybe
  // bytes) came; then the notifications read go to the manager's queue
  // from this thread. Never waits: not for mu_ nor the role, and it writes
  // nothing (a write may wait for room in the channel for seconds, and a
  // waiter's timeout is its caller's): the replies to the frames it read,
  // sends that can move on and credits that are due are left to the
  // endpoint's thread, woken (to read again, for the replies: they go with
  // the next reader's pump). Reading counts as a caller's lead: the
  // endpoint's thread then leaves the channel to this thread's looks
  // (led_lately) until looks_ended().
  void look_for_notes() override {
    {
      FutexLock lock(mu_, std::try_to_lock);
      if (!lock.owns_lock() || reading_ || notes_.size() >= kMaxPendingNotes || !broken_.ok())
        return;
      if (notes_.empty() && ring_ && !ring_.has_incoming()) return;  // (no reader: ours to ask)
      reading_ = true;
      reader_id_ = std::this_thread::get_id();
      looking_ = true;
      bool progressed = false;
      Status st = pump_holding_replies(progressed, lock, Take::kAll);
      if (!lock.owns_lock()) lock.lock();
      looking_ = false;
      if (progressed) {
        looked_.store(true, std::memory_order_relaxed);
        count_lead();
      }
      const bool replies = !held_replies_.empty();
      const bool for_the_thread = replies || send_work_ready() ||
                                  (has_deferred_.load(std::memory_order_relaxed) && credits_due());
      release_role();  // and wakes the callers behind, as a lead does
      lock.unlock();
      if (!st.ok()) {
        fail_reading(st);  // and the endpoint's thread, woken, delivers what was read
        return;
      }
      if (for_the_thread) {
        if (replies) reader_wanted_.store(true);
        signal_eventfd(wake_.get());
      }
    }
    hand_over_notes();
  }

  // NoticeTaker::looks_ended: the endpoint's thread reads again, woken
  // now, when a waiter's looks kept it away. Never blocks.
  void looks_ended() override {
    if (!looked_.exchange(false, std::memory_order_relaxed)) return;
    reader_wanted_.store(true);
    signal_eventfd(wake_.get());
  }

  // A looking waiter's (look_for_notes): hands notes_ to the manager's
  // queue in order, without waiting; what it cannot hand over (a handler
  // is set, the queue is full, the endpoint's thread is delivering), that
  // thread delivers, woken.
  void hand_over_notes() {
    std::unique_lock delivering(deliver_mu_, std::try_to_lock);
    if (!delivering.owns_lock()) {
      signal_eventfd(wake_.get());  // it may have looked at notes_ before ours came
      return;
    }
    while (true) {
      Notification n;
      {
        std::lock_guard lock(mu_);
        if (notes_.empty()) return;
        n = notes_.front();
      }
      if (!manager_.notifications().try_queue(n)) {
        signal_eventfd(wake_.get());
        return;
      }
      std::lock_guard lock(mu_);
      notes_.take_front();
      wake_sleepers();  // reading may go on, if notes_ had filled
    }
  }

  // Hands the queued notifications to the manager, oldest first; waits
  // while its queue is full. False when the endpoint is closing.
  bool deliver_notes() {
    std::lock_guard delivering(deliver_mu_);
    while (true) {
      Notification n;
      {
        std::lock_guard lock(mu_);
        if (notes_.empty()) return true;
        n = notes_.take_front();
      }
      cv_.notify_all();  // reading may go on, if it had stopped
      if (!manager_.notifications().push(n, [this] { return stopping(); })) return false;
    }
  }

  // The credit a kPosted frame's payload carries.
  // (Into `credit`, a new one: no Result<Credit> to build and move on every
  // message's path.)
  static Status parse_credit(std::span<const uint8_t> payload, Credit& credit) {
    WireReader r(payload);
    credit.seq = r.get<uint64_t>();
    credit.capacity = r.get<uint64_t>();
    auto handle = r.view(r.get<uint16_t>());
    if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint credit");
    const uint64_t capacity = credit.capacity;
    if (!handle.empty()) {
      auto buffer = RemoteBuffer::from_bytes(handle);
      if (!buffer.ok()) {
        return ProtocolError("endpoint credit with a bad handle: " + buffer.status().message());
      }
      credit.buffer = std::move(buffer).value();
    }
    if (credit.buffer.valid() && capacity > credit.buffer.size()) {
      return ProtocolError("endpoint credit larger than its buffer");
    }
    return Status::Ok();
  }

  // Takes one frame of the peer's (reader role held; inside pump(), whose
  // caller wakes the callers waiting on cv_ once a frame was taken).
  Status dispatch(Frame type, std::span<const uint8_t> payload) {
    WireReader r(payload);
    switch (type) {
      case Frame::kPosted: {
        Credit credit;
        RDMABUF_RETURN_IF_ERROR(parse_credit(payload, credit));
        std::lock_guard lock(mu_);
        credits_.push_back(std::move(credit));
        break;
      }
      case Frame::kSent:
      case Frame::kTooLarge:
      case Frame::kNotTaken:
      case Frame::kSentInline: {
        const uint64_t seq = r.get<uint64_t>();
        const bool inline_data = type == Frame::kSentInline;
        const uint64_t size = inline_data ? r.remaining() : r.get<uint64_t>();
        auto data = r.view(inline_data ? r.remaining() : 0);
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint answer");
        std::lock_guard lock(mu_);
        return answer_receive(type, seq, size, data);
      }
      case Frame::kSentPart: {
        const uint64_t seq = r.get<uint64_t>();
        const uint64_t size = r.get<uint64_t>();
        auto data = r.view(r.remaining());
        if (!r.ok() || data.empty()) return ProtocolError("malformed endpoint message part");
        std::lock_guard lock(mu_);
        return fill_receive(seq, size, data);
      }
      case Frame::kWithdrawn: {
        const uint64_t seq = r.get<uint64_t>();
        if (!r.ok() || r.remaining() != 8) return ProtocolError("malformed endpoint withdrawal");
        FutexLock lock(mu_);
        auto taken = in_send_.find(seq);
        if (taken != in_send_.end()) {
          taken->second = true;  // the send in progress answers when done
          break;
        }
        if (!credits_.erase_first_if([seq](const Credit& c) { return c.seq == seq; })) {
          break;  // answered already: the answer crossed this
        }
        lock.unlock();
        return write_frame(FrameBuilder(Frame::kNotTaken).u64(seq).u64(0));
      }
      case Frame::kNotify: {
        Notification n;
        n.tag = r.get<uint32_t>();
        n.buffer_id = r.get<uint64_t>();
        n.offset = r.get<uint64_t>();
        n.length = r.get<uint64_t>();
        n.peer = peer_;
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint notification");
        bool first;
        {
          std::lock_guard lock(mu_);
          first = notes_.empty();
          notes_.push_back(std::move(n));
        }
        // The endpoint's thread delivers it, unless a waiter that looks
        // reads it (it hands it over itself: look_for_notes).
        if (first && !looking_) signal_eventfd(wake_.get());
        return Status::Ok();
      }
      case Frame::kLendRequest: {
        const uint64_t id = r.get<uint64_t>();
        const uint64_t size = r.get<uint64_t>();
        const uint64_t lease_ms = r.get<uint64_t>();
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed lend request");
        return answer_lend(
            id, size, std::chrono::milliseconds(std::min<uint64_t>(lease_ms, uint64_t{1} << 40)));
      }
      case Frame::kRenew: {
        const uint64_t id = r.get<uint64_t>();
        const uint64_t buffer_id = r.get<uint64_t>();
        const uint64_t lease_ms = r.get<uint64_t>();
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed lease renewal");
        return answer_renew(id, buffer_id,
                            std::chrono::milliseconds(std::min<uint64_t>(lease_ms, 1ull << 40)));
      }
      case Frame::kHandleWanted: {
        const uint64_t id = r.get<uint64_t>();
        const uint64_t seq = r.get<uint64_t>();
        if (!r.ok() || r.remaining() != 0)
          return ProtocolError("malformed endpoint handle request");
        return answer_handle_request(id, seq);
      }
      case Frame::kLent:
      case Frame::kRenewed:
      case Frame::kReceiveHandle: {
        const uint64_t id = r.get<uint64_t>();
        const auto code = static_cast<StatusCode>(r.get<uint8_t>());
        const uint64_t value = r.get<uint64_t>();
        auto body = r.view(r.get<uint16_t>());
        if (!r.ok() || r.remaining() != 0 || code > StatusCode::kInternal) {
          return ProtocolError("malformed endpoint reply");
        }
        std::lock_guard lock(mu_);
        auto it = replies_.find(id);
        if (it == replies_.end()) break;  // its caller gave up
        Reply& reply = it->second;
        reply.arrived = true;
        if (reply.for_send) send_events_.push_back(reply.send);
        reply.value = value;
        if (code == StatusCode::kOk) {
          reply.body.assign(body.begin(), body.end());
        } else {
          reply.status = Status(code, "the peer: " + std::string(body.begin(), body.end()));
        }
        break;
      }
      case Frame::kBuffer: {
        auto bytes = r.view(r.get<uint16_t>());
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint handle");
        auto buffer = RemoteBuffer::from_bytes(bytes);
        if (!buffer.ok()) {
          return ProtocolError("the peer passed a bad handle: " + buffer.status().message());
        }
        return take_buffer(std::move(buffer).value());
      }
      default:
        return ProtocolError("unknown endpoint frame type " +
                             std::to_string(static_cast<int>(type)));
    }
    return Status::Ok();  // whoever pumped wakes the callers: it progressed
  }

  Status reply(Frame type, uint64_t id, const Status& status, uint64_t value,
               std::span<const uint8_t> body) {
    FrameBuilder frame(type);
    frame.u64(id).fields().put<uint8_t>(static_cast<uint8_t>(status.code()));
    frame.u64(value).blob(status.ok() ? body : text_bytes(status.message()));
    return write_frame(frame);
  }

  Status answer_lend(uint64_t id, uint64_t size, std::chrono::milliseconds lease) {
    auto refuse = [&](const Status& why) { return reply(Frame::kLent, id, why, 0, {}); };
    if (size == 0 || lease.count() == 0) return refuse(InvalidArgument("nothing to lend"));
    LendBudget& budget = manager_.lend_budget();
    if (!budget.take(size)) {
      return refuse(ResourceExhausted("lending " + std::to_string(size) +
                                      " bytes more would pass this manager's lend limit of " +
                                      std::to_string(budget.limit()) + " (RDMABUF_LEND_LIMIT)"));
    }
    auto memory = LocalMemory::allocate(size);
    auto handle = memory.ok() ? manager_.register_buffer(*memory) : memory.status();
    if (!handle.ok()) {
      budget.give_back(size);
      return refuse(handle.status());
    }
    lease = std::min(lease, manager_.config().max_lease);
    Status broken;
    {
      std::lock_guard lock(mu_);
      // Once broken, the lease keeper has reclaimed every loan and stopped:
      // a loan added now would never be reclaimed.
      broken = broken_;
      if (broken.ok()) lent_[handle->id()] = Lent{*memory, *handle, Clock::now() + lease};
    }
    if (!broken.ok()) {
      manager_.release(*handle).ignore();
      budget.give_back(size);
      return broken;
    }
    leases_cv_.notify_all();  // the lease keeper learns the new expiry
    return reply(Frame::kLent, id, Status::Ok(), static_cast<uint64_t>(lease.count()),
                 handle->to_bytes());
  }

  // The peer has a message for receive `seq` that needs its memory: registers
  // it, unless the receive is no longer open for the message.
  Status answer_handle_request(uint64_t id, uint64_t seq) {
    auto refuse = [&](const Status& why) { return reply(Frame::kReceiveHandle, id, why, 0, {}); };
    const Status gone = NotFound("the receive was withdrawn");
    auto open_receive = [&]() -> Receive* {
      Receive* receive = waiting_.find(seq);
      if (receive == nullptr) return nullptr;
      return receive->abandoned || receive->withdrawn || receive->answered ? nullptr : receive;
    };
    LocalMemory into;
    RemoteBuffer handle;
    bool open = false;
    {
      // Never reply with mu_ held: a failed write breaks the endpoint,
      // which takes mu_.
      std::lock_guard lock(mu_);
      Receive* receive = open_receive();
      if (receive != nullptr) {
        open = true;
        into = receive->into;
        handle = receive->handle;
      }
    }
    if (!open) return refuse(gone);
    if (into.size() <= kInlineLimit) {
      // Only an inline message fits it: a peer that follows the protocol
      // never asks, and its memory is never registered.
      return ProtocolError("the peer asked for the handle of receive " + std::to_string(seq) +
                           ", which only an inline message fits");
    }
    if (!handle.valid()) {
      auto registered = manager_.register_buffer(into);
      if (!registered.ok()) return refuse(registered.status());
      handle = std::move(registered).value();
      bool kept = false;
      {
        std::lock_guard lock(mu_);
        Receive* receive = open_receive();
        if (receive != nullptr && !receive->handle.valid()) {
          receive->handle = handle;  // released when the receive ends
          kept = true;
        }
      }
      if (!kept) {  // withdrawn meanwhile: its memory is not the peer's
        manager_.release(handle).ignore();
        return refuse(gone);
      }
    }
    return reply(Frame::kReceiveHandle, id, Status::Ok(), 0, handle.to_bytes());
  }

  Status answer_renew(uint64_t id, uint64_t buffer_id, std::chrono::milliseconds lease) {
    lease = std::min(lease, manager_.config().max_lease);
    Status st = Status::Ok();
    {
      std::lock_guard lock(mu_);
      auto it = lent_.find(buffer_id);
      if (it == lent_.end()) {
        st = NotFound("the lease has ended");
      } else {
        it->second.expires = Clock::now() + lease;  // later: the keeper finds out when it wakes
      }
    }
    return reply(Frame::kRenewed, id, st, st.ok() ? static_cast<uint64_t>(lease.count()) : 0, {});
  }

  // A handle from the peer: memory we lent coming back, or any other.
  Status take_buffer(RemoteBuffer buffer) {
    FutexLock lock(mu_);
    auto lent = buffer.owner().manager_id == manager_.identity().manager_id
                    ? lent_.find(buffer.id())
                    : lent_.end();
    if (lent == lent_.end()) {
      if (remote_buffers_.size() >= kMaxQueuedBuffers) {
        return ResourceExhausted("the peer passed more than " + std::to_string(kMaxQueuedBuffers) +
                                 " handles nobody took");
      }
      remote_buffers_.push_back(std::move(buffer));
      wake_sleepers();
      return Status::Ok();
    }
    Lent back = std::move(lent->second);
    lent_.erase(lent);
    lock.unlock();
    // The lease ends: the peer's access stops before we hand the memory on.
    manager_.release(back.handle).ignore();
    manager_.lend_budget().give_back(back.memory.size());
    auto range = back.memory.slice(buffer.offset(), buffer.size());
    lock.lock();
    returned_.push_back(range.ok() ? *range : back.memory);
    wake_sleepers();
    return Status::Ok();
  }

  // --- the lease keeper: reclaims lent memory whose lease ended ----------------------------

  void keep_leases() {
    FutexLock lock(mu_);
    while (true) {
      Deadline next = Deadline::max();
      std::vector<Lent> expired;
      const Deadline now = Clock::now();
      for (auto it = lent_.begin(); it != lent_.end();) {
        if (it->second.expires <= now || !broken_.ok()) {
          expired.push_back(std::move(it->second));
          it = lent_.erase(it);
        } else {
          next = std::min(next, it->second.expires);
          ++it;
        }
      }
      if (!expired.empty()) {
        lock.unlock();
        for (Lent& l : expired) {
          manager_.release(l.handle).ignore();  // from now on: kNotFound
          manager_.lend_budget().give_back(l.memory.size());
        }
        lock.lock();
        continue;
      }
      if (!broken_.ok()) return;
      if (next == Deadline::max()) {
        leases_cv_.wait(lock);
      } else {
        leases_cv_.wait_until(lock, next);
      }
    }
  }

  Manager& manager_;
  const std::chrono::microseconds busy_poll_ = manager_.config().busy_poll;
  SpinStretch stretch_;  // the reader role's holder alone (lead)
  // The thread that made the endpoint may run on one CPU alone (its
  // affinity mask, its cgroup's quota): so may, in all likelihood, its
  // peer and the threads that wait on the endpoint.
  const bool one_cpu_ = usable_cpus() < 2;
  Fd fd_;  // the TCP connection: frames, or with ring_ doorbells (or nothing) and its end
  RingChannel ring_;           // the channel frames take, when not fd_
  const std::string channel_;  // Endpoint::channel()
  Fd stop_;                    // readable once closing
  Fd wake_;                    // readable when the endpoint's thread has work: notifications, sends
  Fd sends_wake_;              // readable when a send's write finished while a caller read
  Fd events_;                  // epoll: stop_, wake_, and fd_ while no caller reads it
  std::atomic<uint64_t> leads_{0};  // how many times a caller gave the reader role back
  uint64_t leads_seen_ = 0;         // the endpoint's thread alone (led_lately)
  std::unique_ptr<uint8_t[]> in_;   // bytes read, [in_begin_, in_end_) not yet taken
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  bool peer_closed_ = false;  // ring_: the TCP connection ended
  const std::string peer_;
  const uint64_t peer_manager_id_;
  const uint64_t notice_key_;       // this side's (EndpointHello)
  const uint64_t peer_notice_key_;  // the peer's: its notices name it

  // FutexMutex, not std::mutex: mu_ and write_mu_ are taken several times
  // per message (common/futex_mutex.h).
  FutexMutex mu_;
  std::condition_variable_any cv_;         // callers waiting for the peer
  int sleepers_ = 0;                       // waiting on cv_ now
  std::condition_variable_any leases_cv_;  // the lease keeper
  Status broken_;                          // OK while usable
  // The reader role, taken and given back under mu_: its holder alone
  // reads fd_ and the ring and dispatches (in_, in_begin_, in_end_,
  // peer_closed_, held_replies_, reply_depth_).
  bool reading_ = false;
  std::thread::id reader_id_;  // its holder, while reading_
  // The endpoint's thread found the role held and sleeps until its
  // release (take_role, release_role). Changed under mu_; read without it
  // where it only spares a wake-up (take_doorbells).
  std::atomic<bool> role_wanted_{false};
  // The reader role's holder while it dispatches frames (inside pump()),
  // else none: a frame written by this thread meanwhile is a reply, held
  // (see write_pieces). Set by that thread alone, so a thread that finds
  // its own id here is inside pump().
  std::atomic<std::thread::id> pumping_thread_{};
  // The reader role's holder alone: replies held while it pumps, and how
  // deep it is in writing them (see read_while_blocked).
  std::vector<uint8_t> held_replies_;
  int reply_depth_ = 0;
  // For the endpoint's thread to deliver, or a waiter that looked
  // (hand_over_notes). (Its size, looked at in every wait, is a field: a
  // deque's is a computation over its blocks.)
  RingQueue<Notification> notes_;
  // Held by whoever hands notes_ to the manager's queue, so that they go
  // in order. Never taken under mu_.
  std::mutex deliver_mu_;
  // The reader role's holder is a waiter in next_notification
  // (look_for_notes), which hands over the notifications it reads itself.
  bool looking_ = false;
  std::atomic<bool> looked_{false};         // such a waiter read since looks_ended()
  std::atomic<bool> reader_wanted_{false};  // looks_ended(): the endpoint's thread reads again
  RingQueue<Credit> credits_;               // the peer's receives, not yet taken
  std::map<uint64_t, bool> in_send_;        // taken credits: withdrawn meanwhile?
  NumberedSlots<Outgoing> sends_;           // posted sends by id, until their wait ends
  std::deque<uint64_t> queued_sends_;       // posted sends waiting for a credit, oldest first
  std::deque<uint64_t> send_events_;        // sends whose handle came or whose write finished
  uint64_t next_send_ = 1;                  // neither kRefused nor kAnswered, for ever
  NumberedSlots<Receive> waiting_;          // our posted receives, by sequence number
  uint64_t next_seq_ = 0;
  std::map<uint64_t, Reply> replies_;  // our requests waiting for an answer
  uint64_t next_request_ = 0;
  std::map<uint64_t, Lent> lent_;  // by buffer id
  std::deque<RemoteBuffer> remote_buffers_;
  std::deque<LocalMemory> returned_;

  // The frames lock: one writer at a time into the channel, which also
  // guards the credits held back (deferred_ and its counts). The socket's
  // is write_mu_: a send may block, and mu_ must stay free meanwhile for
  // the reader. The ring's is mu_ itself: a write into it never blocks (a
  // full ring is waited for without the lock), and the message path then
  // takes one lock where it took two: a receive posts its credit, and a
  // send writes its frame, under the hold of mu_ that takes the receive's
  // slot or the credit. Either is taken with no other lock held.
  FutexMutex write_mu_;  // the socket's frames lock
  // Credits held back (hold_credit), frames lock held: room in place for
  // those of the bench's 16 receives.
  SmallBytes<512> deferred_;
  std::atomic<bool> has_deferred_{false};
  // What one write gathers (under write_mu_; kept for their capacity).
  std::vector<iovec> socket_pieces_;
  // The credits held back in deferred_, and those sent that the peer has
  // not answered yet (see wait_receive). Counts for a heuristic: read
  // without a lock.
  std::atomic<int64_t> held_credits_{0};
  std::atomic<int64_t> credits_sent_{0};     // frames lock held
  std::atomic<int64_t> credits_used_{0};     // answered, under mu_
  std::atomic<bool> serve_sleeping_{false};  // the endpoint's thread waits with no timeout
  // Shared-memory channel: doorbells taken from the socket (take_doorbells),
  // and how many there were when the endpoint's thread last asked for one.
  std::atomic<uint64_t> doorbells_taken_{0};
  uint64_t doorbells_seen_ = 0;  // the endpoint's thread alone
  // Whether a receive too large for an inline message registers its memory
  // when posted: while the messages lately were too (see post_receive).
  std::atomic<bool> register_when_posted_{true};
  // Messages of more than kInlineLimit bytes and up to this size travel in
  // kSentPart frames through the control channel; larger ones by a
  // one-sided write.
  const uint64_t stream_limit_;
  const PartShape parts_;  // how send_in_frames() cuts messages
  std::mutex join_mu_;
  std::thread reader_;
  std::thread lease_keeper_;
};

// --- Endpoint -------------------------------------------------------------------

Endpoint::Endpoint(std::unique_ptr<EndpointImpl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() {
  close();
}

Status Endpoint::send(const LocalMemory& message, std::chrono::milliseconds timeout) {
  uint64_t id;
  Status posted = impl_->post_send(message, timeout, id);
  if (id == EndpointImpl::kRefused || id == EndpointImpl::kAnswered) return posted;
  return impl_->wait_send(id, timeout);
}

Result<PendingSend> Endpoint::post_send(const LocalMemory& message) {
  uint64_t id;
  Status posted = impl_->post_send(message, impl_->manager().config().default_timeout, id);
  if (id == EndpointImpl::kRefused) return posted;
  if (id == EndpointImpl::kAnswered) return PendingSend(std::move(posted));
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

// --- PendingReceive -----------------------------------------------------------------

void PendingReceive::withdraw() {
  endpoint_->abandon_receive(seq_);
}

Result<uint64_t> PendingReceive::wait(std::chrono::milliseconds timeout) {
  if (!endpoint_) return FailedPrecondition("this receive was waited for already");
  auto endpoint = std::move(endpoint_);
  return endpoint->wait_receive(seq_, timeout);
}

// --- PendingSend --------------------------------------------------------------------

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

Status Endpoint::send_buffer(const RemoteBuffer& buffer, std::chrono::milliseconds timeout) {
  return impl_->send_buffer(buffer, timeout);
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

// --- EndpointListener -------------------------------------------------------------

namespace {

Result<std::unique_ptr<MessageChannel>> open_message_channel(Manager& manager) {
  return EndpointImpl::open_message_channel(manager);
}

// An accepted connection on its way through the handshake.
struct Handshake {
  Fd fd;
  std::string peer;  // its address, for warnings and Endpoint::peer()
  Deadline limit;    // kHandshakeLimit after it was accepted
  bool hello_read = false;
  EndpointHello mine;    // sent
  EndpointHello theirs;  // once hello_read
  // Its channel answered, RDMA taken, not settled yet (Channel::waiting):
  // the peer's kChannelReady comes next, then this side's read through the
  // channel is answered, or not by probe_limit.
  std::optional<Channel> unsettled;
  Deadline probe_limit;
};

}  // namespace

struct EndpointListener::State {
  State(Manager& m, Fd listening, HostPort bound, Fd stopped)
      : manager(m), fd(std::move(listening)), address(std::move(bound)), stop(std::move(stopped)) {}
  Manager& manager;
  Fd fd;
  HostPort address;
  Fd stop;  // an eventfd, readable once closed
  std::atomic<bool> closed{false};
  // Handshakes under way when an accept returned, oldest first: the next
  // accept goes on with them (each within its own limit), so that short
  // accepts in a loop refuse no slow peer.
  std::mutex mu;
  std::vector<Handshake> unfinished;
};

EndpointListener::EndpointListener(std::unique_ptr<State> state) : state_(std::move(state)) {}
EndpointListener::~EndpointListener() = default;

void EndpointListener::close() {
  if (state_->closed.exchange(true)) return;
  // The socket stops listening (connects are refused from now on) but stays
  // open until destruction, so a concurrent accept never polls a reused fd.
  ::shutdown(state_->fd.get(), SHUT_RDWR);
  signal_eventfd(state_->stop.get());
  std::lock_guard lock(state_->mu);
  state_->unfinished.clear();  // their peers see the end now
}

std::string EndpointListener::address() const {
  return state_->address.to_string();
}

namespace {

// accept(2) reports some errors of the one connection it took (Linux passes
// pending network errors on, and a firewall may refuse it): that connection
// is gone, the listener is fine.
bool accept_error_is_the_connections(int error) {
  switch (error) {
    case EAGAIN:
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case EPERM:
    case ENETDOWN:
    case ENETUNREACH:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENONET:
    case EOPNOTSUPP:
      return true;
    default:
      return false;
  }
}

// Handshakes one accept carries on at once, at most; more connections wait
// in the listening socket's backlog meanwhile.
constexpr size_t kMostHandshakes = 64;

// That connection, not the listener, failed (it vanished, spoke something
// else, or did not finish within kHandshakeLimit): dropped, with a warning.
void drop_connection(const HostPort& listening, const Handshake& h, const Status& why) {
  const std::string reason = why.code() == StatusCode::kDeadlineExceeded
                                 ? "it did not complete the handshake within " +
                                       std::to_string(kHandshakeLimit.count()) + " s"
                                 : "its handshake failed: " + why.to_string();
  RDMABUF_LOG_WARN("endpoint listener " + listening.to_string() + ": dropped a connection from " +
                   (h.peer.empty() ? std::string("a peer already gone") : h.peer) + "; " + reason);
}

}  // namespace

Result<std::unique_ptr<Endpoint>> EndpointListener::accept(std::chrono::milliseconds timeout) {
  const Deadline deadline = deadline_after(timeout);
  const Status closed = Cancelled("the listener was closed");
  const int stop = state_->stop.get();
  // The handshakes under way, this call's alone while it runs (no other
  // accept reads them meanwhile); those left go back when it returns, or
  // are dropped once the listener is closed.
  std::vector<Handshake> mine;
  {
    std::lock_guard lock(state_->mu);
    std::move(state_->unfinished.begin(), state_->unfinished.end(), std::back_inserter(mine));
    state_->unfinished.clear();
  }
  struct GiveBack {
    State& state;
    std::vector<Handshake>& handshakes;
    ~GiveBack() {
      std::lock_guard lock(state.mu);
      if (state.closed.load()) return;  // dropped with `handshakes`
      std::move(handshakes.begin(), handshakes.end(), std::back_inserter(state.unfinished));
    }
  } give_back{*state_, mine};

  std::vector<pollfd> watched;
  while (true) {
    if (state_->closed.load()) return closed;
    // One poll for the stop signal, new connections (while fewer than
    // kMostHandshakes are under way) and the next frame of each handshake,
    // until accept's deadline or the first handshake's limit.
    Deadline wake = deadline;
    watched.assign({{stop, POLLIN, 0}, {state_->fd.get(), POLLIN, 0}});
    if (mine.size() >= kMostHandshakes) watched[1].fd = -1;  // poll skips it
    for (const Handshake& h : mine) {
      watched.push_back({h.fd.get(), POLLIN, 0});
      wake = std::min(wake, h.limit);
      // A read through an RDMA channel has no descriptor: looked at again
      // every kProbeLook.
      if (h.unsettled && h.unsettled->waiting == Channel::Waiting::kProbe) {
        wake = std::min(wake, Clock::now() + kProbeLook);
      }
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now());
    const int n = ::poll(watched.data(), watched.size(),
                         static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30)));
    if (n < 0 && errno != EINTR) return Internal("poll: " + errno_text(errno));
    if (n > 0 && watched[0].revents != 0) return closed;
    // Each handshake's next frame, when its first byte came: read whole
    // within the handshake's limit (a frame begun comes quickly, or the
    // peer misbehaves). One that is silent past its limit is dropped.
    const Deadline now = Clock::now();
    for (size_t i = mine.size(); i-- > 0;) {
      Handshake& h = mine[i];
      const bool readable = n > 0 && watched[2 + i].revents != 0;
      Status failed;
      std::optional<Result<Channel>> channel;  // once the handshake moved on
      if (h.unsettled && h.unsettled->waiting == Channel::Waiting::kProbe) {
        // The peer sends nothing until this side's kChannelReady: its
        // connection readable now has ended, or carries what it must not.
        if (readable) {
          failed = peer_spoke_while_probed(h.fd.get());
        } else if (now >= h.limit) {
          failed = DeadlineExceeded("its handshake's limit passed");
        } else {
          auto answered = h.unsettled->message->probe_answered();
          if (answered.ok() && !*answered && now < h.probe_limit) continue;
          const Status outcome =
              !answered.ok() ? answered.status()
              : *answered    ? Status::Ok()
                             : Unavailable("the peer's queue pair did not answer a read in time");
          channel = conclude_probe(h.fd.get(), std::move(*h.unsettled), outcome, h.limit, stop);
          h.unsettled.reset();
        }
      } else if (readable && !h.hello_read) {
        auto theirs = read_hello(h.fd.get(), h.limit, stop);
        if (theirs.ok()) {
          h.theirs = *theirs;
          h.hello_read = true;
          continue;  // its offer follows our hello: the next poll
        }
        failed = theirs.status();
      } else if (readable) {
        channel = h.unsettled
                      ? finish_rdma_channel(h.fd.get(), std::move(*h.unsettled), h.limit, stop)
                      : answer_channel(h.fd.get(), state_->manager, h.limit, stop);
        h.unsettled.reset();
      } else if (now >= h.limit) {
        failed = DeadlineExceeded("its handshake's limit passed");
      } else {
        continue;
      }
      if (channel && channel->ok()) {
        Channel& taken = **channel;
        if (taken.waiting != Channel::Waiting::kNothing) {
          // Its kChannelReady, or this side's read: the next poll. The
          // read's answer goes out with time left before the limit.
          if (taken.waiting == Channel::Waiting::kProbe) {
            h.probe_limit = std::min(h.limit - kRdmaProbeMargin, Clock::now() + kRdmaProbeLimit);
          }
          h.unsettled = std::move(taken);
          continue;
        }
        Handshake done = std::move(h);
        mine.erase(mine.begin() + static_cast<ptrdiff_t>(i));
        RDMABUF_ASSIGN_OR_RETURN(
            auto impl,
            EndpointImpl::create(state_->manager, std::move(done.fd), std::move(taken),
                                 done.peer.empty() ? "?" : done.peer, done.mine, done.theirs));
        return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
      }
      if (channel) failed = channel->status();
      if (failed.code() == StatusCode::kCancelled) return closed;
      drop_connection(state_->address, h, failed);
      mine.erase(mine.begin() + static_cast<ptrdiff_t>(i));
    }
    if (n > 0 && watched[1].fd >= 0 && watched[1].revents != 0) {
      Fd fd(::accept4(state_->fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (state_->closed.load()) return closed;
      if (fd.valid()) {
        // Now, while the peer is surely there to name in a warning.
        const auto peer = peer_address(fd.get());
        tune_data_socket(fd.get());  // no Nagle: frames are small and each is awaited
        Handshake h;
        h.fd = std::move(fd);
        h.peer = peer.ok() ? peer->to_string() : std::string();
        h.limit = Clock::now() + kHandshakeLimit;
        // Ours first, as the connecting side does: neither waits for the other's.
        h.mine = EndpointHello::mine(state_->manager);
        Status sent = send_hello(h.fd.get(), h.mine, h.limit, stop);
        if (sent.code() == StatusCode::kCancelled) return closed;
        if (sent.ok()) {
          mine.push_back(std::move(h));
        } else {
          drop_connection(state_->address, h, sent);
        }
      } else if (errno == EMFILE || errno == ENFILE) {
        // The connection stays queued; this process may have fds again soon.
        RDMABUF_LOG_WARN("endpoint listener " + state_->address.to_string() +
                         ": out of file descriptors; a connection waits");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } else if (!accept_error_is_the_connections(errno)) {
        return Unavailable("accept: " + errno_text(errno));
      }
    }
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("no peer completed the endpoint handshake in time");
    }
  }
}

// --- Manager's side -----------------------------------------------------------------

Result<std::unique_ptr<EndpointListener>> Manager::listen(const std::string& address) {
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(address));
  RDMABUF_ASSIGN_OR_RETURN(Fd fd, listen_tcp(where, 64));
  RDMABUF_ASSIGN_OR_RETURN(HostPort bound, local_address(fd.get()));
  RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
  return std::unique_ptr<EndpointListener>(
      new EndpointListener(std::unique_ptr<EndpointListener::State>(
          new EndpointListener::State(*this, std::move(fd), std::move(bound), std::move(stop)))));
}

Result<std::unique_ptr<Endpoint>> Manager::connect(const std::string& address,
                                                   std::chrono::milliseconds timeout) {
  const Deadline deadline = deadline_after(timeout);
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(address));
  RDMABUF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(where, deadline));
  const EndpointHello mine = EndpointHello::mine(*this);
  RDMABUF_RETURN_IF_ERROR(send_hello(fd.get(), mine, deadline));
  RDMABUF_ASSIGN_OR_RETURN(EndpointHello theirs, read_hello(fd.get(), deadline));
  RDMABUF_ASSIGN_OR_RETURN(Channel channel, offer_channel(fd.get(), *this, deadline));
  RDMABUF_ASSIGN_OR_RETURN(auto impl, EndpointImpl::create(*this, std::move(fd), std::move(channel),
                                                           where.to_string(), mine, theirs));
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

}  // namespace rdmabuf
