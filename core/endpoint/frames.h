// An endpoint's frames (docs/wire-format.md, "Endpoint control frames"):
// their header, and the one encoder and the one decoder of each frame's
// payload. Every path uses these: the endpoint's readers (whether they take
// a frame where it lies in a ring or from a copy), its writers, the
// handshake, the test helpers that play a peer and the fuzzers.
//
// A frame: u32 payload length, u8 type, the payload (little-endian fields,
// a "blob" is a u16 length and its bytes). A decoder reads each byte of a
// payload once, so a payload that lies in a ring the peer may write
// meanwhile decodes as safely as a copy; it refuses (kProtocolError, with
// the message a peer's fault gets) any payload longer or shorter than its
// frame's.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/wire.h"
#include "core/endpoint/message_parts.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/status.h"

namespace rdmabuf::endpoint {

constexpr uint32_t kMagic = 0x50454252;  // "RBEP"
// 2: the channel offer; 3: messages in parts; 4: RDMA channels; 5: notice keys in the hello;
// 6: the offerer's socket in the channel offer
constexpr uint16_t kVersion = 6;
// Messages up to this size travel inside the control frame (kSentInline):
// small messages cost one trip, not three.
constexpr uint64_t kInlineLimit = 4096;

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

// --- the header ---------------------------------------------------------------

// A frame's header: the size of its payload, which follows, and its type.
struct FrameHeader {
  uint32_t size;
  Frame type;
};
// The header in the first kHeaderSize bytes at `at` (no bounds to check).
inline FrameHeader read_header(const uint8_t* at) {
  uint32_t size;
  std::memcpy(&size, at, sizeof size);
  return {size, static_cast<Frame>(at[sizeof size])};
}
inline void write_header(uint8_t* at, FrameHeader header) {
  std::memcpy(at, &header.size, sizeof header.size);
  at[sizeof header.size] = static_cast<uint8_t>(header.type);
}

Status payload_too_large(uint32_t size);

// --- building frames ----------------------------------------------------------

// Bytes in place up to kInPlace, on the heap beyond: a frame being built
// (every frame on the messages' path fits in place), or the credits held
// back to go with the next frame.
template <size_t kInPlace>
class SmallBytes {
 public:
  SmallBytes() = default;
  SmallBytes(SmallBytes&& other) noexcept { *this = std::move(other); }
  SmallBytes& operator=(SmallBytes&& other) noexcept {
    if (this == &other) return *this;
    size_ = other.size_;
    if (other.data_ == other.in_place_.data()) {
      std::memcpy(in_place_.data(), other.in_place_.data(), size_);
      heap_.clear();
      data_ = in_place_.data();
      capacity_ = kInPlace;
    } else {
      heap_ = std::move(other.heap_);
      data_ = heap_.data();
      capacity_ = heap_.size();
    }
    other.data_ = other.in_place_.data();
    other.capacity_ = kInPlace;
    other.size_ = 0;
    return *this;
  }
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

// A frame: the header, then the fields the encoders below append.
class FrameBuilder {
 public:
  explicit FrameBuilder(Frame type) : type_(type) {
    bytes_.resize(kHeaderSize);  // written by done(), once the size is known
  }
  FrameBuilder(FrameBuilder&&) noexcept = default;
  Frame type() const { return type_; }
  BasicWireWriter<FrameBytes> fields() { return BasicWireWriter<FrameBytes>(bytes_); }
  [[gnu::always_inline]] FrameBuilder& u64(uint64_t v) {
    fields().put<uint64_t>(v);
    return *this;
  }
  FrameBuilder& u8(uint8_t v) {
    fields().put<uint8_t>(v);
    return *this;
  }
  // A u16 length, then the bytes.
  FrameBuilder& blob(std::span<const uint8_t> data) {
    auto w = fields();
    w.put<uint16_t>(static_cast<uint16_t>(data.size()));
    w.bytes(data.data(), data.size());
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
  Frame type_;
};

// Text as a blob's bytes, cut at 1024 bytes.
std::span<const uint8_t> text_bytes(const std::string& text);

// --- messages -----------------------------------------------------------------

// The head of a kSentInline frame: its header and the receive's seq, which
// the message's `size` bytes follow. Every small message has one: built in
// place, with no FrameBuilder.
using InlineHead = std::array<uint8_t, kHeaderSize + sizeof(uint64_t)>;
inline InlineHead inline_head(uint64_t seq, uint64_t size) {
  InlineHead head;
  write_header(head.data(), {static_cast<uint32_t>(sizeof seq + size), Frame::kSentInline});
  std::memcpy(head.data() + kHeaderSize, &seq, sizeof seq);  // little-endian, as the host
  return head;
}
// The head of a kSentPart frame carrying `part` bytes of a message of
// `size` bytes for receive `seq`, which the part follows.
using PartHead = std::array<uint8_t, kPartOverhead>;
inline PartHead part_head(uint64_t seq, uint64_t size, uint64_t part) {
  PartHead head;
  write_header(head.data(), {static_cast<uint32_t>(2 * sizeof(uint64_t) + part), Frame::kSentPart});
  std::memcpy(head.data() + kHeaderSize, &seq, sizeof seq);
  std::memcpy(head.data() + kHeaderSize + sizeof seq, &size, sizeof size);
  return head;
}

// The answer to a receive (kSent, kTooLarge, kNotTaken, kSentInline): its
// seq, the message's size, and for kSentInline the message itself (the
// rest of the payload).
struct MessageAnswer {
  uint64_t seq = 0;
  uint64_t size = 0;
  std::span<const uint8_t> data;
};
// The decoders on every message's path (answers, parts, bare credits) say
// only whether the payload is well formed (no Status to build and drop on
// each message); malformed(type) is the error of one that is not.
inline bool decode_answer(Frame type, std::span<const uint8_t> payload, MessageAnswer& out) {
  if (type == Frame::kSentInline) {
    if (payload.size() < sizeof(uint64_t)) return false;
    std::memcpy(&out.seq, payload.data(), sizeof out.seq);
    out.data = payload.subspan(sizeof(uint64_t));
    out.size = out.data.size();
    return true;
  }
  if (payload.size() != 2 * sizeof(uint64_t)) return false;
  std::memcpy(&out.seq, payload.data(), sizeof out.seq);
  std::memcpy(&out.size, payload.data() + sizeof(uint64_t), sizeof out.size);
  out.data = {};
  return true;
}
// kProtocolError naming the frame of `type` as malformed.
Status malformed(Frame type);
// kSent, kTooLarge, kNotTaken (value 0) and kWithdrawn (value 0): u64 seq,
// u64 value.
FrameBuilder answer_frame(Frame type, uint64_t seq, uint64_t value);

// A part of a message (kSentPart): the receive's seq, the whole message's
// size, and the part's bytes (never empty).
struct MessagePart {
  uint64_t seq = 0;
  uint64_t size = 0;
  std::span<const uint8_t> data;
};
inline bool decode_part(std::span<const uint8_t> payload, MessagePart& out) {
  constexpr size_t kFields = 2 * sizeof(uint64_t);
  if (payload.size() <= kFields) return false;
  std::memcpy(&out.seq, payload.data(), sizeof out.seq);
  std::memcpy(&out.size, payload.data() + sizeof(uint64_t), sizeof out.size);
  out.data = payload.subspan(kFields);
  return true;
}

// kWithdrawn: the seq of the receive given up.
Result<uint64_t> decode_withdrawn(std::span<const uint8_t> payload);

// --- credits ------------------------------------------------------------------

// A receive the peer posted (kPosted): its seq, its capacity, and its
// handle when a message too large for a frame may go into it.
struct Credit {
  uint64_t seq = 0;
  uint64_t capacity = 0;
  RemoteBuffer buffer;  // empty when only inline messages fit, or not registered yet
};
// The payload of a kPosted frame: u64 seq, u64 capacity, blob handle.
constexpr size_t kBareCreditPayload = 2 * sizeof(uint64_t) + sizeof(uint16_t);
// Into `credit`, a new one (no Result<Credit> built and moved on every
// message's path). A credit without a handle (kBareCreditPayload bytes), on
// every message's path, decodes with no parse: false when malformed. One
// with a handle: its error says why (a capacity larger than the handle's
// buffer is refused too).
inline bool decode_bare_credit(std::span<const uint8_t> payload, Credit& credit) {
  if (payload.size() != kBareCreditPayload) return false;
  uint16_t handle_size;
  std::memcpy(&credit.seq, payload.data(), sizeof credit.seq);
  std::memcpy(&credit.capacity, payload.data() + sizeof(uint64_t), sizeof credit.capacity);
  std::memcpy(&handle_size, payload.data() + 2 * sizeof(uint64_t), sizeof handle_size);
  return handle_size == 0;
}
Status decode_credit(std::span<const uint8_t> payload, Credit& credit);
// Appends a whole kPosted frame to `out`, written where it will wait (a
// credit held back: no frame built apart and copied).
template <typename Bytes>
void append_credit(Bytes& out, uint64_t seq, uint64_t capacity, std::span<const uint8_t> handle) {
  const size_t payload = kBareCreditPayload + handle.size();
  const size_t at = out.size();
  out.resize(at + kHeaderSize + payload);
  uint8_t* to = out.data() + at;
  write_header(to, {static_cast<uint32_t>(payload), Frame::kPosted});
  to += kHeaderSize;
  auto put = [&to](auto value) {  // little-endian, as the host (common/wire.h)
    std::memcpy(to, &value, sizeof value);
    to += sizeof value;
  };
  put(seq);
  put(capacity);
  put(static_cast<uint16_t>(handle.size()));
  if (!handle.empty()) std::memcpy(to, handle.data(), handle.size());
}

// --- requests and replies -----------------------------------------------------

// A request of the peer's that this side answers: kLendRequest (id, size,
// lease ms), kRenew (id, buffer id, lease ms) or kHandleWanted (id, seq;
// `third` 0).
struct Request {
  uint64_t id = 0;
  uint64_t second = 0;
  uint64_t third = 0;
};
Status decode_request(Frame type, std::span<const uint8_t> payload, Request& out);
FrameBuilder request_frame(Frame type, const Request& request);

// The answer to a request (kLent, kRenewed, kReceiveHandle): its id, a
// status code, a value (the lease granted, in ms), and a blob (a handle,
// or the error's text).
struct Reply {
  uint64_t id = 0;
  StatusCode code = StatusCode::kOk;
  uint64_t value = 0;
  std::span<const uint8_t> body;
};
Status decode_reply(std::span<const uint8_t> payload, Reply& out);
// `status` OK: `body` goes; else the status' message does.
FrameBuilder reply_frame(Frame type, uint64_t id, const Status& status, uint64_t value,
                         std::span<const uint8_t> body);

// --- notifications and handles -----------------------------------------------

// kNotify: u32 tag, u64 buffer id, u64 offset, u64 length.
struct Notice {
  uint32_t tag = 0;
  uint64_t buffer_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
Status decode_notify(std::span<const uint8_t> payload, Notice& out);
FrameBuilder notify_frame(const Notice& notice);

// kBuffer: blob handle. The handle must decode.
Result<RemoteBuffer> decode_buffer(std::span<const uint8_t> payload);
FrameBuilder buffer_frame(std::span<const uint8_t> handle);

// --- the handshake ------------------------------------------------------------

// kHello: u32 magic, u16 version, u64 manager id, u64 notice key.
struct Hello {
  uint64_t manager_id = 0;
  // A fresh random number that names this side's endpoint to its manager's
  // backends: the peer puts it into the notices of its tagged writes
  // (WriteNotice), and a notice without it is not believed.
  uint64_t notice_key = 0;
};
// kProtocolError for another magic or version (saying which) or a
// malformed payload.
Result<Hello> decode_hello(Frame type, std::span<const uint8_t> payload);
FrameBuilder hello_frame(const Hello& hello);

// kChannelOffer (the connecting side): shared memory, with what the
// accepting side needs to open the rings, or why not; then RDMA, or why
// not.
struct ChannelOffer {
  bool shared_memory = false;
  uint32_t pid = 0;        // the rings' creator
  uint32_t fd = 0;         // its descriptor of the rings' file
  uint32_t socket_fd = 0;  // its descriptor of this connection
  uint64_t pid_namespace = 0;
  uint64_t nonce = 0;
  std::string host_id;
  std::string no_shared_memory;  // why not, when not offered
  bool rdma = false;
  std::string no_rdma;
};
Result<ChannelOffer> decode_channel_offer(Frame type, std::span<const uint8_t> payload);
FrameBuilder channel_offer_frame(const ChannelOffer& offer);

// What a channel offer's answer took.
enum class Taken : uint8_t { kTcp = 0, kSharedMemory = 1, kRdma = 2 };
// kChannelAnswer (the accepting side): what it took, why not shared memory
// and why not RDMA (empty when not offered or taken), and its RDMA
// channel's address (empty unless taken).
struct ChannelAnswer {
  Taken taken = Taken::kTcp;
  std::string no_shared_memory;
  std::string no_rdma;
  std::vector<uint8_t> address;
};
Result<ChannelAnswer> decode_channel_answer(Frame type, std::span<const uint8_t> payload);
FrameBuilder channel_answer_frame(const ChannelAnswer& answer);

// kChannelReady: whether this side connected its RDMA channel, and its
// address (the connecting side's, when it did) or why not.
struct ChannelReady {
  bool ok = false;
  std::vector<uint8_t> address_or_why;
};
Result<ChannelReady> decode_channel_ready(Frame type, std::span<const uint8_t> payload);
FrameBuilder channel_ready_frame(const Status& status, std::span<const uint8_t> address);

}  // namespace rdmabuf::endpoint
