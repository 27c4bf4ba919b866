// Identities of the storage behind Python objects, so that the library's
// registration caches (LocalMemory's keepalive, rdmabuf/memory.h) reuse one
// registration for every transfer on the same tensor or array.
//
// The identity of an object's memory is a token tied to the object that
// bounds where its bytes live (its "root"): the tensor or array at the
// bottom of its chain of views, or a memoryview itself. The token is dropped
// when the root is collected (a weakref callback), or replaced when the root's
// memory has moved (a resize), so a registration made for memory that is
// gone is never matched again: the caches hold tokens weakly. The token owns
// nothing; the memory is kept alive during a transfer by PyLocal's export or
// reference, as before. Objects whose life cannot be observed (bytes,
// bytearray: no weakrefs) get no token and are registered per transfer.
//
// All of this runs with the GIL held, which guards the table.
#include <unordered_map>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

struct Entry {
  uintptr_t base = 0;  // the root's first byte when the token was made
  std::shared_ptr<const void> token;
  py::object weakref;  // to the root; its callback erases the entry
};

// Roots by address (unique while they live; the callback erases an entry
// before its root's address can be reused). Leaked on purpose: weakref
// callbacks may run during interpreter shutdown.
std::unordered_map<PyObject*, Entry>& table() {
  static auto* t = new std::unordered_map<PyObject*, Entry>();
  return *t;
}

// numpy.ndarray when numpy has been imported by someone; never imports it.
PyObject* ndarray_type() {
  static PyObject* cached = nullptr;
  if (cached) return cached;
  PyObject* numpy = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");  // borrowed
  if (!numpy) return nullptr;
  cached = PyObject_GetAttrString(numpy, "ndarray");  // kept for the process
  if (!cached) PyErr_Clear();
  return cached;
}

bool is_ndarray(py::handle obj) {
  PyObject* type = ndarray_type();
  return type && PyObject_IsInstance(obj.ptr(), type) == 1;
}

// The array at the bottom of `array`'s chain of views that still is an
// ndarray: it owns the memory, or holds the export of the object that does.
py::handle ndarray_root(py::handle array) {
  py::handle root = array;
  for (;;) {
    py::object base = py::reinterpret_steal<py::object>(PyObject_GetAttrString(root.ptr(), "base"));
    if (!base) {
      PyErr_Clear();
      return root;
    }
    if (base.is_none() || !is_ndarray(base)) return root;
    root = base;  // kept alive by the view that names it
  }
}

// The object whose life bounds where `obj`'s bytes are, and its first byte;
// a null handle when there is none to watch.
std::pair<py::handle, uintptr_t> root_of(py::handle obj, bool is_tensor) {
  if (is_tensor) {
    // torch 2 keeps one Python object per live storage: the storage itself.
    if (PyObject_HasAttrString(obj.ptr(), "untyped_storage")) {
      py::object storage = obj.attr("untyped_storage")();
      if (Py_TYPE(storage.ptr())->tp_weaklistoffset != 0) {
        const auto base = storage.attr("data_ptr")().cast<uintptr_t>();
        // Alive after `storage` goes: the tensor holds it.
        return {storage.ptr(), base};
      }
    }
    // torch 1: the tensor at the bottom of the chain of views.
    py::handle root = obj;
    for (;;) {
      py::object base = root.attr("_base");
      if (base.is_none()) break;
      root = base;  // kept alive by the view that names it
    }
    return {root, root.attr("data_ptr")().cast<uintptr_t>()};
  }
  py::handle root = obj;
  if (PyMemoryView_Check(obj.ptr())) {
    PyObject* exporter = PyMemoryView_GET_BASE(obj.ptr());
    if (exporter && is_ndarray(exporter)) root = ndarray_root(exporter);
  } else if (is_ndarray(obj)) {
    root = ndarray_root(obj);
  }
  if (Py_TYPE(root.ptr())->tp_weaklistoffset == 0) return {py::handle(), 0};
  if (PyMemoryView_Check(root.ptr())) {
    return {root, reinterpret_cast<uintptr_t>(PyMemoryView_GET_BUFFER(root.ptr())->buf)};
  }
  Py_buffer view;
  if (PyObject_GetBuffer(root.ptr(), &view, PyBUF_STRIDES) != 0) {
    PyErr_Clear();
    return {py::handle(), 0};
  }
  const auto base = reinterpret_cast<uintptr_t>(view.buf);
  PyBuffer_Release(&view);
  return {root, base};
}

}  // namespace

std::shared_ptr<const void> storage_identity(py::handle obj, bool is_tensor) {
  auto [root, base] = root_of(obj, is_tensor);
  if (!root) return nullptr;
  auto& entries = table();
  auto it = entries.find(root.ptr());
  if (it != entries.end()) {
    if (it->second.base == base) return it->second.token;
    // The root's memory moved (resize): what was registered for the old
    // place must not be matched again.
    it->second.token = std::make_shared<const char>(0);
    it->second.base = base;
    return it->second.token;
  }
  PyObject* key = root.ptr();
  py::cpp_function forget([key](py::handle) {
    auto& all = table();
    auto found = all.find(key);
    if (found == all.end()) return;
    py::object ref = std::move(found->second.weakref);  // dies after the erase
    all.erase(found);
  });
  PyObject* ref = PyWeakref_NewRef(key, forget.ptr());
  if (!ref) {
    PyErr_Clear();
    return nullptr;
  }
  Entry entry{base, std::make_shared<const char>(0), py::reinterpret_steal<py::object>(ref)};
  auto token = entry.token;
  entries.emplace(key, std::move(entry));
  return token;
}

size_t storage_identity_count() {
  return table().size();
}

}  // namespace rdmabuf::python
