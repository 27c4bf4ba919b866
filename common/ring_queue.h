// RingQueue<T>: a first-in first-out queue in a ring of slots whose count is
// a power of two, doubled when full. push_back, front and take_front are an
// index and a move each, where std::deque's cost tens of instructions of
// block bookkeeping; the endpoint's message path takes one of each per
// message (its queue of the peer's credits).
//
// take_front() moves the oldest element out; an erased slot is assigned
// T{} at once. Either way what it held (references to memory, handles) is
// let go then, not when the slot is used again. Not thread-safe: its
// owner's lock guards it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace rdmabuf {

template <typename T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // The oldest element (not empty()).
  T& front() { return slots_[index(0)]; }
  const T& front() const { return slots_[index(0)]; }
  void push_back(T&& value) {
    if (size_ == slots_.size()) [[unlikely]]
      grow();
    at(size_) = std::move(value);
    ++size_;
  }
  // Moves the oldest element out (not empty()). Its slot keeps what a
  // moved-from T keeps: nothing, for a T of handles and shared pointers.
  T take_front() {
    T oldest = std::move(at(0));
    ++head_;
    --size_;
    return oldest;
  }
  // Removes the oldest element for which `pred` holds, keeping the order of
  // the others: whether there was one. Linear: for the rare removal from
  // the middle.
  template <typename Pred>
  bool erase_first_if(Pred pred) {
    for (size_t i = 0; i < size_; ++i) {
      if (!pred(std::as_const(at(i)))) continue;
      for (size_t j = i; j + 1 < size_; ++j)
        at(j) = std::move(at(j + 1));
      at(size_ - 1) = T{};
      --size_;
      return true;
    }
    return false;
  }

 private:
  // The `i`th element from the oldest. head_ only grows: its wrap at 2^64
  // keeps the index right, since the slot count divides 2^64.
  size_t index(size_t i) const { return (head_ + i) & (slots_.size() - 1); }
  T& at(size_t i) { return slots_[index(i)]; }
  [[gnu::noinline]] void grow() {
    std::vector<T> bigger(std::max<size_t>(16, 2 * slots_.size()));
    for (size_t i = 0; i < size_; ++i)
      bigger[i] = std::move(at(i));
    slots_ = std::move(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;  // none, or a power of two of them
  size_t head_ = 0;       // the oldest element's position (mod the slot count)
  size_t size_ = 0;
};

}  // namespace rdmabuf
