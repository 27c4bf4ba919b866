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
//                    compare-and-swap: u64 expected | u64 desired
//   response (24 B): u8 kind|0x80 | u8 status | u16 0 | u32 0 | u64 request id |
//                    u64 payload length
//                    then, for a successful read, `length` payload bytes;
//                    for a successful atomic, 8: the word's previous value
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

enum class RequestKind : uint8_t { kRead = 1, kWrite = 2, kFetchAdd = 3, kCompareAndSwap = 4 };
constexpr bool is_atomic(uint8_t kind) {
  return kind == static_cast<uint8_t>(RequestKind::kFetchAdd) ||
         kind == static_cast<uint8_t>(RequestKind::kCompareAndSwap);
}
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

// Validates a request's fixed fields (not the buffer: that is the owner's
// registry's job). Non-OK means the peer broke the protocol.
inline Status check_request(const RequestHeader& h) {
  if (h.kind != static_cast<uint8_t>(RequestKind::kRead) &&
      h.kind != static_cast<uint8_t>(RequestKind::kWrite) && !is_atomic(h.kind)) {
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
