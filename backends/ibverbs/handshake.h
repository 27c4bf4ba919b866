// The ibverbs backend's control channel (after the hello, see
// common/hello.h): the reader asks the owner for a queue pair on one of its
// devices, and later may ask whether a buffer is still registered. The
// owner keeps its side of the pair while this connection stays open.
//
//   connect  (reader):  "RBIV" | u16 version | u16 0 | char[64] owner device | endpoint
//   accepted (owner):   u8 status | u8[7] 0 | endpoint | u32 message length | message
//   query    (reader):  u8 1 | u8[7] 0 | u64 buffer id | u8[16] token | u64 region size
//   answer   (owner):   u8 status | u8[7] 0 | u64 buffer id
//   endpoint (32 B):    u32 qpn | u32 psn | u8[16] gid | u16 lid | u8 mtu | u8 0 | u32 0
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

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

// Reader side.
Status send_connect(int fd, const std::string& owner_device, const Endpoint& mine,
                    Deadline deadline, int stop_fd);
Result<Endpoint> read_accepted(int fd, Deadline deadline, int stop_fd);
// Asks whether the owner has buffer `id` with `token` and `region_size`.
// The owner answers queries in the order they were sent.
Status send_query(int fd, uint64_t id, const Token& token, uint64_t region_size, Deadline deadline,
                  int stop_fd);
constexpr size_t kAnswerBytes = 16;
struct BufferAnswer {
  uint64_t id = 0;
  // OK, kNotFound, kPermissionDenied (token) or kInvalidArgument (size).
  StatusCode code = StatusCode::kOk;
};
Result<BufferAnswer> parse_answer(std::span<const uint8_t, kAnswerBytes> bytes);

// Owner side.
struct ConnectRequest {
  std::string device;
  Endpoint endpoint;
};
Result<ConnectRequest> read_connect(int fd, Deadline deadline, int stop_fd);
Status send_accepted(int fd, const Status& status, const Endpoint& mine, Deadline deadline,
                     int stop_fd);
struct BufferQuery {
  uint64_t id = 0;
  Token token{};
  uint64_t region_size = 0;
};
// Waits (without a deadline) for the next query; kUnavailable when the
// reader closed the connection.
Result<BufferQuery> read_query(int fd, int stop_fd);
Status send_answer(int fd, uint64_t id, StatusCode code, int stop_fd);

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
