#include "core/endpoint/frame_channel.h"

#include <sys/socket.h>

#include <cerrno>

#include "common/socket.h"

namespace rdmabuf::endpoint {
namespace {

size_t write_unit_of(const FrameChannel::Kind& kind) {
  const auto* rdma = std::get_if<RdmaFrames>(&kind);
  return rdma ? rdma->write_unit() : 0;
}

}  // namespace

FrameChannel::FrameChannel(Kind kind, int socket, uint64_t stream_limit, std::string description)
    : kind_(std::move(kind)),
      shm_(std::holds_alternative<ShmFrames>(kind_) ? std::get<ShmFrames>(kind_).rings() : nullptr),
      socket_(socket),
      stream_limit_(stream_limit),
      parts_(part_shape(!std::holds_alternative<TcpFrames>(kind_), write_unit_of(kind_))),
      description_(std::move(description)) {}

void FrameChannel::ring_doorbell() {
  const uint8_t bell = 1;
  // A full socket holds doorbells the reader has not taken yet: enough.
  // A broken one shows at the reader.
  (void)::send(socket_, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

bool FrameChannel::take_doorbells(bool& peer_closed) {
  uint8_t bells[64];
  bool took = false;
  // At most kMostReads reads a call: a peer that floods the connection
  // (which carries nothing but doorbells) cannot keep the reader here.
  constexpr int kMostReads = 16;
  for (int reads = 0; reads < kMostReads;) {
    const ssize_t n = ::recv(socket_, bells, sizeof bells, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      took = true;
      ++reads;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) peer_closed = true;
    break;
  }
  if (auto* rdma = std::get_if<RdmaFrames>(&kind_); rdma && rdma->take_wakeups()) took = true;
  return took;
}

Status TcpFrames::write(std::span<iovec> pieces, Deadline deadline, int stop_fd,
                        const std::function<void()>& while_blocked) {
  return send_gathered(socket_, pieces, deadline, stop_fd, while_blocked);
}

Result<size_t> TcpFrames::read_some(uint8_t* out, size_t size) {
  while (true) {
    const ssize_t n = ::recv(socket_, out, size, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return Unavailable("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Unavailable("recv: " + errno_text(errno));
  }
}

}  // namespace rdmabuf::endpoint
