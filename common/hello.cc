#include "common/hello.h"

#include <cstring>
#include <vector>

#include "common/socket.h"
#include "common/strings.h"
#include "common/wire.h"

namespace rdmabuf {
namespace {
constexpr uint8_t kHelloMagic[4] = {'R', 'B', 'H', 'I'};
constexpr uint8_t kReplyMagic[4] = {'R', 'B', 'O', 'K'};
constexpr uint32_t kMaxMessage = 1024;
}  // namespace

std::vector<uint8_t> encode_hello(const Hello& hello) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.bytes(kHelloMagic, 4);
  w.put<uint16_t>(kProtocolVersion);
  w.put<uint8_t>(static_cast<uint8_t>(hello.channel));
  w.put<uint8_t>(0);
  w.put<uint64_t>(hello.caller_id);
  w.put<uint64_t>(hello.expected_id);
  return out;
}

Result<uint32_t> hello_reply_message_bytes(const uint8_t (&fixed)[kHelloReplyBytes]) {
  WireReader r(fixed);
  if (std::memcmp(r.view(4).data(), kReplyMagic, 4) != 0) {
    return ProtocolError("the listener did not answer with an rdmabuf hello reply");
  }
  uint16_t version = r.get<uint16_t>();
  auto code = static_cast<StatusCode>(r.get<uint8_t>());
  uint8_t reserved0 = r.get<uint8_t>();
  r.get<uint64_t>();  // the server's id
  uint32_t msg_len = r.get<uint32_t>();
  uint32_t reserved1 = r.get<uint32_t>();
  if (version != kProtocolVersion) {
    return ProtocolError("the listener speaks protocol version " + std::to_string(version) +
                         ", this rdmabuf speaks " + std::to_string(kProtocolVersion));
  }
  if (msg_len > kMaxMessage || code > StatusCode::kInternal || reserved0 != 0 || reserved1 != 0) {
    return ProtocolError("malformed hello reply");
  }
  return msg_len;
}

Result<uint64_t> check_hello_reply(const uint8_t (&fixed)[kHelloReplyBytes],
                                   std::string_view message, const Hello& hello) {
  WireReader r(fixed);
  r.view(6);  // magic and version, checked by hello_reply_message_bytes
  auto code = static_cast<StatusCode>(r.get<uint8_t>());
  r.get<uint8_t>();
  const uint64_t server_id = r.get<uint64_t>();
  if (code != StatusCode::kOk) return Status(code, std::string(message));
  if (hello.expected_id != 0 && server_id != hello.expected_id) {
    // Whoever listens there is not the manager the handle names (a forged
    // or stale address): tell it nothing more.
    return NotFound("the listener is manager " + hex_id(server_id) + ", not the handle's owner " +
                    hex_id(hello.expected_id));
  }
  return server_id;
}

Result<uint64_t> exchange_hello(int fd, const Hello& hello, Deadline deadline, int stop_fd) {
  const std::vector<uint8_t> out = encode_hello(hello);
  RDMABUF_RETURN_IF_ERROR(send_exact(fd, out.data(), out.size(), deadline, stop_fd));
  uint8_t reply[kHelloReplyBytes];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, reply, sizeof reply, deadline, stop_fd));
  RDMABUF_ASSIGN_OR_RETURN(uint32_t msg_len, hello_reply_message_bytes(reply));
  std::string message(msg_len, '\0');
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, message.data(), msg_len, deadline, stop_fd));
  return check_hello_reply(reply, message, hello);
}

Result<Hello> read_hello(int fd, Deadline deadline, int stop_fd) {
  uint8_t in[kHelloBytes];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, in, sizeof in, deadline, stop_fd));
  return parse_hello(in);
}

Result<Hello> parse_hello(const uint8_t (&in)[kHelloBytes]) {
  WireReader r(in);
  if (std::memcmp(r.view(4).data(), kHelloMagic, 4) != 0) {
    return ProtocolError("connection did not start with an rdmabuf hello");
  }
  uint16_t version = r.get<uint16_t>();
  if (version != kProtocolVersion) {
    return ProtocolError("hello with protocol version " + std::to_string(version) +
                         ", this rdmabuf speaks " + std::to_string(kProtocolVersion));
  }
  Hello hello;
  hello.channel = static_cast<Channel>(r.get<uint8_t>());
  if (r.get<uint8_t>() != 0) return ProtocolError("hello with reserved bits set");
  hello.caller_id = r.get<uint64_t>();
  hello.expected_id = r.get<uint64_t>();
  return hello;
}

Status send_hello_reply(int fd, uint64_t server_id, const Status& status, Deadline deadline,
                        int stop_fd) {
  std::string message = status.message().substr(0, kMaxMessage);
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.bytes(kReplyMagic, 4);
  w.put<uint16_t>(kProtocolVersion);
  w.put<uint8_t>(static_cast<uint8_t>(status.code()));
  w.put<uint8_t>(0);
  w.put<uint64_t>(server_id);
  w.put<uint32_t>(static_cast<uint32_t>(message.size()));
  w.put<uint32_t>(0);
  w.bytes(message.data(), message.size());
  return send_exact(fd, out.data(), out.size(), deadline, stop_fd);
}

}  // namespace rdmabuf
