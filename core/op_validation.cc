// The checks an op passes before any backend sees it (validate_op).
#include "core/op_validation.h"

#include <string>

#include "common/cuda_driver.h"
#include "common/op_text.h"
#include "common/strings.h"
#include "common/wire.h"

namespace rdmabuf {
namespace {

Status validate_atomic(const Op& op) {
  const uint64_t word = Op::kAtomicWordBytes;
  if (op.remote.size() != word) {
    return InvalidArgument(describe_op(op) +
                           ": an atomic takes one 8-byte word, and this range is " +
                           std::to_string(op.remote.size()) + " B (slice the buffer to 8 bytes)");
  }
  if (op.remote.offset() % word != 0) {
    return InvalidArgument(
        describe_op(op) + ": the word at offset " + std::to_string(op.remote.offset()) +
        " is not 8-byte aligned (atomics need an offset that is a multiple of 8)");
  }
  if (op.local.size() < word) {
    return InvalidArgument(describe_op(op) + ": the local range (" +
                           std::to_string(op.local.size()) +
                           " B) cannot hold the word's previous value (8 B)");
  }
  if (op.local.on_gpu()) {
    return InvalidArgument(describe_op(op) +
                           ": the previous value of an atomic lands in host memory, and this "
                           "local memory is on a GPU");
  }
  return Status::Ok();
}

// A scattered op's ranges: each within both sides, none empty, none
// overlapping another in local memory (nor, for a write, in remote memory).
// Constant time for a sound list (what OpRanges found when it was made);
// a walk over the ranges only to name the one at fault.
Status validate_ranges(const Op& op) {
  if (op.is_atomic()) {
    return InvalidArgument(describe_op(op) + ": an atomic acts on one word and takes no ranges");
  }
  const OpRanges& list = *op.ranges;
  const std::span<const OpRange> ranges = list.ranges();
  if (ranges.empty()) return InvalidArgument(describe_op(op) + ": the list of ranges is empty");
  if (ranges.size() > Op::kMaxRanges) {
    return InvalidArgument(describe_op(op) + ": more than " + std::to_string(Op::kMaxRanges) +
                           " ranges in one op");
  }
  const bool write = op.kind == OpKind::kWriteFromLocal;
  if (list.well_formed() && list.local_end() <= op.local.size() &&
      list.remote_end() <= op.remote.size() && !list.local_overlap() &&
      !(write && list.remote_overlap())) {
    return Status::Ok();
  }
  if (list.well_formed()) {
    if (list.local_overlap()) {
      return InvalidArgument(describe_op(op) + ": two of its ranges overlap in local memory");
    }
    if (write && list.remote_overlap()) {
      return InvalidArgument(describe_op(op) +
                             ": two of its ranges overlap in remote memory (a write's "
                             "destination)");
    }
  }
  uint64_t sum = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const OpRange& r = ranges[k];
    auto which = [&] { return describe_op(op) + ": range " + std::to_string(k) + " ("; };
    if (r.length == 0) return InvalidArgument(which() + "is empty)");
    if (!range_fits(r.remote_offset, r.length, op.remote.size())) {
      return InvalidArgument(which() + std::to_string(r.length) + " B at remote offset " +
                             std::to_string(r.remote_offset) +
                             ") lies outside the remote range of " +
                             std::to_string(op.remote.size()) + " B");
    }
    if (!range_fits(r.local_offset, r.length, op.local.size())) {
      return InvalidArgument(which() + std::to_string(r.length) + " B at local offset " +
                             std::to_string(r.local_offset) + ") lies outside the local range of " +
                             std::to_string(op.local.size()) + " B");
    }
    if (__builtin_add_overflow(sum, r.length, &sum)) {
      return InvalidArgument(describe_op(op) + ": the ranges add up to more than 2^64 bytes");
    }
  }
  return Internal(describe_op(op) + ": its list of ranges is unsound, and no range is at fault");
}

}  // namespace

Status validate_op(const Op& op, uint64_t chunk_size) {
  if (!op.remote.valid())
    return InvalidArgument(std::string(op_kind_name(op.kind)) + " on an empty handle");
  if (op.local.size() > 0 && op.local.data() == nullptr) {
    return InvalidArgument(describe_op(op) + ": the local memory is null");
  }
  if (op.ranges) RDMABUF_RETURN_IF_ERROR(validate_ranges(op));
  if (op.kind == OpKind::kReadIntoLocal && !op.ranges && op.local.size() < op.remote.size()) {
    return InvalidArgument(describe_op(op) + ": the local range (" +
                           std::to_string(op.local.size()) +
                           " B) is smaller than the remote "
                           "range (" +
                           std::to_string(op.remote.size()) + " B)");
  }
  if (op.kind == OpKind::kWriteFromLocal && !op.ranges && op.remote.size() < op.local.size()) {
    return InvalidArgument(describe_op(op) + ": the remote range (" +
                           std::to_string(op.remote.size()) +
                           " B) is smaller than the local "
                           "range (" +
                           std::to_string(op.local.size()) + " B)");
  }
  if (op.is_atomic()) return validate_atomic(op);
  if (op.bytes() / chunk_size >= UINT32_MAX) {
    return InvalidArgument(describe_op(op) + ": too large for chunks of " +
                           format_bytes(chunk_size));
  }
  if (op.local.on_gpu()) {
    Status gpu = cuda::Driver::get().status();
    if (!gpu.ok()) return gpu.with_context(describe_op(op) + ": its local memory is on a GPU");
  }
  return Status::Ok();
}

}  // namespace rdmabuf
