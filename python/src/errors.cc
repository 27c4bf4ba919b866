// Statuses to Python exceptions, and the fork generation.
#include <pthread.h>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

// StatusCode -> exception class; filled once by rdmabuf/_errors.py. Strong
// references kept for the life of the process.
constexpr size_t kCodes = static_cast<size_t>(StatusCode::kInternal) + 1;
PyObject* g_error_types[kCodes] = {};

std::atomic<uint64_t> g_fork_generation{0};

void on_fork_child() {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void set_error_types(const py::dict& types) {
  for (auto [key, value] : types) {
    const auto code = key.cast<int>();
    if (code <= 0 || static_cast<size_t>(code) >= kCodes) {
      throw py::value_error("no status code " + std::to_string(code));
    }
    PyObject* type = value.ptr();
    if (!PyType_Check(type) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type),
                          reinterpret_cast<PyTypeObject*>(PyExc_Exception))) {
      throw py::type_error("error types must be Exception subclasses");
    }
    Py_INCREF(type);
    Py_XDECREF(g_error_types[code]);
    g_error_types[code] = type;
  }
}

void raise_status(const Status& status, std::optional<size_t> op_index) {
  const auto code = static_cast<size_t>(status.code());
  PyObject* type = code < kCodes ? g_error_types[code] : nullptr;
  if (type == nullptr) {
    // Before rdmabuf/_errors.py ran (only when _rdmabuf is used on its own).
    PyErr_SetString(PyExc_RuntimeError, status.to_string().c_str());
    throw py::error_already_set();
  }
  py::object error = py::reinterpret_borrow<py::object>(type)(status.message(), code);
  if (op_index) error.attr("op_index") = *op_index;
  PyErr_SetObject(type, error.ptr());
  throw py::error_already_set();
}

void raise_code(StatusCode code, std::string message) {
  raise_status(Status(code, std::move(message)));
}

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &on_fork_child); });
}

uint64_t fork_generation() {
  return g_fork_generation.load(std::memory_order_relaxed);
}

}  // namespace rdmabuf::python
