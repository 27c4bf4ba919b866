// How the manager mints RemoteBuffers (the public class has no public
// constructor from fields, so handles only come from a manager or from bytes).
#pragma once

#include <vector>

#include "rdmabuf/buffer.h"

namespace rdmabuf::detail {

struct RemoteBufferFields {
  uint64_t id = 0;
  uint64_t region_size = 0;
  Token token{};
  PeerIdentity owner;
  std::vector<BackendContext> contexts;
};

struct RemoteBufferAccess {
  // A handle to the whole region. kInvalidArgument when a field breaks the
  // handle format's limits (so every minted handle also decodes).
  static Result<RemoteBuffer> make(RemoteBufferFields fields);
};

}  // namespace rdmabuf::detail
