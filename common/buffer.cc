// RemoteBuffer: accessors, slicing and the versioned handle format
// (docs/wire-format.md describes the bytes).
#include <set>

#include "common/base64.h"
#include "common/buffer_access.h"
#include "common/crc32c.h"
#include "common/socket.h"
#include "common/strings.h"
#include "common/wire.h"
#include "rdmabuf/buffer.h"

namespace rdmabuf {
namespace {

constexpr uint8_t kMagic[4] = {'R', 'B', 'U', 'F'};
constexpr uint8_t kVersion = 1;
constexpr size_t kMaxHandleBytes = 65535;
constexpr size_t kMaxBackendName = 32;
// magic, version, flags, total length, id, token, region, offset, length,
// manager id, pid, two string lengths, context count, crc.
constexpr size_t kMinHandleBytes = 4 + 1 + 1 + 2 + 8 + 16 + 8 + 8 + 8 + 8 + 4 + 1 + 1 + 1 + 4;

Status check_fields(const RemoteBuffer& b) {
  const auto& owner = b.owner();
  if (b.region_size() == 0) return InvalidArgument("handle has a zero-size buffer");
  if (!range_fits(b.offset(), b.size(), b.region_size())) {
    return InvalidArgument("handle's view [" + std::to_string(b.offset()) + ", +" +
                           std::to_string(b.size()) + ") lies outside its buffer of " +
                           std::to_string(b.region_size()) + " B");
  }
  if (owner.address.size() > 255 || owner.host_id.size() > 255) {
    return InvalidArgument("handle's owner address or host id is longer than 255 bytes");
  }
  auto addr = parse_host_port(owner.address);
  if (!addr.ok()) return addr.status().with_context("handle's owner address");
  if (b.contexts().size() > RemoteBuffer::kMaxContexts) {
    return InvalidArgument("handle has more than " + std::to_string(RemoteBuffer::kMaxContexts) +
                           " backend contexts");
  }
  std::set<std::string> seen;
  for (const auto& ctx : b.contexts()) {
    if (ctx.backend.empty() || ctx.backend.size() > kMaxBackendName) {
      return InvalidArgument("handle has a backend context with a bad name");
    }
    if (ctx.data.size() > RemoteBuffer::kMaxContextBytes) {
      return InvalidArgument("handle's '" + ctx.backend + "' context is larger than " +
                             std::to_string(RemoteBuffer::kMaxContextBytes) + " B");
    }
    if (!seen.insert(ctx.backend).second) {
      return InvalidArgument("handle names backend '" + ctx.backend + "' twice");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string PeerIdentity::to_string() const {
  return "manager " + hex_id(manager_id) + " (pid " + std::to_string(pid) + " at " + address + ")";
}

uint64_t RemoteBuffer::id() const {
  return shared_ ? shared_->id : 0;
}
uint64_t RemoteBuffer::region_size() const {
  return shared_ ? shared_->region_size : 0;
}

const PeerIdentity& RemoteBuffer::owner() const {
  static const PeerIdentity kNobody;
  return shared_ ? shared_->owner : kNobody;
}

const Token& RemoteBuffer::token() const {
  static const Token kZero{};
  return shared_ ? shared_->token : kZero;
}

const std::vector<BackendContext>& RemoteBuffer::contexts() const {
  static const std::vector<BackendContext> kNone;
  return shared_ ? shared_->contexts : kNone;
}

const BackendContext* RemoteBuffer::context(std::string_view name) const {
  for (const auto& ctx : contexts()) {
    if (ctx.backend == name) return &ctx;
  }
  return nullptr;
}

Result<RemoteBuffer> RemoteBuffer::slice(uint64_t offset, uint64_t length) const {
  if (!valid()) return InvalidArgument("slice of an empty handle");
  if (!range_fits(offset, length, length_)) {
    return InvalidArgument("slice [" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") does not fit in " + describe());
  }
  RemoteBuffer out = *this;
  out.offset_ = offset_ + offset;
  out.length_ = length;
  return out;
}

std::string RemoteBuffer::describe() const {
  if (!valid()) return "an empty handle";
  return "buffer " + std::to_string(id()) + " [" + std::to_string(offset_) + ", " +
         std::to_string(offset_ + length_) + ") of " + owner().to_string();
}

std::vector<uint8_t> RemoteBuffer::to_bytes() const {
  std::vector<uint8_t> out;
  if (!valid()) return out;
  WireWriter w(out);
  w.bytes(kMagic, sizeof kMagic);
  w.put<uint8_t>(kVersion);
  w.put<uint8_t>(0);   // flags
  w.put<uint16_t>(0);  // total length, patched below
  w.put<uint64_t>(shared_->id);
  w.bytes(shared_->token.data(), shared_->token.size());
  w.put<uint64_t>(shared_->region_size);
  w.put<uint64_t>(offset_);
  w.put<uint64_t>(length_);
  w.put<uint64_t>(shared_->owner.manager_id);
  w.put<uint32_t>(shared_->owner.pid);
  w.short_string(shared_->owner.address);
  w.short_string(shared_->owner.host_id);
  w.put<uint8_t>(static_cast<uint8_t>(shared_->contexts.size()));
  for (const auto& ctx : shared_->contexts) {
    w.short_string(ctx.backend);
    w.put<uint16_t>(static_cast<uint16_t>(ctx.data.size()));
    w.bytes(ctx.data.data(), ctx.data.size());
  }
  uint16_t total = static_cast<uint16_t>(out.size() + 4);
  std::memcpy(out.data() + 6, &total, sizeof total);
  w.put<uint32_t>(crc32c(out.data(), out.size()));
  return out;
}

Result<RemoteBuffer> RemoteBuffer::from_bytes(std::span<const uint8_t> bytes) {
  auto bad = [](std::string why) { return InvalidArgument("malformed handle: " + why); };
  if (bytes.size() < kMinHandleBytes) {
    return bad("only " + std::to_string(bytes.size()) + " bytes, too short to be a handle");
  }
  if (bytes.size() > kMaxHandleBytes) return bad("longer than any handle");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return bad("it does not start with the rdmabuf magic");
  }
  WireReader r(bytes);
  r.view(sizeof kMagic);
  uint8_t version = r.get<uint8_t>();
  if (version != kVersion) {
    return bad("format version " + std::to_string(version) + ", this rdmabuf reads version " +
               std::to_string(kVersion));
  }
  if (r.get<uint8_t>() != 0) return bad("unknown flags");
  uint16_t total = r.get<uint16_t>();
  if (total != bytes.size()) {
    return bad("it says it is " + std::to_string(total) + " bytes long but is " +
               std::to_string(bytes.size()));
  }
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  if (crc32c(bytes.data(), bytes.size() - 4) != stored_crc) {
    return bad("checksum mismatch (corrupted or altered)");
  }
  auto shared = std::make_shared<Shared>();
  RemoteBuffer out;
  shared->id = r.get<uint64_t>();
  r.bytes(shared->token.data(), shared->token.size());
  shared->region_size = r.get<uint64_t>();
  out.offset_ = r.get<uint64_t>();
  out.length_ = r.get<uint64_t>();
  shared->owner.manager_id = r.get<uint64_t>();
  shared->owner.pid = r.get<uint32_t>();
  shared->owner.address = r.short_string();
  shared->owner.host_id = r.short_string();
  size_t count = r.get<uint8_t>();
  if (count > kMaxContexts) return bad("too many backend contexts");
  for (size_t i = 0; i < count && r.ok(); ++i) {
    BackendContext ctx;
    ctx.backend = r.short_string();
    size_t size = r.get<uint16_t>();
    if (size > kMaxContextBytes) return bad("a backend context is too large");
    auto data = r.view(size);
    ctx.data.assign(data.begin(), data.end());
    shared->contexts.push_back(std::move(ctx));
  }
  r.get<uint32_t>();  // the crc, checked above
  if (!r.ok()) return bad("truncated fields");
  if (r.remaining() != 0) return bad("trailing bytes");
  out.shared_ = std::move(shared);
  Status fields = check_fields(out);
  if (!fields.ok()) return bad(fields.message());
  return out;
}

std::string RemoteBuffer::to_text() const {
  return base64url_encode(to_bytes());
}

Result<RemoteBuffer> RemoteBuffer::from_text(std::string_view text) {
  text = trim(text);
  auto bytes = base64url_decode(text);
  if (!bytes) return InvalidArgument("malformed handle: not base64url text");
  return from_bytes(*bytes);
}

namespace detail {

Result<RemoteBuffer> RemoteBufferAccess::make(RemoteBufferFields fields) {
  auto shared = std::make_shared<RemoteBuffer::Shared>();
  shared->id = fields.id;
  shared->region_size = fields.region_size;
  shared->token = fields.token;
  shared->owner = std::move(fields.owner);
  shared->contexts = std::move(fields.contexts);
  RemoteBuffer out;
  out.length_ = shared->region_size;
  out.shared_ = std::move(shared);
  RDMABUF_RETURN_IF_ERROR(check_fields(out));
  return out;
}

}  // namespace detail
}  // namespace rdmabuf
