// The tcp backend's data-stream protocol (after the hello, see common/hello.h).
//
// The reader sends requests; the owner answers each, in order, on the same
// connection. Many requests may be in flight; the owner never reorders.
//
//   request  (64 B): u8 kind | u8 flags=0 | u16 0 | u32 0 | u64 request id |
//                    u64 buffer id | u8[16] token | u64 region size | u64 offset |
//                    u64 length
//                    then, for a write, `length` payload bytes;
//                    for an atomic (length 8, the word), 16 operand bytes:
//                    fetch-add: u64 add | u64 0;
//                    compare-and-swap: u64 expected | u64 desired;
//                    for a scattered read or write, whose `offset` is the
//                    number of ranges n (1..4096) and `length` the sum of
//                    their lengths: n ranges of 16 B, u64 offset | u64
//                    length (within the buffer, length >= 1), then for a
//                    write the `length` payload bytes, range after range
//   response (24 B): u8 kind|0x80 | u8 status | u16 0 | u32 0 | u64 request id |
//                    u64 payload length
//                    then, for a successful read, `length` payload bytes
//                    (a scattered read's: range after range);
//                    for a successful atomic, 8: the word's previous value
//
// A scattered request is answered as one: every range is checked against
// the buffer before a byte moves, and one out of bounds refuses them all
// (kInvalidArgument).
//
// The owner applies an atomic on its CPU once its operands are whole, to
// an 8-byte aligned word (otherwise kInvalidArgument), and refuses atomics
// on GPU memory (kInvalidArgument).
// A write's payload always follows its header in full, even when the owner
// will refuse it (the owner discards it), so the stream never loses framing.
// `region size` is the buffer size the reader's handle claims: the owner
// refuses every request whose claim differs from the registered size, so a
// handle forged to look larger than its buffer moves no byte at all, not
// even through the chunks of its op that happen to lie within bounds.
//
// The owner may close a connection that is between requests, to make room
// for others: it first sends a goodbye (a response of kind kGoodbye with
// request id 0, status 0 and no payload), and takes no request from that
// connection after it. The reader sends every request it has not had a
// reply to again, on a new connection: none of them was applied.
// Anything else that breaks these rules is a protocol error: the receiving
// side closes the connection. All integers are little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "rdmabuf/status.h"

namespace rdmabuf::tcp {

enum class RequestKind : uint8_t {
  kRead = 1,
  kWrite = 2,
  kFetchAdd = 3,
  kCompareAndSwap = 4,
  kReadRanges = 5,
  kWriteRanges = 6,
};
constexpr bool is_atomic(uint8_t kind) {
  return kind == static_cast<uint8_t>(RequestKind::kFetchAdd) ||
         kind == static_cast<uint8_t>(RequestKind::kCompareAndSwap);
}
constexpr bool is_scattered(uint8_t kind) {
  return kind == static_cast<uint8_t>(RequestKind::kReadRanges) ||
         kind == static_cast<uint8_t>(RequestKind::kWriteRanges);
}
// Whether a successful reply carries `length` bytes of the buffer.
constexpr bool is_read(uint8_t kind) {
  return kind == static_cast<uint8_t>(RequestKind::kRead) ||
         kind == static_cast<uint8_t>(RequestKind::kReadRanges);
}
// Whether `length` payload bytes follow the request.
constexpr bool is_write(uint8_t kind) {
  return kind == static_cast<uint8_t>(RequestKind::kWrite) ||
         kind == static_cast<uint8_t>(RequestKind::kWriteRanges);
}
// A scattered request's ranges: the most one request carries, and one's size.
constexpr uint64_t kMaxRequestRanges = 4096;
struct WireRange {
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(WireRange) == 16, "the wire layout has no padding");
// What follows an atomic's header, and the word it acts on.
constexpr size_t kAtomicOperandBytes = 16;
constexpr uint64_t kAtomicWordBytes = 8;
constexpr uint8_t kResponseBit = 0x80;
// The kind of the owner's goodbye before it closes an idle connection.
constexpr uint8_t kGoodbye = kResponseBit | 0x7f;

// Longest payload one request may carry. Ops are cut into chunks of at most
// Config::chunk_size (<= 1 GiB), so this is never a limit for callers.
constexpr uint64_t kMaxRequestBytes = uint64_t{1} << 30;

struct RequestHeader {
  uint8_t kind;
  uint8_t flags;
  uint16_t reserved0;
  uint32_t reserved1;
  uint64_t request_id;
  uint64_t buffer_id;
  uint8_t token[16];
  uint64_t region_size;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(RequestHeader) == 64, "the wire layout has no padding");

struct ResponseHeader {
  uint8_t kind;
  uint8_t status;
  uint16_t reserved0;
  uint32_t reserved1;
  uint64_t request_id;
  uint64_t payload;
};
static_assert(sizeof(ResponseHeader) == 24, "the wire layout has no padding");

// Range `k` of the list at `ranges`.
inline WireRange wire_range(const uint8_t* ranges, uint64_t k) {
  WireRange r;
  std::memcpy(&r, ranges + k * sizeof r, sizeof r);  // unaligned in a stream
  return r;
}
// Validates a scattered request's ranges (after its header `h`): none
// empty, their lengths adding up to the header's. Non-OK means the peer
// broke the protocol; bounds are the owner's to check.
inline Status check_ranges(const RequestHeader& h, const uint8_t* ranges) {
  uint64_t sum = 0;
  for (uint64_t k = 0; k < h.offset; ++k) {
    const WireRange r = wire_range(ranges, k);
    if (r.length == 0) return ProtocolError("scattered request with an empty range");
    if (r.length > h.length - sum) {
      return ProtocolError("scattered request whose ranges add up to more than its length");
    }
    sum += r.length;
  }
  if (sum != h.length) {
    return ProtocolError("scattered request whose ranges add up to less than its length");
  }
  return Status::Ok();
}

// Validates a request's fixed fields (not the buffer: that is the owner's
// registry's job). Non-OK means the peer broke the protocol.
inline Status check_request(const RequestHeader& h) {
  if (!is_read(h.kind) && !is_write(h.kind) && !is_atomic(h.kind)) {
    return ProtocolError("request of unknown kind " + std::to_string(h.kind));
  }
  if (h.flags != 0 || h.reserved0 != 0 || h.reserved1 != 0) {
    return ProtocolError("request with reserved bits set");
  }
  if (h.length == 0 || h.length > kMaxRequestBytes) {
    return ProtocolError("request length " + std::to_string(h.length) + " outside 1..1 GiB");
  }
  if (is_atomic(h.kind) && h.length != kAtomicWordBytes) {
    return ProtocolError("atomic on " + std::to_string(h.length) + " bytes, not an 8-byte word");
  }
  if (is_scattered(h.kind) && (h.offset == 0 || h.offset > kMaxRequestRanges)) {
    return ProtocolError("scattered request of " + std::to_string(h.offset) +
                         " ranges, outside 1.." + std::to_string(kMaxRequestRanges));
  }
  return Status::Ok();
}

// The status codes an owner may answer with; any other is a protocol error.
inline bool is_response_status(uint8_t code) {
  switch (static_cast<StatusCode>(code)) {
    case StatusCode::kOk:
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied:
    case StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

}  // namespace rdmabuf::tcp
