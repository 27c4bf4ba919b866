// One remote atomic (Op::kFetchAdd, Op::kCompareAndSwap) applied by this
// CPU to an 8-byte word of registered memory: the one place that does it,
// for every transport that applies atomics (the tcp owner, the memory
// transport's mapping), so that they all use the same instruction and
// stay atomic with each other (docs/atomics.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "rdmabuf/op.h"

namespace rdmabuf {

// Whether `word` may be acted on atomically: 8-byte aligned.
inline bool atomic_word_aligned(const std::byte* word) {
  return reinterpret_cast<uintptr_t>(word) % Op::kAtomicWordBytes == 0;
}

// Applies the atomic `kind` to the aligned word at `word` (sequentially
// consistent): kFetchAdd adds `operand`; kCompareAndSwap stores `operand`
// if the word holds `compare`. Returns the word's previous value.
inline uint64_t apply_atomic(std::byte* word, OpKind kind, uint64_t operand, uint64_t compare) {
  std::atomic_ref<uint64_t> ref(*reinterpret_cast<uint64_t*>(word));
  if (kind == OpKind::kFetchAdd) return ref.fetch_add(operand);
  uint64_t previous = compare;
  ref.compare_exchange_strong(previous, operand);
  return previous;
}

}  // namespace rdmabuf
