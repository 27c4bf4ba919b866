// A hand-made endpoint peer for tests and the fuzzer: it speaks the endpoint
// control frames as docs/wire-format.md describes them, so that a test can
// send any frame, well-formed or not, to a real Endpoint and read what the
// real side answers.
//
// The peer connects to an EndpointListener, says hello and declines shared
// memory, so every frame travels in the TCP connection. Header-only: the
// fuzz targets (built without GoogleTest) include it too.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/socket.h"
#include "core/endpoint/frames.h"

namespace rdmabuf::testing {

// Frame types: the endpoint's own (core/endpoint/frames.h). Well-formed
// frames of the handshake are built by its encoders too; RawPayload builds
// any payload, well-formed or not, field by field.
using RawFrame = endpoint::Frame;

// Little-endian fields, appended.
class RawPayload {
 public:
  RawPayload& u8(uint8_t v) { return put(v); }
  RawPayload& u16(uint16_t v) { return put(v); }
  RawPayload& u32(uint32_t v) { return put(v); }
  RawPayload& u64(uint64_t v) { return put(v); }
  RawPayload& bytes(std::span<const uint8_t> data) {
    out_.insert(out_.end(), data.begin(), data.end());
    return *this;
  }
  // A u16 length, then the bytes.
  RawPayload& blob(std::span<const uint8_t> data) {
    u16(static_cast<uint16_t>(data.size()));
    return bytes(data);
  }
  RawPayload& blob(const std::string& text) {
    return blob({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  }
  const std::vector<uint8_t>& get() const { return out_; }

 private:
  template <typename T>
  RawPayload& put(T v) {
    for (size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  std::vector<uint8_t> out_;
};

// A whole frame: u32 payload length, u8 type, the payload.
inline std::vector<uint8_t> raw_frame(RawFrame type, const RawPayload& payload) {
  RawPayload frame;
  frame.u32(static_cast<uint32_t>(payload.get().size())).u8(static_cast<uint8_t>(type));
  frame.bytes(payload.get());
  return frame.get();
}

inline uint64_t read_u64_le(std::span<const uint8_t> bytes, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && at + i < bytes.size(); ++i)
    v |= static_cast<uint64_t>(bytes[at + i]) << (8 * i);
  return v;
}

class RawEndpointPeer {
 public:
  // The notice key a raw peer's hello gives (docs/wire-format.md, hello).
  static constexpr uint64_t kNoticeKey = 0x6b65795f6b6579;
  static std::vector<uint8_t> hello(uint64_t manager_id) {
    return frame_bytes(endpoint::hello_frame({manager_id, kNoticeKey}));
  }
  static std::vector<uint8_t> frame_bytes(endpoint::FrameBuilder&& frame) {
    const std::span<const uint8_t> bytes = frame.done();
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  }

  // Connects to `address` and sends the hello and a channel offer that
  // declines shared memory and RDMA. The real side's answers are read by finish()
  // (call it once the listener has accepted: both fit in the socket
  // buffers, so one thread can do both sides). Empty on failure.
  static std::optional<RawEndpointPeer> start(const std::string& address, uint64_t manager_id) {
    auto peer = connect(address);
    if (!peer || !peer->send_hello(manager_id) || !peer->send_offer()) return std::nullopt;
    return peer;
  }

  // Connects to `address` and sends nothing yet: send_hello() and
  // send_offer() do, as start() does, when a test wants them late.
  static std::optional<RawEndpointPeer> connect(const std::string& address) {
    auto where = parse_host_port(address);
    if (!where.ok()) return std::nullopt;
    auto fd = connect_tcp(*where, Clock::now() + std::chrono::seconds(10));
    if (!fd.ok()) return std::nullopt;
    return RawEndpointPeer(std::move(fd).value());
  }
  bool send_hello(uint64_t manager_id) { return send(hello(manager_id)); }
  bool send_offer() {
    endpoint::ChannelOffer offer;
    offer.no_shared_memory = offer.no_rdma = "a raw test peer";
    return send(frame_bytes(endpoint::channel_offer_frame(offer)));
  }

  // Reads the real side's hello and channel answer: true when both are
  // what they should be.
  bool finish(std::chrono::milliseconds timeout) {
    RawFrame type{};
    std::vector<uint8_t> payload;
    if (!read_frame(type, payload, timeout) || type != RawFrame::kHello || payload.size() != 22) {
      return false;
    }
    peer_notice_key_ = read_u64_le(payload, 14);
    return read_frame(type, payload, timeout) && type == RawFrame::kChannelAnswer &&
           payload.size() >= 7 && payload[0] == 0;
  }

  bool send(std::span<const uint8_t> bytes) {
    return send_exact(fd_.get(), bytes.data(), bytes.size(),
                      Clock::now() + std::chrono::seconds(10))
        .ok();
  }

  // The next frame within `timeout`; false at its end, on a timeout, or for
  // a payload over 1 MiB.
  bool read_frame(RawFrame& type, std::vector<uint8_t>& payload,
                  std::chrono::milliseconds timeout) {
    const Deadline deadline = Clock::now() + timeout;
    uint8_t header[5];
    if (!recv_exact(fd_.get(), header, sizeof header, deadline).ok()) return false;
    uint32_t size = 0;
    std::memcpy(&size, header, sizeof size);
    type = static_cast<RawFrame>(header[4]);
    if (size > (1u << 20)) return false;
    payload.resize(size);
    return recv_exact(fd_.get(), payload.data(), size, deadline).ok();
  }

  // True when the real side closed the connection within `timeout` (frames
  // it sent before are skipped).
  bool closed_by_peer(std::chrono::milliseconds timeout) {
    const Deadline deadline = Clock::now() + timeout;
    uint8_t skip[4096];
    while (Clock::now() < deadline) {
      if (!wait_fd(fd_.get(), POLLIN, deadline).ok()) return false;
      ssize_t n = ::recv(fd_.get(), skip, sizeof skip, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
  }

  // No more bytes from this side: the real side reads the end after them.
  void shut_down_writes() { ::shutdown(fd_.get(), SHUT_WR); }

  // Gone: the real side's writes from now on fail.
  void close() { fd_.reset(); }

  // This side's descriptor of the connection.
  int fd() const { return fd_.get(); }

  // The notice key of the real side's endpoint, from its hello (finish()).
  uint64_t peer_notice_key() const { return peer_notice_key_; }

 private:
  explicit RawEndpointPeer(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
  uint64_t peer_notice_key_ = 0;
};

}  // namespace rdmabuf::testing
