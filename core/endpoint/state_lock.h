// The endpoint's state lock, and the proofs its methods ask for.
//
// One FutexMutex (EndpointImpl::mu_) guards an endpoint's state: its
// receives, sends, credits, replies, loans and notifications. A method or
// component function that needs it held takes a `StateLock&` (or `const
// StateLock&`): only a StateLock on that mutex can be passed, and the
// function may assume it owns the lock on entry (a function that lets go
// of it for a while says so, and holds it again on return).
#pragma once

#include <cassert>
#include <mutex>

#include "common/futex_mutex.h"

namespace rdmabuf::endpoint {

class StateLock : public FutexLock {
 public:
  using FutexLock::FutexLock;
  // For functions that take the proof: in debug builds, checks it.
  void assert_held() const { assert(owns_lock()); }
};

}  // namespace rdmabuf::endpoint
