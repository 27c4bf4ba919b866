// The checks an op passes before any backend sees it.
#pragma once

#include <cstdint>

#include "rdmabuf/op.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

// kInvalidArgument naming the op and what is wrong with it: an empty
// handle, null local memory, a side too small for the other, a bad list of
// ranges (each within both sides, none empty, none overlapping in local
// memory nor, for a write, in remote memory), a misshapen atomic, more than
// 2^32 chunks of `chunk_size`; or the CUDA driver's error when the local
// memory is on a GPU and there is no driver. Never blocks.
Status validate_op(const Op& op, uint64_t chunk_size);

}  // namespace rdmabuf
