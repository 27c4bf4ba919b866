#include "backends/ibverbs/handshake.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/socket.h"
#include "common/wire.h"

namespace rdmabuf::ibverbs {
namespace {

constexpr uint8_t kMagic[4] = {'R', 'B', 'I', 'V'};
// 2: a handle in the connect request, a remote key in each answer
constexpr uint16_t kVersion = 2;
constexpr uint32_t kMaxMessage = 1024;
constexpr uint8_t kQueryBuffer = 1;
constexpr uint8_t kNoticeMagic[4] = {'R', 'B', 'N', 'T'};

// True when the next `size` bytes of `r` are there and all zero.
bool zeros(WireReader& r, size_t size) {
  auto bytes = r.view(size);
  return r.ok() && std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

Status send_all(int fd, const std::vector<uint8_t>& out, Deadline deadline, int stop_fd) {
  return send_exact(fd, out.data(), out.size(), deadline, stop_fd);
}

void put_claim(WireWriter& w, const HandleClaim& c) {
  w.put<uint64_t>(c.id);
  w.bytes(c.token.data(), c.token.size());
  w.put<uint64_t>(c.region_size);
}

HandleClaim get_claim(WireReader& r) {
  HandleClaim c;
  c.id = r.get<uint64_t>();
  r.bytes(c.token.data(), c.token.size());
  c.region_size = r.get<uint64_t>();
  return c;
}

}  // namespace

void put_endpoint(WireWriter& w, const Endpoint& e) {
  w.put<uint32_t>(e.qpn);
  w.put<uint32_t>(e.psn);
  w.bytes(e.gid.raw, sizeof e.gid.raw);
  w.put<uint16_t>(e.lid);
  w.put<uint8_t>(e.mtu);
  w.put<uint8_t>(0);
  w.put<uint32_t>(0);
}

Result<Endpoint> get_endpoint(WireReader& r) {
  Endpoint e;
  e.qpn = r.get<uint32_t>();
  e.psn = r.get<uint32_t>();
  r.bytes(e.gid.raw, sizeof e.gid.raw);
  e.lid = r.get<uint16_t>();
  e.mtu = r.get<uint8_t>();
  uint8_t reserved0 = r.get<uint8_t>();
  uint32_t reserved1 = r.get<uint32_t>();
  if (!r.ok() || e.psn > 0xffffff || e.mtu < IBV_MTU_256 || e.mtu > IBV_MTU_4096 ||
      reserved0 != 0 || reserved1 != 0) {
    return ProtocolError("malformed queue pair endpoint");
  }
  return e;
}

Status send_connect(int fd, const std::string& owner_device, const Endpoint& mine,
                    const HandleClaim& claim, Deadline deadline, int stop_fd) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.bytes(kMagic, sizeof kMagic);
  w.put<uint16_t>(kVersion);
  w.put<uint16_t>(0);
  char device[kDeviceNameBytes] = {};
  std::strncpy(device, owner_device.c_str(), sizeof device - 1);
  w.bytes(device, sizeof device);
  put_endpoint(w, mine);
  put_claim(w, claim);
  return send_all(fd, out, deadline, stop_fd);
}

Result<ConnectRequest> parse_connect(std::span<const uint8_t, kConnectBytes> bytes) {
  WireReader r(bytes);
  if (std::memcmp(r.view(4).data(), kMagic, 4) != 0 || r.get<uint16_t>() != kVersion ||
      r.get<uint16_t>() != 0) {
    return ProtocolError("not an rdmabuf ibverbs connect request");
  }
  ConnectRequest request;
  auto name = r.view(kDeviceNameBytes);
  // The name, then NUL padding to the end of the field (at least one NUL).
  size_t length = strnlen(reinterpret_cast<const char*>(name.data()), name.size());
  if (length == name.size() ||
      !std::all_of(name.begin() + length, name.end(), [](uint8_t b) { return b == 0; })) {
    return ProtocolError("malformed device name in an ibverbs connect request");
  }
  request.device.assign(reinterpret_cast<const char*>(name.data()), length);
  RDMABUF_ASSIGN_OR_RETURN(request.endpoint, get_endpoint(r));
  request.claim = get_claim(r);
  return request;
}

Result<ConnectRequest> read_connect(int fd, Deadline deadline, int stop_fd) {
  uint8_t in[kConnectBytes];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, in, sizeof in, deadline, stop_fd));
  return parse_connect(in);
}

std::vector<uint8_t> encode_accepted(const Status& status, const Endpoint& mine) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  std::string message = status.message().substr(0, kMaxMessage);
  w.put<uint8_t>(static_cast<uint8_t>(status.code()));
  for (int i = 0; i < 7; ++i)
    w.put<uint8_t>(0);
  put_endpoint(w, mine);
  w.put<uint32_t>(static_cast<uint32_t>(message.size()));
  w.bytes(message.data(), message.size());
  return out;
}

Status send_accepted(int fd, const Status& status, const Endpoint& mine, Deadline deadline,
                     int stop_fd) {
  return send_all(fd, encode_accepted(status, mine), deadline, stop_fd);
}

Result<Endpoint> read_accepted(int fd, Deadline deadline, int stop_fd) {
  uint8_t in[8 + kEndpointBytes + 4];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, in, sizeof in, deadline, stop_fd));
  WireReader r(in);
  auto code = static_cast<StatusCode>(r.get<uint8_t>());
  bool reserved_zero = zeros(r, 7);
  auto endpoint = get_endpoint(r);
  uint32_t length = r.get<uint32_t>();
  if (length > kMaxMessage || code > StatusCode::kInternal || !reserved_zero) {
    return ProtocolError("malformed queue pair answer");
  }
  std::string message(length, '\0');
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, message.data(), length, deadline, stop_fd));
  if (code != StatusCode::kOk) return Status(code, message);
  return endpoint;
}

Status send_query(int fd, const HandleClaim& claim, Deadline deadline, int stop_fd) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint8_t>(kQueryBuffer);
  for (int i = 0; i < 7; ++i)
    w.put<uint8_t>(0);
  put_claim(w, claim);
  return send_all(fd, out, deadline, stop_fd);
}

Result<BufferAnswer> parse_answer(std::span<const uint8_t, kAnswerBytes> bytes) {
  WireReader r(bytes);
  BufferAnswer answer;
  answer.code = static_cast<StatusCode>(r.get<uint8_t>());
  bool reserved_zero = zeros(r, 7);
  answer.id = r.get<uint64_t>();
  answer.rkey = r.get<uint32_t>();
  const bool reserved_too = zeros(r, 4);
  if (!r.ok() || answer.code > StatusCode::kInternal || !reserved_zero || !reserved_too ||
      (answer.code != StatusCode::kOk && answer.rkey != 0)) {
    return ProtocolError("malformed answer about a buffer");
  }
  return answer;
}

Result<HandleClaim> parse_query(std::span<const uint8_t, kQueryBytes> bytes) {
  WireReader r(bytes);
  if (r.get<uint8_t>() != kQueryBuffer) return ProtocolError("unknown ibverbs control request");
  if (!zeros(r, 7)) return ProtocolError("ibverbs control request with reserved bits set");
  return get_claim(r);
}

Result<HandleClaim> read_query(int fd, int stop_fd) {
  uint8_t in[kQueryBytes];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, in, sizeof in, Deadline::max(), stop_fd));
  return parse_query(in);
}

std::vector<uint8_t> encode_answer(const BufferAnswer& answer) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint8_t>(static_cast<uint8_t>(answer.code));
  for (int i = 0; i < 7; ++i)
    w.put<uint8_t>(0);
  w.put<uint64_t>(answer.id);
  w.put<uint32_t>(answer.code == StatusCode::kOk ? answer.rkey : 0);
  w.put<uint32_t>(0);
  return out;
}

Status send_answer(int fd, const BufferAnswer& answer, int stop_fd) {
  return send_all(fd, encode_answer(answer), Clock::now() + std::chrono::seconds(10), stop_fd);
}

std::array<uint8_t, kNoticeBytes> encode_notice(const NoticeRecord& notice) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.bytes(kNoticeMagic, sizeof kNoticeMagic);
  w.put<uint32_t>(notice.tag);
  w.put<uint64_t>(notice.endpoint_key);
  w.put<uint64_t>(notice.buffer_id);
  w.put<uint64_t>(notice.offset);
  w.put<uint64_t>(notice.length);
  w.bytes(notice.token.data(), notice.token.size());
  std::array<uint8_t, kNoticeBytes> bytes{};
  std::copy(out.begin(), out.end(), bytes.begin());
  return bytes;
}

Result<NoticeRecord> decode_notice(std::span<const uint8_t> bytes) {
  if (bytes.size() != kNoticeBytes) {
    return ProtocolError("a notice of " + std::to_string(bytes.size()) + " bytes (not " +
                         std::to_string(kNoticeBytes) + ")");
  }
  WireReader r(bytes);
  auto magic = r.view(sizeof kNoticeMagic);
  if (!std::equal(magic.begin(), magic.end(), kNoticeMagic)) {
    return ProtocolError("a SEND that is not a notice");
  }
  NoticeRecord notice;
  notice.tag = r.get<uint32_t>();
  notice.endpoint_key = r.get<uint64_t>();
  notice.buffer_id = r.get<uint64_t>();
  notice.offset = r.get<uint64_t>();
  notice.length = r.get<uint64_t>();
  r.bytes(notice.token.data(), notice.token.size());
  if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed notice");
  return notice;
}

}  // namespace rdmabuf::ibverbs
