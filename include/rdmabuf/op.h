// Op: one transfer between a local range and a remote range.
#pragma once

#include <cstdint>

#include "rdmabuf/buffer.h"
#include "rdmabuf/memory.h"

namespace rdmabuf {

enum class OpKind : uint8_t {
  // Copy the whole remote range into the front of the local range; the local
  // range must be at least as large.
  kReadIntoLocal = 0,
  // Copy the whole local range into the front of the remote range; the remote
  // range must be at least as large.
  kWriteFromLocal = 1,
};

struct Op {
  OpKind kind = OpKind::kReadIntoLocal;
  // The remote range: a handle, or a slice of one.
  RemoteBuffer remote;
  LocalMemory local;

  static Op read(RemoteBuffer remote, LocalMemory local) {
    return Op{OpKind::kReadIntoLocal, std::move(remote), std::move(local)};
  }
  static Op write(RemoteBuffer remote, LocalMemory local) {
    return Op{OpKind::kWriteFromLocal, std::move(remote), std::move(local)};
  }

  // The bytes this op moves.
  uint64_t bytes() const { return kind == OpKind::kReadIntoLocal ? remote.size() : local.size(); }
};

// "read"/"write".
const char* op_kind_name(OpKind kind);

}  // namespace rdmabuf
