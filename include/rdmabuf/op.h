// Op: one transfer between a local range and a remote range, a list of
// ranges of each moved as one, or one atomic on a word of remote memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "rdmabuf/buffer.h"
#include "rdmabuf/memory.h"

namespace rdmabuf {

enum class OpKind : uint8_t {
  // Copy the whole remote range into the front of the local range; the local
  // range must be at least as large.
  kReadIntoLocal = 0,
  // Copy the whole local range into the front of the remote range; the remote
  // range must be at least as large.
  kWriteFromLocal = 1,
  // Atomics on one 8-byte word of remote memory: the remote range is exactly
  // that word (8 bytes, at an offset that is a multiple of 8 within an
  // 8-byte aligned buffer), and its previous value lands in the first 8
  // bytes of the local range (host memory, native byte order). Atomic with
  // respect to every other rdmabuf atomic on the same word, from any peer:
  // each is a CPU atomic instruction on the owner's memory, by the owner's
  // manager or, on one host, by the reader on memory both map
  // (docs/atomics.md). An atomic refused before it was sent (the checks of
  // Manager::submit) or by the owner (kInvalidArgument, kNotFound,
  // kPermissionDenied) was not applied; one that failed otherwise
  // (kUnavailable, kDeadlineExceeded, kCancelled, kProtocolError) may have
  // been.
  //
  // Adds `operand` to the word (wrapping, unsigned).
  kFetchAdd = 2,
  // Sets the word to `operand` if it equals `compare`.
  kCompareAndSwap = 3,
};

constexpr bool is_atomic_kind(OpKind kind) {
  return kind == OpKind::kFetchAdd || kind == OpKind::kCompareAndSwap;
}

// One piece of a scattered read or write: `length` bytes between
// `remote_offset` of the op's remote range and `local_offset` of its local
// range.
struct OpRange {
  uint64_t remote_offset = 0;
  uint64_t local_offset = 0;
  uint64_t length = 0;
};

// The ranges of a scattered op, in order, with where each begins in the op's
// bytes taken as one sequence (the ranges one after another): a read's reply
// and a write's payload carry them in this order. Immutable once made, so
// that ops, their copies and the transports running them share one list.
class OpRanges {
 public:
  explicit OpRanges(std::vector<OpRange> ranges);
  std::span<const OpRange> ranges() const { return ranges_; }
  size_t size() const { return ranges_.size(); }
  // The sum of the ranges' lengths.
  uint64_t bytes() const { return bytes_; }
  // Where range `k` begins in the sequence.
  uint64_t start(size_t k) const { return starts_[k]; }
  // The range holding byte `at` of the sequence (at < bytes()).
  size_t range_at(uint64_t at) const;

  // What Manager::submit checks of every op that carries this list, found
  // once, here, rather than on each submit of a list that is reused (a KV
  // cache's pages): whether every range is non-empty and ends below 2^64,
  // with a sum below 2^64; the furthest end of any range on each side; and
  // whether two ranges share a byte on each side.
  bool well_formed() const { return well_formed_; }
  uint64_t local_end() const { return local_end_; }
  uint64_t remote_end() const { return remote_end_; }
  bool local_overlap() const { return local_overlap_; }
  bool remote_overlap() const { return remote_overlap_; }

 private:
  std::vector<OpRange> ranges_;
  std::vector<uint64_t> starts_;
  uint64_t bytes_ = 0;
  bool well_formed_ = true;
  uint64_t local_end_ = 0, remote_end_ = 0;
  bool local_overlap_ = false, remote_overlap_ = false;
};

struct Op {
  OpKind kind = OpKind::kReadIntoLocal;
  // The remote range: a handle, or a slice of one.
  RemoteBuffer remote;
  LocalMemory local;
  // Atomics only: what kFetchAdd adds or kCompareAndSwap stores, and what
  // kCompareAndSwap expects.
  uint64_t operand = 0;
  uint64_t compare = 0;
  // Reads and writes only: when set, the op moves these ranges, with one
  // status, instead of the whole range. Each lies within `remote` and
  // within `local`; no two overlap in local memory, nor, for a write, in
  // remote memory (Manager::submit refuses them otherwise).
  std::shared_ptr<const OpRanges> ranges = nullptr;

  static Op read(RemoteBuffer remote, LocalMemory local) {
    return Op{OpKind::kReadIntoLocal, std::move(remote), std::move(local)};
  }
  static Op write(RemoteBuffer remote, LocalMemory local) {
    return Op{OpKind::kWriteFromLocal, std::move(remote), std::move(local)};
  }
  // Scattered: reads each range of `remote` into its place in `local`.
  static Op read_ranges(RemoteBuffer remote, LocalMemory local, std::vector<OpRange> ranges) {
    Op op{OpKind::kReadIntoLocal, std::move(remote), std::move(local)};
    op.ranges = std::make_shared<const OpRanges>(std::move(ranges));
    return op;
  }
  static Op write_ranges(RemoteBuffer remote, LocalMemory local, std::vector<OpRange> ranges) {
    Op op{OpKind::kWriteFromLocal, std::move(remote), std::move(local)};
    op.ranges = std::make_shared<const OpRanges>(std::move(ranges));
    return op;
  }
  // `word`: 8 bytes of a remote buffer (a slice); `previous`: at least 8
  // bytes of local host memory.
  static Op fetch_add(RemoteBuffer word, LocalMemory previous, uint64_t add) {
    return Op{OpKind::kFetchAdd, std::move(word), std::move(previous), add, 0};
  }
  static Op compare_and_swap(RemoteBuffer word, LocalMemory previous, uint64_t expected,
                             uint64_t desired) {
    return Op{OpKind::kCompareAndSwap, std::move(word), std::move(previous), desired, expected};
  }

  bool is_atomic() const { return is_atomic_kind(kind); }
  // The bytes this op moves (a scattered op's: its ranges'; an atomic's
  // word: 8).
  uint64_t bytes() const {
    if (ranges && !is_atomic()) return ranges->bytes();
    switch (kind) {
      case OpKind::kReadIntoLocal:
        return remote.size();
      case OpKind::kWriteFromLocal:
        return local.size();
      default:
        return kAtomicWordBytes;
    }
  }
  static constexpr uint64_t kAtomicWordBytes = 8;
  // The most ranges one scattered op may take.
  static constexpr size_t kMaxRanges = size_t{1} << 20;
};

// "read", "write", "fetch-add", "compare-and-swap".
const char* op_kind_name(OpKind kind);

}  // namespace rdmabuf
