#include "python/src/strided.h"

#include <algorithm>

namespace rdmabuf::python {

Result<StridedLayout> strided_layout(std::span<const int64_t> shape,
                                     std::span<const int64_t> strides, uint64_t itemsize,
                                     const std::string& what) {
  StridedLayout layout;
  // Dimensions of one element drop out; an empty one empties the whole.
  std::vector<int64_t> dims, steps;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return layout;
    if (shape[d] == 1) continue;
    dims.push_back(shape[d]);
    steps.push_back(strides[d]);
  }
  int64_t low = 0, high = static_cast<int64_t>(itemsize);
  for (size_t d = 0; d < dims.size(); ++d) {
    int64_t reach = 0;
    // Strides made up by hand (as_strided) may reach past any memory.
    if (__builtin_mul_overflow(dims[d] - 1, steps[d], &reach) ||
        __builtin_add_overflow(reach < 0 ? low : high, reach, reach < 0 ? &low : &high)) {
      return InvalidArgument(what + " has strides that reach past the address space");
    }
  }
  int64_t span = 0;
  if (__builtin_sub_overflow(high, low, &span)) {
    return InvalidArgument(what + " has strides that reach past the address space");
  }
  layout.low = low;
  layout.span = static_cast<uint64_t>(span);
  // The innermost dimensions that lie end to end form one run; the outer
  // ones repeat it.
  uint64_t run = itemsize;
  while (!dims.empty() && steps.back() == static_cast<int64_t>(run)) {
    run *= static_cast<uint64_t>(dims.back());
    dims.pop_back();
    steps.pop_back();
  }
  uint64_t count = 1;
  bool too_many = false;
  for (int64_t n : dims)
    too_many |= __builtin_mul_overflow(count, static_cast<uint64_t>(n), &count);
  if (too_many || count > Op::kMaxRanges) {
    return InvalidArgument(what + " lies in " + (too_many ? "more" : std::to_string(count)) +
                           " separate pieces of memory, more than one op takes (" +
                           std::to_string(Op::kMaxRanges) + "); .contiguous() or .copy() first");
  }
  layout.runs.reserve(count);
  std::vector<int64_t> index(dims.size(), 0);
  int64_t at = -low;  // the current run's offset from the lowest byte
  for (uint64_t k = 0; k < count; ++k) {
    const auto offset = static_cast<uint64_t>(at);
    // Runs that happen to follow each other (e.g. a dimension whose stride
    // is the run's length) become one.
    if (!layout.runs.empty() &&
        layout.runs.back().local_offset + layout.runs.back().length == offset) {
      layout.runs.back().length += run;
    } else {
      layout.runs.push_back(OpRange{0, offset, run});
    }
    // The next index, the last dimension fastest.
    for (size_t d = dims.size(); d-- > 0;) {
      at += steps[d];
      if (++index[d] < dims[d]) break;
      at -= steps[d] * dims[d];
      index[d] = 0;
    }
  }
  layout.bytes = count * run;
  return layout;
}

}  // namespace rdmabuf::python
