// Scratch: a container kept per thread between calls, so that a hot call
// (submit) reuses its capacity instead of allocating anew each time. A call
// further down the same thread's stack (a completion callback that submits
// again) gets a fresh one of its own, so nothing is clobbered under a caller.
#pragma once

namespace rdmabuf {

// `T` is the container; `Tag` tells uses apart. Holds the thread's
// container from construction to destruction: use it inside one call, never
// across calls or threads. get() gives it as the last user left it: the
// user empties what it must (and should, before it returns, drop what it
// must not keep alive).
template <typename T, typename Tag>
class Scratch {
 public:
  Scratch() : borrowed_(!shared().in_use) {
    if (borrowed_) shared().in_use = true;
  }
  ~Scratch() {
    if (borrowed_) shared().in_use = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  T& get() { return borrowed_ ? shared().value : own_; }

 private:
  struct Shared {
    T value;
    bool in_use = false;
  };
  static Shared& shared() {
    thread_local Shared s;
    return s;
  }

  const bool borrowed_;
  T own_;
};

}  // namespace rdmabuf
