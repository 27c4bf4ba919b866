// Speaking the tcp backend's data protocol by hand (backends/tcp/protocol.h),
// for tests that play a peer which rdmabuf's own reader would never be:
// hostile, stalled, or one of hundreds driven by a few threads.
#pragma once

#include <cstring>

#include "backends/tcp/protocol.h"
#include "common/hello.h"
#include "common/socket.h"
#include "rdmabuf/buffer.h"

namespace rdmabuf::testing {

// A tcp data connection to the owner of `buffer`, its hello answered; an
// invalid Fd on failure.
inline Fd data_connection_to(const RemoteBuffer& buffer, Deadline deadline) {
  auto where = parse_host_port(buffer.owner().address);
  if (!where.ok()) return Fd();
  auto fd = connect_tcp(*where, deadline);
  if (!fd.ok()) return Fd();
  Hello hello{Channel::kTcpData, 9, buffer.owner().manager_id};
  if (!exchange_hello(fd->get(), hello, deadline).ok()) return Fd();
  return std::move(fd).value();
}

// A request on `buffer` as rdmabuf's reader would send it.
inline tcp::RequestHeader request_on(const RemoteBuffer& buffer, tcp::RequestKind kind,
                                     uint64_t request_id, uint64_t offset, uint64_t length) {
  tcp::RequestHeader h{};
  h.kind = static_cast<uint8_t>(kind);
  h.request_id = request_id;
  h.buffer_id = buffer.id();
  std::memcpy(h.token, buffer.token().data(), sizeof h.token);
  h.region_size = buffer.region_size();
  h.offset = offset;
  h.length = length;
  return h;
}

}  // namespace rdmabuf::testing
