// The hello that starts every connection to a manager's listener: which
// channel the connection is for (control plane, tcp data, ...), who is
// calling, and which manager the caller expects to reach. The listener
// answers with a status; a non-OK answer is followed by closing. `stop_fd`
// as in common/socket.h.
//
//   hello (24 B):  "RBHI" | u16 version | u8 channel | u8 0 | u64 caller id | u64 expected id
//   reply (24 B):  "RBOK" | u16 version | u8 status | u8 0 | u64 server id | u32 msg len | u32 0
//                  then msg len (<= 1024) bytes of message
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rdmabuf/status.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

enum class Channel : uint8_t {
  kControl = 1,  // manager-to-manager requests (core)
  kTcpData = 2,  // the tcp backend's data streams
  kIbverbs = 3,  // the ibverbs backend's queue pair handshakes
};

constexpr uint16_t kProtocolVersion = 1;

struct Hello {
  Channel channel = Channel::kControl;
  uint64_t caller_id = 0;
  // The manager id the caller expects (from a handle); 0 accepts any.
  uint64_t expected_id = 0;
};

// Caller side: sends `hello` on `fd`, reads the reply before `deadline`.
// Returns the server's manager id, or the status it answered with, or
// kNotFound when the server is not hello.expected_id (checked on both
// sides: a listener that answers OK under another id is refused here), or
// kProtocolError when the other end does not speak this protocol.
Result<uint64_t> exchange_hello(int fd, const Hello& hello, Deadline deadline, int stop_fd = -1);

constexpr size_t kHelloBytes = 24;
constexpr size_t kHelloReplyBytes = 24;  // then the message

// The same in pieces, for a caller that does not block: the hello's bytes;
// from a reply's fixed part, how many message bytes follow (or
// kProtocolError); and from the whole reply, what exchange_hello returns.
std::vector<uint8_t> encode_hello(const Hello& hello);
Result<uint32_t> hello_reply_message_bytes(const uint8_t (&fixed)[kHelloReplyBytes]);
Result<uint64_t> check_hello_reply(const uint8_t (&fixed)[kHelloReplyBytes],
                                   std::string_view message, const Hello& hello);

// Listener side: reads and validates a hello. kProtocolError for bytes that
// are not an rdmabuf hello or name an unknown version.
Result<Hello> read_hello(int fd, Deadline deadline, int stop_fd = -1);
// The same, for a hello already received.
Result<Hello> parse_hello(const uint8_t (&bytes)[kHelloBytes]);
// Listener side: answers a hello.
Status send_hello_reply(int fd, uint64_t server_id, const Status& status, Deadline deadline,
                        int stop_fd = -1);

}  // namespace rdmabuf
