// The ibverbs backend's control channel (after the hello, see
// common/hello.h): the reader asks the owner for a queue pair on one of its
// devices, presenting a handle it holds, and then for access to each buffer
// whose handle it holds; the owner answers each with the remote key that
// opens that buffer to this queue pair alone (a memory window bound to it,
// where the device has them). The owner keeps its side of the pair, and
// the access it granted, while this connection stays open.
//
//   connect  (reader):  "RBIV" | u16 version | u16 0 | char[64] owner device | endpoint | handle
//   accepted (owner):   u8 status | u8[7] 0 | endpoint | u32 message length | message
//   query    (reader):  u8 1 | u8[7] 0 | handle
//   answer   (owner):   u8 status | u8[7] 0 | u64 buffer id | u32 rkey | u32 0
//   endpoint (32 B):    u32 qpn | u32 psn | u8[16] gid | u16 lid | u8 mtu | u8 0 | u32 0
//   handle   (32 B):    u64 buffer id | u8[16] token | u64 region size
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backends/ibverbs/handle_context.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/wire.h"
#include "rdmabuf/backend.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf::ibverbs {

// A queue pair's endpoint as the handshakes carry it (kEndpointBytes).
constexpr size_t kEndpointBytes = 32;
void put_endpoint(WireWriter& w, const Endpoint& e);
// kProtocolError when malformed.
Result<Endpoint> get_endpoint(WireReader& r);

// What a reader presents of a handle it holds: the buffer's id, token and
// size, as the handle says (the owner checks all three).
struct HandleClaim {
  uint64_t id = 0;
  Token token{};
  uint64_t region_size = 0;
  static HandleClaim of(const RemoteBuffer& handle) {
    return {handle.id(), handle.token(), handle.region_size()};
  }
  bool operator==(const HandleClaim&) const = default;
};

// The owner's answers that stay true for good (ids are never reused): the
// handle names no buffer of the owner's, or not with this token or size.
inline bool refuses_claim(StatusCode code) {
  return code == StatusCode::kNotFound || code == StatusCode::kPermissionDenied ||
         code == StatusCode::kInvalidArgument;
}

// Reader side. The connect request presents `claim`: the owner sets up no
// queue pair for a reader that holds no handle of its.
Status send_connect(int fd, const std::string& owner_device, const Endpoint& mine,
                    const HandleClaim& claim, Deadline deadline, int stop_fd);
Result<Endpoint> read_accepted(int fd, Deadline deadline, int stop_fd);
// Asks for access to the buffer `claim` names. The owner answers queries in
// the order they were sent.
Status send_query(int fd, const HandleClaim& claim, Deadline deadline, int stop_fd);
constexpr size_t kAnswerBytes = 24;
struct BufferAnswer {
  uint64_t id = 0;
  // OK, kNotFound, kPermissionDenied (token), kInvalidArgument (size), or
  // kResourceExhausted (the owner could not open the buffer to the pair).
  StatusCode code = StatusCode::kOk;
  // With OK: the remote key that reaches the buffer through this queue pair.
  uint32_t rkey = 0;
};
Result<BufferAnswer> parse_answer(std::span<const uint8_t, kAnswerBytes> bytes);

// Owner side. The parse_ and encode_ forms are for a caller that moves the
// bytes itself (responder.h); the others wait on `fd`.
struct ConnectRequest {
  std::string device;
  Endpoint endpoint;
  HandleClaim claim;
};
constexpr size_t kClaimBytes = 32;
constexpr size_t kConnectBytes = 8 + kDeviceNameBytes + kEndpointBytes + kClaimBytes;
Result<ConnectRequest> parse_connect(std::span<const uint8_t, kConnectBytes> bytes);
Result<ConnectRequest> read_connect(int fd, Deadline deadline, int stop_fd);
std::vector<uint8_t> encode_accepted(const Status& status, const Endpoint& mine);
Status send_accepted(int fd, const Status& status, const Endpoint& mine, Deadline deadline,
                     int stop_fd);
constexpr size_t kQueryBytes = 8 + kClaimBytes;
Result<HandleClaim> parse_query(std::span<const uint8_t, kQueryBytes> bytes);
// Waits (without a deadline) for the next query; kUnavailable when the
// reader closed the connection.
Result<HandleClaim> read_query(int fd, int stop_fd);
std::vector<uint8_t> encode_answer(const BufferAnswer& answer);
Status send_answer(int fd, const BufferAnswer& answer, int stop_fd);

// A tagged write's notice (rdmabuf/backend.h, WriteNotice): the one SEND a
// writer posts behind the write's WRITEs on the same queue pair, into one of
// the receives the owner keeps posted on its side (docs/wire-format.md,
// "Notices"). RC delivers in order, so the owner's NIC takes it only once
// the bytes before it have landed.
//
//   notice (56 B):  "RBNT" | u32 tag | u64 endpoint key | u64 buffer id |
//                   u64 offset | u64 length | u8[16] token
constexpr size_t kNoticeBytes = 56;
std::array<uint8_t, kNoticeBytes> encode_notice(const NoticeRecord& notice);
// kProtocolError for any other size or magic.
Result<NoticeRecord> decode_notice(std::span<const uint8_t> bytes);

// The RDMA channel's SENDs carry, as their immediate, the low 32 bits of
// their sender's count of receives posted (docs/wire-format.md, "The RDMA
// channel"). The count `low` stands for, widened against `last`, the
// largest heard so far: counts only grow, and by less than 2^31 between two
// SENDs, so one at or behind `last` (older, or a lie) gives `last`.
inline uint64_t widen_posted_count(uint64_t last, uint32_t low) {
  const uint32_t ahead = low - static_cast<uint32_t>(last);
  return ahead < (uint32_t{1} << 31) ? last + ahead : last;
}

}  // namespace rdmabuf::ibverbs
