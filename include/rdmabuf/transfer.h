// Transfer: what Manager::submit returns; the future of a batch of ops.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "rdmabuf/status.h"

namespace rdmabuf {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

class TransferState;  // backend-facing side, see rdmabuf/backend.h

// Now + `timeout`, saturating: a huge timeout (milliseconds::max()) means
// no deadline, a negative one means now. Compared in the caller's units, so
// no conversion overflows.
template <typename Rep, typename Period>
Deadline deadline_after(std::chrono::duration<Rep, Period> timeout) {
  const Deadline now = Clock::now();
  if (timeout <= timeout.zero()) return now;
  const auto room =
      std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(Deadline::max() - now);
  if (timeout >= room) return Deadline::max();
  return now + std::chrono::duration_cast<Clock::duration>(timeout);
}

// A batch of ops in flight. Move-only.
//
// Lifetime and safety: once done() is true (after wait() returned, a
// wait_for() that returned true, or cancel()), the library never touches the
// local memory of any op of this transfer again: no late bytes from a socket,
// no late DMA. Destroying an unfinished Transfer cancels it first, so the
// same holds after the destructor returns.
//
// Thread safety: all methods may be called from any thread, concurrently.
class Transfer {
 public:
  Transfer() = default;  // an empty transfer: done, OK, no ops
  explicit Transfer(std::shared_ptr<TransferState> state);
  Transfer(Transfer&&) noexcept;
  Transfer& operator=(Transfer&&) noexcept;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer();

  // Blocks until every op has finished, or until the deadline given to
  // submit; then the ops still unfinished fail with kDeadlineExceeded (their
  // local memory is no longer touched when wait returns). Returns status().
  Status wait();

  // Waits at most `timeout`; true when the transfer has finished (see
  // status()). Passing the transfer's own deadline meanwhile finishes it as
  // wait() does; otherwise a false return changes nothing.
  template <typename Rep, typename Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) {
    return wait_until(deadline_after(timeout));
  }
  // As wait_for, until a point in time.
  bool wait_until(Deadline until);

  // Non-blocking: true when every op has finished. Also enforces the
  // deadline: past it, unfinished ops fail with kDeadlineExceeded.
  bool done() const;

  // Fails every unfinished op with kCancelled. Returns when the library no
  // longer touches their local memory. A no-op once done.
  void cancel();

  // Once done: OK when every op succeeded, else the status of the first
  // failed op (by index). Before: kFailedPrecondition ("still in flight").
  Status status() const;

  size_t op_count() const;
  // Once done: the status of op `index`. Before: kFailedPrecondition.
  Status op_status(size_t index) const;
  // The backend that carried op `index` ("tcp", ...); empty when none did
  // (the op failed before reaching a transport).
  std::string_view op_backend(size_t index) const;
  // Why op `index` did not use the best transport the owner offers (e.g.
  // "ibverbs: not viable here: no RDMA devices"); empty when it did.
  std::string op_note(size_t index) const;

 private:
  std::shared_ptr<TransferState> state_;
};

}  // namespace rdmabuf
