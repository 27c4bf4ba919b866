#include "core/endpoint/frames.h"

namespace rdmabuf::endpoint {

Status payload_too_large(uint32_t size) {
  return ProtocolError("endpoint frame of " + std::to_string(size) + " bytes (at most " +
                       std::to_string(kMaxPayload) + ")");
}

std::span<const uint8_t> text_bytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), std::min<size_t>(text.size(), 1024)};
}

namespace {

std::string as_text(std::span<const uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// A handle's bytes, copied first: they may lie where the peer can write
// them, and decoding reads them more than once.
Result<RemoteBuffer> handle_from(std::span<const uint8_t> bytes) {
  const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  return RemoteBuffer::from_bytes(copy);
}

}  // namespace

FrameBuilder answer_frame(Frame type, uint64_t seq, uint64_t value) {
  FrameBuilder f(type);
  f.u64(seq).u64(value);
  return f;
}

Result<uint64_t> decode_withdrawn(std::span<const uint8_t> payload) {
  WireReader r(payload);
  const uint64_t seq = r.get<uint64_t>();
  if (!r.ok() || r.remaining() != 8) return ProtocolError("malformed endpoint withdrawal");
  return seq;
}

Status malformed(Frame type) {
  switch (type) {
    case Frame::kPosted:
      return ProtocolError("malformed endpoint credit");
    case Frame::kSentPart:
      return ProtocolError("malformed endpoint message part");
    default:
      return ProtocolError("malformed endpoint answer");
  }
}

Status decode_credit(std::span<const uint8_t> payload, Credit& credit) {
  if (payload.size() == kBareCreditPayload) {
    return decode_bare_credit(payload, credit) ? Status::Ok() : malformed(Frame::kPosted);
  }
  WireReader r(payload);
  credit.seq = r.get<uint64_t>();
  credit.capacity = r.get<uint64_t>();
  auto handle = r.view(r.get<uint16_t>());
  if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint credit");
  if (!handle.empty()) {
    auto buffer = handle_from(handle);
    if (!buffer.ok()) {
      return ProtocolError("endpoint credit with a bad handle: " + buffer.status().message());
    }
    credit.buffer = std::move(buffer).value();
  }
  if (credit.buffer.valid() && credit.capacity > credit.buffer.size()) {
    return ProtocolError("endpoint credit larger than its buffer");
  }
  return Status::Ok();
}

Status decode_request(Frame type, std::span<const uint8_t> payload, Request& out) {
  WireReader r(payload);
  out.id = r.get<uint64_t>();
  out.second = r.get<uint64_t>();
  out.third = type == Frame::kHandleWanted ? 0 : r.get<uint64_t>();
  if (r.ok() && r.remaining() == 0) return Status::Ok();
  switch (type) {
    case Frame::kLendRequest:
      return ProtocolError("malformed lend request");
    case Frame::kRenew:
      return ProtocolError("malformed lease renewal");
    default:
      return ProtocolError("malformed endpoint handle request");
  }
}

FrameBuilder request_frame(Frame type, const Request& request) {
  FrameBuilder f(type);
  f.u64(request.id).u64(request.second);
  if (type != Frame::kHandleWanted) f.u64(request.third);
  return f;
}

Status decode_reply(std::span<const uint8_t> payload, Reply& out) {
  WireReader r(payload);
  out.id = r.get<uint64_t>();
  out.code = static_cast<StatusCode>(r.get<uint8_t>());
  out.value = r.get<uint64_t>();
  out.body = r.view(r.get<uint16_t>());
  if (!r.ok() || r.remaining() != 0 || out.code > StatusCode::kInternal) {
    return ProtocolError("malformed endpoint reply");
  }
  return Status::Ok();
}

FrameBuilder reply_frame(Frame type, uint64_t id, const Status& status, uint64_t value,
                         std::span<const uint8_t> body) {
  FrameBuilder f(type);
  f.u64(id).u8(static_cast<uint8_t>(status.code()));
  f.u64(value).blob(status.ok() ? body : text_bytes(status.message()));
  return f;
}

Status decode_notify(std::span<const uint8_t> payload, Notice& out) {
  WireReader r(payload);
  out.tag = r.get<uint32_t>();
  out.buffer_id = r.get<uint64_t>();
  out.offset = r.get<uint64_t>();
  out.length = r.get<uint64_t>();
  if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint notification");
  return Status::Ok();
}

FrameBuilder notify_frame(const Notice& notice) {
  FrameBuilder f(Frame::kNotify);
  f.fields().put<uint32_t>(notice.tag);
  f.u64(notice.buffer_id).u64(notice.offset).u64(notice.length);
  return f;
}

Result<RemoteBuffer> decode_buffer(std::span<const uint8_t> payload) {
  WireReader r(payload);
  auto bytes = r.view(r.get<uint16_t>());
  if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint handle");
  auto buffer = handle_from(bytes);
  if (!buffer.ok()) {
    return ProtocolError("the peer passed a bad handle: " + buffer.status().message());
  }
  return buffer;
}

FrameBuilder buffer_frame(std::span<const uint8_t> handle) {
  FrameBuilder f(Frame::kBuffer);
  f.blob(handle);
  return f;
}

Result<Hello> decode_hello(Frame type, std::span<const uint8_t> payload) {
  WireReader r(payload);
  const uint32_t magic = r.get<uint32_t>();
  const uint16_t version = r.get<uint16_t>();
  Hello peer;
  peer.manager_id = r.get<uint64_t>();
  peer.notice_key = r.get<uint64_t>();
  if (type != Frame::kHello || magic != kMagic) {
    return ProtocolError("the peer is not an rdmabuf endpoint");
  }
  if (version != kVersion) {
    return ProtocolError("endpoint protocol version " + std::to_string(version) +
                         " (this side speaks " + std::to_string(kVersion) + ")");
  }
  if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint hello");
  return peer;
}

FrameBuilder hello_frame(const Hello& hello) {
  FrameBuilder f(Frame::kHello);
  f.fields().put<uint32_t>(kMagic);
  f.fields().put<uint16_t>(kVersion);
  f.u64(hello.manager_id).u64(hello.notice_key);
  return f;
}

Result<ChannelOffer> decode_channel_offer(Frame type, std::span<const uint8_t> payload) {
  WireReader r(payload);
  ChannelOffer offer;
  const uint8_t shared_memory = r.get<uint8_t>();
  if (shared_memory == 1) {
    offer.pid = r.get<uint32_t>();
    offer.fd = r.get<uint32_t>();
    offer.socket_fd = r.get<uint32_t>();
    offer.pid_namespace = r.get<uint64_t>();
    offer.nonce = r.get<uint64_t>();
    offer.host_id = as_text(r.view(r.get<uint16_t>()));
  } else {
    offer.no_shared_memory = as_text(r.view(r.get<uint16_t>()));
  }
  const uint8_t rdma = r.get<uint8_t>();
  offer.no_rdma = as_text(r.view(r.get<uint16_t>()));
  // An RDMA offer carries no reason (an empty blob).
  if (type != Frame::kChannelOffer || shared_memory > 1 || rdma > 1 || !r.ok() ||
      r.remaining() != 0 || (rdma == 1 && !offer.no_rdma.empty())) {
    return ProtocolError("malformed endpoint channel offer");
  }
  offer.shared_memory = shared_memory == 1;
  offer.rdma = rdma == 1;
  return offer;
}

FrameBuilder channel_offer_frame(const ChannelOffer& offer) {
  FrameBuilder f(Frame::kChannelOffer);
  if (offer.shared_memory) {
    f.u8(1);
    f.fields().put<uint32_t>(offer.pid);
    f.fields().put<uint32_t>(offer.fd);
    f.fields().put<uint32_t>(offer.socket_fd);
    f.u64(offer.pid_namespace).u64(offer.nonce).blob(text_bytes(offer.host_id));
  } else {
    f.u8(0).blob(text_bytes(offer.no_shared_memory));
  }
  f.u8(offer.rdma ? 1 : 0);
  f.blob(offer.rdma ? std::span<const uint8_t>() : text_bytes(offer.no_rdma));
  return f;
}

Result<ChannelAnswer> decode_channel_answer(Frame type, std::span<const uint8_t> payload) {
  WireReader r(payload);
  ChannelAnswer answer;
  const uint8_t taken = r.get<uint8_t>();
  answer.no_shared_memory = as_text(r.view(r.get<uint16_t>()));
  answer.no_rdma = as_text(r.view(r.get<uint16_t>()));
  auto address = r.view(r.get<uint16_t>());
  if (type != Frame::kChannelAnswer || taken > static_cast<uint8_t>(Taken::kRdma) || !r.ok() ||
      r.remaining() != 0) {
    return ProtocolError("malformed endpoint channel answer");
  }
  answer.taken = static_cast<Taken>(taken);
  answer.address.assign(address.begin(), address.end());
  return answer;
}

FrameBuilder channel_answer_frame(const ChannelAnswer& answer) {
  FrameBuilder f(Frame::kChannelAnswer);
  f.u8(static_cast<uint8_t>(answer.taken));
  f.blob(text_bytes(answer.no_shared_memory));
  f.blob(text_bytes(answer.no_rdma));
  f.blob(answer.address);
  return f;
}

Result<ChannelReady> decode_channel_ready(Frame type, std::span<const uint8_t> payload) {
  WireReader r(payload);
  const uint8_t ok = r.get<uint8_t>();
  auto bytes = r.view(r.get<uint16_t>());
  if (type != Frame::kChannelReady || ok > 1 || !r.ok() || r.remaining() != 0) {
    return ProtocolError("malformed endpoint channel readiness");
  }
  return ChannelReady{ok == 1, std::vector<uint8_t>(bytes.begin(), bytes.end())};
}

FrameBuilder channel_ready_frame(const Status& status, std::span<const uint8_t> address) {
  FrameBuilder f(Frame::kChannelReady);
  f.u8(status.ok() ? 1 : 0);
  f.blob(status.ok() ? address : text_bytes(status.message()));
  return f;
}

}  // namespace rdmabuf::endpoint
