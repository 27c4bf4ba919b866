#include <algorithm>

#include "common/op_extents.h"
#include "rdmabuf/op.h"

namespace rdmabuf {

OpRanges::OpRanges(std::vector<OpRange> ranges) : ranges_(std::move(ranges)) {
  starts_.reserve(ranges_.size());
  for (const OpRange& r : ranges_) {
    starts_.push_back(bytes_);
    bytes_ += r.length;  // Manager::submit refuses a list whose sum overflows
  }
}

size_t OpRanges::range_at(uint64_t at) const {
  // The last range starting at or before `at` (ranges are never empty:
  // Manager::submit refuses them).
  auto it = std::upper_bound(starts_.begin(), starts_.end(), at);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

Extent extent_at(const Op& op, uint64_t at) {
  if (!op.ranges) return Extent{at, at, op.bytes() - at};
  const size_t k = op.ranges->range_at(at);
  const OpRange& r = op.ranges->ranges()[k];
  const uint64_t into = at - op.ranges->start(k);
  return Extent{r.local_offset + into, r.remote_offset + into, r.length - into};
}

uint64_t count_extents(const Op& op, uint64_t begin, uint64_t length) {
  if (!op.ranges || length == 0) return length == 0 ? 0 : 1;
  return op.ranges->range_at(begin + length - 1) - op.ranges->range_at(begin) + 1;
}

}  // namespace rdmabuf
