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

// Walks an op's extents in order from byte `at` of its sequence: one search
// for the first, then one range after another.
class ExtentCursor {
 public:
  ExtentCursor(const Op& op, uint64_t at);
  // The next extent, cut to at most `max` bytes (the rest of it comes
  // next). Call only while bytes remain (the caller counts them).
  Extent next(uint64_t max);

 private:
  const OpRanges* ranges_;  // null: a plain op
  uint64_t at_;             // the byte of the sequence, or of the range, next
  size_t range_ = 0;
  uint64_t end_;  // a plain op's bytes
};

// Calls fn(Extent) for each extent of bytes [begin, begin + length) of the
// op's sequence, in order.
template <class Fn>
void for_each_extent(const Op& op, uint64_t begin, uint64_t length, Fn&& fn) {
  ExtentCursor cursor(op, begin);
  while (length > 0) {
    const Extent e = cursor.next(length);
    fn(e);
    length -= e.length;
  }
}

// How many extents bytes [begin, begin + length) of the op span.
uint64_t count_extents(const Op& op, uint64_t begin, uint64_t length);

}  // namespace rdmabuf
