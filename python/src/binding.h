// The compiled half of the Python package: the objects the module `_rdmabuf`
// exposes and the rules that keep Python memory safe under a transfer.
//
// Memory and threads. Library threads never touch a Python object: they do
// not take the GIL, and no C++ keepalive of a LocalMemory owns a Python
// reference. Instead the Python-side objects (PyRegistration, PyTransfer)
// hold the Python objects and their buffer exports themselves, and let go of
// them only once the library has stopped touching the memory: after
// Manager::release returned, or once the Transfer is done (finished,
// cancelled or destroyed, see rdmabuf/transfer.h).
//
// Fork. A forked child has none of its parent's library threads, so it must
// never call into, or destroy, a Manager created before the fork. Every object
// remembers the fork generation it was made in (bumped by a pthread_atfork
// handler); in a later generation calls fail with FailedPrecondition and
// destructors leak what they would otherwise shut down.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rdmabuf/rdmabuf.h"

namespace rdmabuf::python {

namespace py = pybind11;

// --- Errors -----------------------------------------------------------------

// Installs the Python exception classes, one per StatusCode (rdmabuf/_errors.py).
void set_error_types(const py::dict& types);
// Sets the Python error for `status` (the class registered for its code) and
// throws py::error_already_set. `op_index`, when given, is stored on the
// exception as `op_index`.
[[noreturn]] void raise_status(const Status& status, std::optional<size_t> op_index = {});
[[noreturn]] void raise_code(StatusCode code, std::string message);

// --- Fork -------------------------------------------------------------------

void install_fork_handler();
uint64_t fork_generation();

// Whether Python is shutting down: the GIL must not be released then (a
// thread that takes it back is stopped for good).
bool interpreter_finalizing();

// --- Local memory from Python objects ---------------------------------------

// A Python object's memory as a LocalMemory, and what keeps it valid: a
// buffer export (which also stops a bytearray or ndarray from being resized)
// or, for a torch tensor, a reference to the tensor. Move-only; destroy with
// the GIL held.
class PyLocal {
 public:
  PyLocal() = default;
  PyLocal(PyLocal&& other) noexcept;
  PyLocal& operator=(PyLocal&& other) noexcept;
  PyLocal(const PyLocal&) = delete;
  PyLocal& operator=(const PyLocal&) = delete;
  ~PyLocal() { reset(); }

  // Accepts a 1-D C-contiguous object that exports the buffer protocol
  // (ndarray, memoryview, bytearray, bytes when !writable), a 1-D
  // contiguous torch.Tensor on the CPU or a CUDA GPU, or any 1-D contiguous
  // GPU array that offers __cuda_array_interface__ or DLPack (CuPy, JAX,
  // Numba). `what` names the argument in messages. TypeError for other
  // types; ValueError (InvalidArgumentError) for data that is not 1-D, not
  // contiguous, read-only when `writable`, or holds Python objects;
  // UnimplementedError for tensors on other devices (meta, mps, ...).
  //
  // GPU memory: the work already queued on the object's stream (a torch
  // tensor's current stream; the stream __cuda_array_interface__ names;
  // the legacy default stream DLPack was asked to order it on) is waited
  // for here, with the GIL released, so the transfer sees it done.
  //
  // `strided`: for memory a transfer reads into or writes from, rather than
  // memory to register. Then any dense array or tensor that exports the
  // buffer protocol or is a torch.Tensor on the CPU or a CUDA GPU is
  // accepted, of any number of dimensions and any strides: its elements in
  // C (row-major) order are the bytes moved, without a copy (op() moves
  // them as the ranges they form in memory when they are not contiguous).
  static PyLocal acquire(py::handle obj, bool writable, const char* what, bool strided = false);

  // The op that reads `remote` into this memory, or writes this memory to
  // `remote` (kind): the whole of the remote range into the front of the
  // elements, or every element into the front of the remote range.
  Op op(OpKind kind, const RemoteBuffer& remote) const;

  // Gives host memory taken from `obj` the identity of its storage as its
  // keepalive (storage_identity), so that transfers on the same tensor or
  // array reuse one registration with a NIC. For memory read into or
  // written from; not for registrations, which hold their memory themselves.
  void identify(py::handle obj);

  // From the lowest byte of the object's elements to past the highest.
  const LocalMemory& memory() const { return memory_; }
  // The bytes of its elements.
  size_t size() const { return bytes_; }
  // Whether its elements lie end to end in memory(), in order.
  bool contiguous() const { return runs_.empty(); }
  // Drops the export / reference (GIL held).
  void reset();

 private:
  // GPU objects (gpu_local.cc): false when `obj` is none of them.
  static bool acquire_cuda_array(py::handle obj, bool writable, const char* what, PyLocal& local);
  static bool acquire_dlpack(py::handle obj, bool writable, const char* what, PyLocal& local);
  static PyLocal acquire_strided_tensor(py::handle obj, bool cuda, const char* what);
  // Refuses the buffer view taken (read-only when `writable`, or of Python
  // objects), letting it go first.
  void check_view(py::handle obj, bool writable, const char* what);
  // Takes an array at `first` of this shape, strides (bytes) and itemsize.
  void take_layout(void* first, std::span<const int64_t> shape, std::span<const int64_t> strides,
                   uint64_t itemsize, const char* what);

  LocalMemory memory_;
  uint64_t bytes_ = 0;
  // Where its elements lie in memory_, when they are not contiguous.
  std::vector<OpRange> runs_;
  Py_buffer view_{};
  bool has_view_ = false;
  py::object keep_;
  // Taken from a torch tensor (the tensor is keep_).
  bool tensor_ = false;
  // A DLPack tensor taken from its capsule: its deleter runs on reset().
  void* dlpack_ = nullptr;
};

// The memory of a CUDA torch tensor's data (its checks done), once the work
// queued on its current stream has finished (gpu_local.cc).
LocalMemory torch_cuda_memory(py::handle tensor, uintptr_t data, uint64_t nbytes, const char* what);
// Watches the storage behind host memory taken from `obj` (a torch tensor
// when `is_tensor`) so that transfers on it reuse one NIC registration: its
// extent is remembered (remember_memory) until its root object is collected
// or its memory moves (storage_identity.cc). Returns the token to pass as
// the memory's keepalive where the extent could not be remembered; null
// where nothing needs passing (remembered) or nothing can be watched (bytes,
// bytearray). GIL held.
std::shared_ptr<const void> storage_identity(py::handle obj, bool is_tensor);
// How many storages are watched now (for tests).
size_t storage_identity_count();
// Runs the deleter of a DLPack tensor PyLocal took (null: nothing). GIL held.
void release_dlpack(void* managed);

// --- Completions to an event loop -------------------------------------------

// An eventfd and a queue of tokens: library threads push, the event loop's
// thread drains. The eventfd is written only when the queue goes from empty
// to non-empty, so a burst of completions costs one wake-up.
class Notifier {
 public:
  Notifier();
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  int fd() const { return fd_; }
  // Any thread; never blocks, never takes the GIL.
  void push(uint64_t token);
  // The tokens pushed since the last drain (clears the eventfd first, so no
  // wake-up is lost).
  std::vector<uint64_t> drain();

 private:
  int fd_ = -1;
  std::mutex mu_;
  std::vector<uint64_t> ready_;
};

// Shared between a PyTransfer and the on_done callback of its Transfer:
// whether the transfer finished and who to tell when it does. Holds no
// Python object (it may be destroyed on a library thread).
class Completion {
 public:
  // on_done: marks done and pushes the token of every attached waiter.
  void fire();
  // Asks for `token` to be pushed to `notifier` when done. False (and
  // nothing attached) when done already.
  bool attach(std::shared_ptr<Notifier> notifier, uint64_t token);

 private:
  std::mutex mu_;
  bool done_ = false;
  std::vector<std::pair<std::shared_ptr<Notifier>, uint64_t>> waiters_;
};

// --- Manager, registrations, transfers ---------------------------------------

class PyTransfer;
class PyRegistration;

class PyManager {
 public:
  explicit PyManager(std::unique_ptr<Manager> manager);
  ~PyManager();
  PyManager(const PyManager&) = delete;
  PyManager& operator=(const PyManager&) = delete;

  // True when made in this process (not inherited through fork).
  bool in_this_process() const { return generation_ == fork_generation(); }
  bool shut_down() const { return shut_down_; }
  // The manager; FailedPrecondition when inherited through fork or shut down.
  Manager& get();
  // Unchecked: for reading config/identity only.
  const Manager& peek() const { return *manager_; }

  // Timeout in seconds (None: the configured default) as milliseconds.
  std::chrono::milliseconds timeout_ms(std::optional<double> seconds) const;

  void shutdown();

 private:
  std::unique_ptr<Manager> manager_;
  uint64_t generation_;
  bool shut_down_ = false;
};

// An owner-side registration: the handle, and the Python memory behind it,
// held until drop().
class PyRegistration {
 public:
  PyRegistration(py::object manager, RemoteBuffer handle, PyLocal local);
  ~PyRegistration();
  PyRegistration(const PyRegistration&) = delete;
  PyRegistration& operator=(const PyRegistration&) = delete;

  const RemoteBuffer& handle() const { return handle_; }
  bool dropped() const { return dropped_; }
  // Releases the buffer (waits, GIL released, until no peer's access is in
  // flight), then lets go of the Python memory. Idempotent. In a forked
  // child it only lets go (the parent's manager still serves the buffer).
  void drop();

 private:
  py::object manager_;  // PyManager
  RemoteBuffer handle_;
  PyLocal local_;
  uint64_t generation_;
  bool dropped_ = false;
};

// A submitted batch: the Transfer, the Python memory its ops use (held until
// it is done), and the completion the event loop attaches to.
class PyTransfer {
 public:
  // `single`: the result is the byte count of op 0 (read_into/write_from);
  // otherwise None (RDMAAction).
  PyTransfer(py::object manager, bool single);
  ~PyTransfer();
  PyTransfer(const PyTransfer&) = delete;
  PyTransfer& operator=(const PyTransfer&) = delete;

  // Submits `ops` (whose memory `locals` holds). Releases the GIL around the
  // submit call for large batches (a same-host backend may copy inside it).
  //
  // `notify`: submit with a completion callback, so that an event loop can
  // attach() and be woken through an eventfd, and the manager enforces the
  // deadline even while nobody waits. The callers pass it when an event loop
  // runs in the calling thread (the future will most likely be awaited).
  // Without it the transfer is submitted as a plain one, the cheapest path
  // for wait(): a callback costs the manager's deadline thread a wake-up
  // per transfer (several microseconds on a small machine). Such a transfer
  // enforces its deadline when looked at (wait, done), and can still be
  // awaited (attach() says it cannot notify; the Python layer then waits in
  // an executor thread).
  void start(Manager& manager, std::vector<Op> ops, std::vector<PyLocal> locals,
             std::chrono::milliseconds timeout, bool notify);

  // Non-blocking; also enforces the deadline.
  bool done();
  // Blocks (GIL released) until done, or at most `timeout` seconds; true
  // when done. Wakes every 100 ms on the main thread to run signal handlers;
  // an exception from one (KeyboardInterrupt) cancels the transfer and
  // propagates.
  bool wait(std::optional<double> timeout);
  // Once done: the byte count (single) or None, or raises the first failed
  // op's error. Lets go of the Python memory. Not done: raises
  // FailedPrecondition.
  py::object result();
  // wait(timeout) then result(); TimeoutError when not done in time.
  py::object wait_result(std::optional<double> timeout);
  // Cancels what is unfinished; returns when the memory is no longer touched.
  void cancel();
  // Asks for `token` to be pushed to `notifier` when done: kAttached; or
  // kDone (finished already; nothing attached); or kNoCallback (submitted
  // without notify: nothing attached, wait() instead).
  enum Attach : int { kDone = 0, kAttached = 1, kNoCallback = 2 };
  int attach(const std::shared_ptr<Notifier>& notifier, uint64_t token);

 private:
  // FailedPrecondition in a forked child: its library threads are gone.
  void check_process() const;

  py::object manager_;  // PyManager: outlives the transfer
  bool single_;
  uint64_t bytes_ = 0;
  uint64_t generation_;
  std::shared_ptr<Completion> completion_;  // null: submitted without notify
  // unique_ptr so that a transfer inherited through fork can be leaked.
  std::unique_ptr<Transfer> transfer_;
  std::vector<PyLocal> locals_;
};

// --- Allocations (allocation.cc) ------------------------------------------

// Adds allocate(nbytes) and the Allocation type (LocalMemory::allocate's
// memory, exported through the buffer protocol) to the module.
void bind_allocation(py::module_& module);

// --- Endpoints (endpoints.cc) ---------------------------------------------------

// Adds Manager.listen / connect / next_notification and the Listener,
// Endpoint and LentMemory types to the module.
void bind_endpoints(py::module_& module, py::class_<PyManager>& manager);

// Raises InvalidArgument for an empty handle.
void check_handle(const RemoteBuffer& remote);

}  // namespace rdmabuf::python
