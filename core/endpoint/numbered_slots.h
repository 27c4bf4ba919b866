// NumberedSlots<T>: records under consecutive numbers (an endpoint's posted
// receives and sends), in a ring of slots indexed by the number's low bits,
// from the oldest still held. Numbers are added in order and records mostly
// end in order, so one that ends early is marked, and dropped once it
// reaches the front. A record stays put until it is erased (slots are
// allocated one by one, and only their pointers move when the ring
// doubles). A slot stays in the ring for the next number that lands on it,
// so a steady stream of records allocates nothing, where a std::map
// allocates and rebalances a node for each.
//
// Erasing calls the record's reset(), which makes it as new and lets go of
// what it held (touching only what is set: an assignment from T{} would
// store every byte). Not thread-safe: its owner's lock guards it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace rdmabuf {

template <typename T>
class NumberedSlots {
 public:
  // Adds the record `number`: the next number after the last one added,
  // or any, when none is held.
  T& add(uint64_t number) {
    if (span_ == 0) first_ = number;
    if (span_ == slots_.size()) [[unlikely]]
      grow();
    std::unique_ptr<Slot>& slot = slots_[number & (slots_.size() - 1)];
    if (!slot) slot = std::make_unique<Slot>();
    slot->held = true;
    ++span_;
    return slot->value;
  }
  // The record `number`, or null when it is not held.
  T* find(uint64_t number) {
    if (number < first_ || number - first_ >= span_) return nullptr;
    Slot& slot = *slots_[number & (slots_.size() - 1)];
    return slot.held ? &slot.value : nullptr;
  }
  // Ends the record `number`, which find() gave.
  void erase(uint64_t number) {
    const size_t mask = slots_.size() - 1;
    Slot& slot = *slots_[number & mask];
    slot.held = false;
    slot.value.reset();  // lets go of what it held now
    while (span_ > 0 && !slots_[first_ & mask]->held) {
      ++first_;
      --span_;
    }
  }
  bool empty() const { return span_ == 0; }
  // Calls fn(number, record) for each record held, oldest first.
  template <typename Fn>
  void for_each(Fn fn) {
    for (uint64_t number = first_; number < first_ + span_; ++number) {
      Slot& slot = *slots_[number & (slots_.size() - 1)];
      if (slot.held) fn(number, slot.value);
    }
  }

 private:
  struct Slot {
    T value;
    bool held = false;
  };
  // Doubles the ring (full: every slot is between first_ and first_ +
  // span_), moving each slot to the index of its number in the new one.
  [[gnu::noinline]] void grow() {
    std::vector<std::unique_ptr<Slot>> bigger(std::max<size_t>(16, 2 * slots_.size()));
    for (uint64_t number = first_; number < first_ + span_; ++number) {
      bigger[number & (bigger.size() - 1)] = std::move(slots_[number & (slots_.size() - 1)]);
    }
    slots_ = std::move(bigger);
  }

  std::vector<std::unique_ptr<Slot>> slots_;  // none, or a power of two of them
  uint64_t first_ = 0;                        // the number of the oldest slot in use
  // The numbers from first_ on that the ring holds, those that ended early
  // included.
  size_t span_ = 0;
};

}  // namespace rdmabuf
