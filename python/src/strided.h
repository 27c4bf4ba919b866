// The bytes of an N-dimensional strided array (a numpy view, a torch tensor
// that is not contiguous) as the contiguous runs they form in memory.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rdmabuf/op.h"
#include "rdmabuf/status.h"

namespace rdmabuf::python {

struct StridedLayout {
  // Where its lowest byte lies, from the address of its first element
  // (negative strides put bytes before it), and how many bytes from there
  // to just past its highest one.
  int64_t low = 0;
  uint64_t span = 0;
  // Its elements in C (row-major) order, merged into contiguous runs:
  // offsets from its lowest byte, and lengths. Empty when it has none.
  std::vector<OpRange> runs;
  uint64_t bytes = 0;  // the runs' total
};

// `shape` in elements, `strides` in bytes, per dimension. More runs than
// Op::kMaxRanges is InvalidArgument (`what` names the object).
Result<StridedLayout> strided_layout(std::span<const int64_t> shape,
                                     std::span<const int64_t> strides, uint64_t itemsize,
                                     const std::string& what);

}  // namespace rdmabuf::python
