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

ExtentCursor::ExtentCursor(const Op& op, uint64_t at)
    : ranges_(op.ranges.get()), at_(at), end_(op.bytes()) {
  if (!ranges_ || at >= ranges_->bytes()) return;
  range_ = ranges_->range_at(at);
  at_ = at - ranges_->start(range_);  // within the range from here on
}

Extent ExtentCursor::next(uint64_t max) {
  if (!ranges_) {
    const Extent e{at_, at_, std::min(max, end_ - at_)};
    at_ += e.length;
    return e;
  }
  const OpRange& r = ranges_->ranges()[range_];
  const Extent e{r.local_offset + at_, r.remote_offset + at_, std::min(max, r.length - at_)};
  at_ += e.length;
  if (at_ == r.length) {
    ++range_;
    at_ = 0;
  }
  return e;
}

uint64_t count_extents(const Op& op, uint64_t begin, uint64_t length) {
  if (!op.ranges || length == 0) return length == 0 ? 0 : 1;
  return op.ranges->range_at(begin + length - 1) - op.ranges->range_at(begin) + 1;
}

}  // namespace rdmabuf
