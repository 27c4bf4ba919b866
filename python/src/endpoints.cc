// Endpoints for Python (rdmabuf/endpoint.h): Manager.listen / connect /
// next_notification, and the Listener, Endpoint and LentMemory objects.
//
// Every call that may wait releases the GIL. The Python memory a call uses
// (a message, a receive buffer, a tagged write's source) is held as a
// PyLocal for the call's whole length: Endpoint's calls touch their memory
// only until they return (a receive that times out is withdrawn before it
// returns), so nothing outlives the call. A posted send or receive holds
// its memory until its wait has returned or it is dropped (cancelled or
// withdrawn first, so that no byte moves once the memory is let go).
#include <cmath>
#include <limits>
#include <type_traits>

#include <pybind11/stl.h>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

// Seconds (a lease, Python's unit) as milliseconds: at least 1 ms for any
// lease > 0, so that a short lease is not refused as none.
std::chrono::milliseconds lease_ms(double seconds) {
  if (std::isnan(seconds) || seconds <= 0) {
    raise_code(StatusCode::kInvalidArgument,
               "a lease must be a number of seconds > 0, not " + std::to_string(seconds));
  }
  const double ms = std::ceil(seconds * 1000.0);
  if (ms >= static_cast<double>(std::numeric_limits<int64_t>::max() / 2)) {
    return std::chrono::milliseconds(std::numeric_limits<int64_t>::max() / 2);
  }
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

double to_seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

// Runs `call` (a library call that may wait) with the GIL released, and
// raises its error: its value, for a Result.
template <typename Call>
auto released(Call call) {
  auto outcome = [&] {
    py::gil_scoped_release nogil;
    return call();
  }();
  if constexpr (std::is_same_v<decltype(outcome), Status>) {
    if (!outcome.ok()) raise_status(outcome);
  } else {
    if (!outcome.ok()) raise_status(outcome.status());
    return std::move(outcome).value();
  }
}

}  // namespace

// An endpoint, and the manager it belongs to (which must outlive it).
class PyEndpoint {
 public:
  PyEndpoint(py::object manager, std::unique_ptr<Endpoint> endpoint)
      : manager_(std::move(manager)),
        endpoint_(std::move(endpoint)),
        generation_(fork_generation()) {}

  ~PyEndpoint() {
    if (generation_ != fork_generation()) {
      (void)endpoint_.release();  // its threads are in the parent: leak it
      return;
    }
    if (interpreter_finalizing()) {
      endpoint_.reset();
      return;
    }
    py::gil_scoped_release nogil;  // closing waits for the endpoint's server and lease keeper
    endpoint_.reset();
  }

  PyEndpoint(const PyEndpoint&) = delete;
  PyEndpoint& operator=(const PyEndpoint&) = delete;

  void send(py::handle data, std::optional<double> timeout) {
    const auto ms = timeout_ms(timeout);
    PyLocal message = PyLocal::acquire(data, /*writable=*/false, "send: data");
    Endpoint& e = get();
    released([&] { return e.send(message.memory(), ms); });
  }

  uint64_t receive(py::handle into, std::optional<double> timeout) {
    const auto ms = timeout_ms(timeout);
    PyLocal buffer = PyLocal::acquire(into, /*writable=*/true, "receive: into");
    Endpoint& e = get();
    return released([&] { return e.receive(buffer.memory(), ms); });
  }

  PendingReceive post_receive(const PyLocal& into) {
    Endpoint& e = get();
    return released([&] { return e.post_receive(into.memory()); });
  }

  PendingSend post_send(const PyLocal& message) {
    Endpoint& e = get();
    return released([&] { return e.post_send(message.memory()); });
  }

  void write(const RemoteBuffer& dst, py::handle src, uint32_t tag, std::optional<double> timeout) {
    check_handle(dst);
    const auto ms = timeout_ms(timeout);
    PyLocal data = PyLocal::acquire(src, /*writable=*/false, "write: src");
    if (data.size() > dst.size()) {
      raise_code(StatusCode::kInvalidArgument, "write: src holds " + std::to_string(data.size()) +
                                                   " B, more than the buffer's " +
                                                   std::to_string(dst.size()) + " B");
    }
    Endpoint& e = get();
    released([&] { return e.write(dst, data.memory(), tag, ms); });
  }

  // (the lent buffer's handle, the lease granted in seconds)
  py::tuple request_remote_buffer(uint64_t size, double lease, std::optional<double> timeout) {
    const auto ms = timeout_ms(timeout);
    const auto asked = lease_ms(lease);
    Endpoint& e = get();
    Lease granted = released([&] { return e.request_remote_buffer(size, asked, ms); });
    return py::make_tuple(granted.buffer, to_seconds(granted.granted));
  }

  double renew(const RemoteBuffer& lent, double lease, std::optional<double> timeout) {
    check_handle(lent);
    const auto ms = timeout_ms(timeout);
    const auto asked = lease_ms(lease);
    Endpoint& e = get();
    return to_seconds(released([&] { return e.renew(lent, asked, ms); }));
  }

  void send_buffer(const RemoteBuffer& buffer, std::optional<double> timeout) {
    check_handle(buffer);
    const auto ms = timeout_ms(timeout);
    Endpoint& e = get();
    released([&] { return e.send_buffer(buffer, ms); });
  }

  RemoteBuffer receive_buffer(std::optional<double> timeout) {
    const auto ms = timeout_ms(timeout);
    Endpoint& e = get();
    return released([&] { return e.receive_buffer(ms); });
  }

  LocalMemory receive_local_buffer(std::optional<double> timeout) {
    const auto ms = timeout_ms(timeout);
    Endpoint& e = get();
    return released([&] { return e.receive_local_buffer(ms); });
  }

  // Fixed at connection: readable whatever happened since (a repr never fails).
  std::string peer() const { return endpoint_->peer(); }
  std::string channel() const { return endpoint_->channel(); }

  void close() {
    if (generation_ != fork_generation() || !endpoint_) return;
    py::gil_scoped_release nogil;
    endpoint_->close();
  }

  std::chrono::milliseconds timeout_ms(std::optional<double> seconds) {
    return manager_.cast<PyManager&>().timeout_ms(seconds);
  }

 private:
  Endpoint& get() {
    if (generation_ != fork_generation()) {
      raise_code(StatusCode::kFailedPrecondition,
                 "this endpoint was connected by the parent of this forked process and cannot be "
                 "used here");
    }
    manager_.cast<PyManager&>().get();  // refuses a manager shut down
    return *endpoint_;
  }

  py::object manager_;  // PyManager
  std::unique_ptr<Endpoint> endpoint_;
  uint64_t generation_;
};

// A posted receive (Endpoint.post_receive) or send (post_send): the
// library's PendingReceive / PendingSend, the memory it uses, and the
// endpoint (which keeps the manager). wait() may come once; dropping it
// unwaited withdraws the receive or cancels the send, with the GIL
// released, before the memory is let go.
template <typename Pending>
class PyPending {
 public:
  PyPending(py::object endpoint, PyLocal memory, Pending pending)
      : endpoint_(std::move(endpoint)),
        memory_(std::move(memory)),
        pending_(std::move(pending)),
        generation_(fork_generation()) {}

  ~PyPending() {
    if (generation_ != fork_generation()) {
      (void)new Pending(
          std::move(pending_));  // its endpoint's server and workers are in the parent: leak it
      return;
    }
    if (interpreter_finalizing()) {
      pending_ = Pending();
    } else {
      py::gil_scoped_release nogil;
      pending_ = Pending();
    }
    memory_.reset();
  }

  PyPending(const PyPending&) = delete;
  PyPending& operator=(const PyPending&) = delete;

  // The message's size for a receive; None for a send.
  auto wait(std::optional<double> timeout) {
    if (generation_ != fork_generation()) {
      raise_code(StatusCode::kFailedPrecondition,
                 "this was posted by the parent of this forked process and cannot be waited for "
                 "here");
    }
    const auto ms = endpoint_.cast<PyEndpoint&>().timeout_ms(timeout);
    struct Release {  // the memory goes once the wait is over, whatever its outcome
      PyLocal& memory;
      ~Release() { memory.reset(); }
    } release{memory_};
    return released([&] { return pending_.wait(ms); });
  }

 private:
  py::object endpoint_;  // PyEndpoint
  PyLocal memory_;
  Pending pending_;
  uint64_t generation_;
};

using PyPendingReceive = PyPending<PendingReceive>;
using PyPendingSend = PyPending<PendingSend>;

// A listener. close() may come from another thread while one waits in
// accept() (without the GIL): the waiting call holds its own reference, so
// the listener is destroyed only once both are done with it.
class PyListener {
 public:
  PyListener(py::object manager, std::unique_ptr<EndpointListener> listener)
      : manager_(std::move(manager)),
        listener_(std::move(listener)),
        address_(listener_->address()) {}

  std::unique_ptr<PyEndpoint> accept(std::optional<double> timeout) {
    auto& pm = manager_.cast<PyManager&>();
    pm.get();
    const auto ms = pm.timeout_ms(timeout);
    std::shared_ptr<EndpointListener> listener = listener_;
    if (!listener) raise_code(StatusCode::kCancelled, "the listener was closed");
    return std::make_unique<PyEndpoint>(manager_, released([&] { return listener->accept(ms); }));
  }

  const std::string& address() const { return address_; }

  // Stops listening and wakes a waiting accept(). Idempotent.
  void close() {
    std::shared_ptr<EndpointListener> listener = std::move(listener_);
    if (!listener) return;
    listener->close();  // never blocks
  }

 private:
  py::object manager_;
  std::shared_ptr<EndpointListener> listener_;  // null once closed
  std::string address_;
};

void bind_endpoints(py::module_& module, py::class_<PyManager>& manager) {
  py::class_<LocalMemory>(module, "LentMemory", py::buffer_protocol())
      .def_property_readonly("size", &LocalMemory::size)
      .def_buffer([](LocalMemory& memory) {
        return py::buffer_info(memory.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(memory.size())}, {1});
      });

  py::class_<PyPendingReceive>(module, "PendingReceive").def("wait", &PyPendingReceive::wait);
  py::class_<PyPendingSend>(module, "PendingSend").def("wait", &PyPendingSend::wait);

  py::class_<PyEndpoint>(module, "Endpoint")
      .def("send", &PyEndpoint::send)
      .def("receive", &PyEndpoint::receive)
      .def("post_receive",
           [](py::object self, py::handle into) {
             PyLocal memory = PyLocal::acquire(into, /*writable=*/true, "post_receive: into");
             PendingReceive pending = self.cast<PyEndpoint&>().post_receive(memory);
             return std::make_unique<PyPendingReceive>(self, std::move(memory), std::move(pending));
           })
      .def("post_send",
           [](py::object self, py::handle data) {
             PyLocal memory = PyLocal::acquire(data, /*writable=*/false, "post_send: data");
             PendingSend pending = self.cast<PyEndpoint&>().post_send(memory);
             return std::make_unique<PyPendingSend>(self, std::move(memory), std::move(pending));
           })
      .def("write", &PyEndpoint::write)
      .def("request_remote_buffer", &PyEndpoint::request_remote_buffer)
      .def("renew", &PyEndpoint::renew)
      .def("send_buffer", &PyEndpoint::send_buffer)
      .def("receive_buffer", &PyEndpoint::receive_buffer)
      // A memoryview of a LentMemory, which holds the lent allocation.
      .def("receive_local_buffer",
           [](PyEndpoint& e, std::optional<double> timeout) {
             return py::memoryview(py::cast(e.receive_local_buffer(timeout)));
           })
      .def_property_readonly("peer", &PyEndpoint::peer)
      .def_property_readonly("channel", &PyEndpoint::channel)
      .def("close", &PyEndpoint::close);

  py::class_<PyListener>(module, "Listener")
      .def("accept", &PyListener::accept)
      .def_property_readonly("address", &PyListener::address)
      .def("close", &PyListener::close);

  manager
      .def("listen",
           [](py::object self, const std::string& address) {
             Manager& m = self.cast<PyManager&>().get();
             return std::make_unique<PyListener>(self, released([&] { return m.listen(address); }));
           })
      .def("connect",
           [](py::object self, const std::string& address, std::optional<double> timeout) {
             auto& pm = self.cast<PyManager&>();
             Manager& m = pm.get();
             const auto ms = pm.timeout_ms(timeout);
             return std::make_unique<PyEndpoint>(self,
                                                 released([&] { return m.connect(address, ms); }));
           })
      // (tag, buffer id, offset, length, peer)
      .def("next_notification", [](PyManager& pm, std::optional<double> timeout) {
        Manager& m = pm.get();
        const auto ms = pm.timeout_ms(timeout);
        Notification n = released([&] { return m.next_notification(ms); });
        return py::make_tuple(n.tag, n.buffer_id, n.offset, n.length, n.peer);
      });
}

}  // namespace rdmabuf::python
