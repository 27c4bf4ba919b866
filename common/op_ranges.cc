#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "common/op_extents.h"
#include "rdmabuf/op.h"

namespace rdmabuf {

namespace {

// Whether two of the spans [offset(r), offset(r) + r.length) of `ranges`
// share a byte (none empty, none past 2^64). Linear for spans in ascending
// order, as lists of pages usually come; sorts a copy otherwise.
template <class Offset>
bool any_overlap(std::span<const OpRange> ranges, Offset offset) {
  bool ascending = true;
  for (size_t k = 1; k < ranges.size() && ascending; ++k)
    ascending = offset(ranges[k - 1]) <= offset(ranges[k]);
  std::vector<std::pair<uint64_t, uint64_t>> sorted;
  if (!ascending) {
    sorted.reserve(ranges.size());
    for (const OpRange& r : ranges)
      sorted.emplace_back(offset(r), r.length);
    std::sort(sorted.begin(), sorted.end());
  }
  auto span = [&](size_t k) {
    return ascending ? std::pair{offset(ranges[k]), ranges[k].length} : sorted[k];
  };
  for (size_t k = 1; k < ranges.size(); ++k) {
    const auto [previous, previous_length] = span(k - 1);
    if (span(k).first - previous < previous_length) return true;
  }
  return false;
}

}  // namespace

OpRanges::OpRanges(std::vector<OpRange> ranges) : ranges_(std::move(ranges)) {
  starts_.reserve(ranges_.size());
  for (const OpRange& r : ranges_) {
    starts_.push_back(bytes_);
    uint64_t local_end = 0, remote_end = 0;
    if (r.length == 0 || __builtin_add_overflow(bytes_, r.length, &bytes_) ||
        __builtin_add_overflow(r.local_offset, r.length, &local_end) ||
        __builtin_add_overflow(r.remote_offset, r.length, &remote_end)) {
      well_formed_ = false;  // Manager::submit refuses the list
      continue;
    }
    local_end_ = std::max(local_end_, local_end);
    remote_end_ = std::max(remote_end_, remote_end);
  }
  if (!well_formed_) return;  // the overlap checks assume sound spans
  local_overlap_ = any_overlap(ranges_, [](const OpRange& r) { return r.local_offset; });
  remote_overlap_ = any_overlap(ranges_, [](const OpRange& r) { return r.remote_offset; });
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
