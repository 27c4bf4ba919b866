// An op's bytes as one sequence of extents, the same way for plain and
// scattered ops, so that transports cut, send and copy both alike.
#pragma once

#include <algorithm>
#include <cstdint>

#include "rdmabuf/op.h"

namespace rdmabuf {

// A stretch of an op's bytes that is contiguous on both sides: offsets
// within the op's local range and within its remote range (a slice: add
// remote.offset() for the buffer's own offset).
struct Extent {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// The extent from byte `at` of the op's sequence (at < op.bytes()) to the end
// of the range holding it. A plain read or write is one range, from 0 on
// both sides.
Extent extent_at(const Op& op, uint64_t at);

// Calls fn(Extent) for each extent of bytes [begin, begin + length) of the
// op's sequence, in order.
template <class Fn>
void for_each_extent(const Op& op, uint64_t begin, uint64_t length, Fn&& fn) {
  while (length > 0) {
    Extent e = extent_at(op, begin);
    e.length = std::min(e.length, length);
    fn(e);
    begin += e.length;
    length -= e.length;
  }
}

// How many extents bytes [begin, begin + length) of the op span.
uint64_t count_extents(const Op& op, uint64_t begin, uint64_t length);

}  // namespace rdmabuf
