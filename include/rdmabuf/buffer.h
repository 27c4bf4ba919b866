// RemoteBuffer: the handle to memory another (or this) process registered.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf {

// Who owns a buffer: enough to reach its manager and to recognise it.
struct PeerIdentity {
  // Random per Manager instance; a restarted owner gets a new one, so handles
  // minted by the old instance are refused with kNotFound.
  uint64_t manager_id = 0;
  // "HOST:PORT" of the owner's control listener.
  std::string address;
  // Identifies the owner's host (its kernel boot id).
  std::string host_id;
  uint32_t pid = 0;

  // "manager 1a2b… (pid 123 at 127.0.0.1:4000)".
  std::string to_string() const;
};

// What one backend of the owner needs a reader to know (keys, addresses).
// Opaque outside that backend.
struct BackendContext {
  std::string backend;        // the backend's name, e.g. "tcp"
  std::vector<uint8_t> data;  // at most kMaxContextBytes
};

// The random secret a handle carries. Whoever holds it may read and write
// the buffer's range; the owner checks it on every access served in software.
using Token = std::array<uint8_t, 16>;

namespace detail {
struct RemoteBufferAccess;
}

// A handle to a registered buffer, or to a slice of it. Minted only by
// Manager::register_buffer (and decoded by from_bytes). Cheap to copy;
// immutable; safe to share between threads.
//
// A default-constructed RemoteBuffer is empty (valid() is false); using it in
// an op is kInvalidArgument.
class RemoteBuffer {
 public:
  static constexpr size_t kMaxContextBytes = 4096;
  static constexpr size_t kMaxContexts = 8;

  RemoteBuffer() = default;

  bool valid() const { return shared_ != nullptr; }

  // The buffer's id at its owner. Slices share it.
  uint64_t id() const;
  // Bytes in this view (the whole buffer, or a slice).
  uint64_t size() const { return length_; }
  // Where this view starts within the registered buffer.
  uint64_t offset() const { return offset_; }
  // Size of the whole registered buffer.
  uint64_t region_size() const;
  const PeerIdentity& owner() const;
  const Token& token() const;
  const std::vector<BackendContext>& contexts() const;
  // The context of backend `name`, or null when the owner does not offer it.
  const BackendContext* context(std::string_view name) const;

  // The view [offset, offset + length) of this view. Slices of slices work.
  // kInvalidArgument when the range does not fit.
  Result<RemoteBuffer> slice(uint64_t offset, uint64_t length) const;

  // The versioned binary form: magic, version, lengths, fields, CRC-32C.
  std::vector<uint8_t> to_bytes() const;
  // Decodes bytes from anywhere (a file, a socket, a peer). Never crashes on
  // garbage: truncated, oversized, corrupted, wrong version or inconsistent
  // input is kInvalidArgument saying what is wrong.
  static Result<RemoteBuffer> from_bytes(std::span<const uint8_t> bytes);

  // to_bytes() in unpadded base64url: one line of text, safe in shells,
  // URLs and JSON. from_text ignores surrounding whitespace.
  std::string to_text() const;
  static Result<RemoteBuffer> from_text(std::string_view text);

  // "buffer 7 [0, 4096) of manager … (pid …)": for messages and logs.
  std::string describe() const;

 private:
  friend struct detail::RemoteBufferAccess;
  struct Shared {
    uint64_t id = 0;
    uint64_t region_size = 0;
    Token token{};
    PeerIdentity owner;
    std::vector<BackendContext> contexts;
  };
  std::shared_ptr<const Shared> shared_;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;
};

}  // namespace rdmabuf
