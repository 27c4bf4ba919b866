// PyManager, PyRegistration and PyTransfer.
#include <cmath>
#include <limits>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

// Batches at least this large are submitted with the GIL released: a
// same-host backend may copy inside submit. Smaller ones keep the GIL (a
// release costs more than their submit when other threads want it).
constexpr uint64_t kReleaseGilBytes = 256 * 1024;

// How often a blocked wait wakes up to run signal handlers (Ctrl-C).
constexpr auto kSignalCheckInterval = std::chrono::milliseconds(100);

std::chrono::milliseconds seconds_to_ms(double seconds) {
  if (std::isnan(seconds) || seconds < 0) {
    raise_code(
        StatusCode::kInvalidArgument,
        "timeout must be a number of seconds >= 0 (or None), not " + std::to_string(seconds));
  }
  const double ms = std::ceil(seconds * 1000.0);
  // Anything beyond ~290 million years means no deadline.
  if (ms >= static_cast<double>(std::numeric_limits<int64_t>::max() / 2)) {
    return std::chrono::milliseconds::max();
  }
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// --- PyManager ----------------------------------------------------------------

PyManager::PyManager(std::unique_ptr<Manager> manager)
    : manager_(std::move(manager)), generation_(fork_generation()) {}

PyManager::~PyManager() {
  if (!in_this_process()) {
    // Its threads live in the parent: shutting it down here would wait for
    // threads that do not exist. Leak it.
    (void)manager_.release();
    return;
  }
  if (!manager_) return;
  if (shut_down_ || interpreter_finalizing()) {
    manager_.reset();
    return;
  }
  py::gil_scoped_release nogil;
  manager_.reset();
}

Manager& PyManager::get() {
  if (!in_this_process()) {
    raise_code(StatusCode::kFailedPrecondition,
               "this rdmabuf manager was created by the parent of this forked process and cannot "
               "be used here; rdmabuf creates a new one for this process on next use");
  }
  if (shut_down_) raise_code(StatusCode::kFailedPrecondition, "the rdmabuf manager is shut down");
  return *manager_;
}

std::chrono::milliseconds PyManager::timeout_ms(std::optional<double> seconds) const {
  if (!seconds) return manager_->config().default_timeout;
  return seconds_to_ms(*seconds);
}

void PyManager::shutdown() {
  if (!in_this_process() || shut_down_) return;
  shut_down_ = true;
  py::gil_scoped_release nogil;
  manager_->shutdown();
}

// --- PyRegistration -------------------------------------------------------------

PyRegistration::PyRegistration(py::object manager, RemoteBuffer handle, PyLocal local)
    : manager_(std::move(manager)),
      handle_(std::move(handle)),
      local_(std::move(local)),
      generation_(fork_generation()) {}

PyRegistration::~PyRegistration() {
  try {
    drop();
  } catch (py::error_already_set& e) {
    // A destructor cannot raise; drop() raises only on a bug.
    e.discard_as_unraisable("rdmabuf: releasing a garbage-collected RDMABuffer");
  }
}

void PyRegistration::drop() {
  if (dropped_) return;
  dropped_ = true;
  auto& manager = manager_.cast<PyManager&>();
  Status st;
  if (generation_ == fork_generation() && manager.in_this_process() && !manager.shut_down() &&
      !interpreter_finalizing()) {
    Manager& m = manager.get();
    py::gil_scoped_release nogil;
    st = m.release(handle_);
  }
  // release() returned (or the manager released everything when it shut
  // down): no peer touches the memory any more.
  local_.reset();
  // kNotFound: released already; kFailedPrecondition: shut down meanwhile.
  if (!st.ok() && st.code() != StatusCode::kNotFound &&
      st.code() != StatusCode::kFailedPrecondition) {
    raise_status(st);
  }
}

// --- PyTransfer ---------------------------------------------------------------

PyTransfer::PyTransfer(py::object manager, bool single)
    : manager_(std::move(manager)), single_(single), generation_(fork_generation()) {}

PyTransfer::~PyTransfer() {
  if (transfer_ && generation_ != fork_generation()) {
    // Inherited through fork: the threads that would finish it are gone,
    // so cancelling could wait for ever. Leak it, and the memory with it.
    (void)transfer_.release();
    for (PyLocal& l : locals_)
      l.reset();
    return;
  }
  // Cancels an unfinished transfer: afterwards the library no longer
  // touches the memory, which locals_ (destroyed next) may then let go.
  transfer_.reset();
}

void PyTransfer::start(Manager& manager, std::vector<Op> ops, std::vector<PyLocal> locals,
                       std::chrono::milliseconds timeout, bool notify) {
  uint64_t total = 0;
  for (const Op& op : ops)
    total += op.bytes();
  if (single_ && !ops.empty()) bytes_ = ops[0].bytes();
  locals_ = std::move(locals);
  if (notify) completion_ = std::make_shared<Completion>();
  auto submit = [&] {
    if (!notify) return manager.submit(std::move(ops), timeout);
    return manager.submit(std::move(ops), timeout, [c = completion_] { c->fire(); });
  };
  if (total >= kReleaseGilBytes) {
    py::gil_scoped_release nogil;
    transfer_ = std::make_unique<Transfer>(submit());
  } else {
    transfer_ = std::make_unique<Transfer>(submit());
  }
}

void PyTransfer::check_process() const {
  if (generation_ != fork_generation()) {
    raise_code(StatusCode::kFailedPrecondition,
               "this transfer was started by the parent of this forked process; its outcome "
               "is not known here");
  }
}

bool PyTransfer::done() {
  check_process();
  return !transfer_ || transfer_->done();
}

bool PyTransfer::wait(std::optional<double> timeout) {
  if (done()) return true;
  const Deadline until = timeout ? deadline_after(seconds_to_ms(*timeout)) : Deadline::max();
  Transfer& t = *transfer_;
  for (;;) {
    bool finished;
    bool expired;
    {
      py::gil_scoped_release nogil;
      // Signal handlers run on the main thread only; elsewhere the check
      // below costs nothing, so every thread wakes up alike.
      finished = t.wait_until(std::min(until, deadline_after(kSignalCheckInterval)));
      expired = Clock::now() >= until;
    }
    if (finished) return true;
    if (expired) return false;
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set interrupted;
      cancel();
      throw interrupted;
    }
  }
}

py::object PyTransfer::result() {
  if (!done()) {
    raise_code(StatusCode::kFailedPrecondition, "the transfer is still in flight");
  }
  for (PyLocal& l : locals_)
    l.reset();
  const Status st = transfer_ ? transfer_->status() : Status::Ok();
  if (!st.ok()) {
    std::optional<size_t> index;
    if (!single_) {
      for (size_t i = 0; i < transfer_->op_count(); ++i) {
        if (!transfer_->op_status(i).ok()) {
          index = i;
          break;
        }
      }
    }
    raise_status(st, index);
  }
  if (single_) return py::int_(bytes_);
  return py::none();
}

py::object PyTransfer::wait_result(std::optional<double> timeout) {
  if (!wait(timeout)) {
    PyErr_SetString(PyExc_TimeoutError,
                    "the transfer did not finish within the time given to get(); it goes on "
                    "(its own timeout still applies)");
    throw py::error_already_set();
  }
  return result();
}

void PyTransfer::cancel() {
  if (!transfer_ || generation_ != fork_generation()) return;
  // Short: waits only for a library thread inside one copy or syscall.
  transfer_->cancel();
}

int PyTransfer::attach(const std::shared_ptr<Notifier>& notifier, uint64_t token) {
  check_process();
  if (!completion_) return done() ? kDone : kNoCallback;
  return completion_->attach(notifier, token) ? kAttached : kDone;
}

}  // namespace rdmabuf::python
