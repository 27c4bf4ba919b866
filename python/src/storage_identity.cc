// Identities of the storage behind Python objects, so that transfers on
// the same tensor or array reuse one registration with a NIC.
//
// Each storage is watched through the object that bounds where its bytes
// live (its "root"): a torch storage (torch 2), the tensor at the bottom of
// a chain of views (torch 1), the array at the bottom of a chain of numpy
// views, or a memoryview. The storage's whole extent is given to
// remember_memory() (rdmabuf/memory.h), so every transfer on any part of it
// reuses one registration, and forget_memory() when the root is collected
// (a weakref callback, which runs before the memory is freed) or when the
// root's memory has moved (a resize). A storage whose extent cannot be
// remembered (not contiguous, or overlapping a range remembered by other
// code) gets a token instead, passed as its memory's keepalive: the NIC's
// cache matches it only for ranges registered through it. Neither owns the
// memory; PyLocal's export or reference keeps it alive during a transfer,
// as before. Objects whose life cannot be observed (bytes, bytearray: no
// weakrefs) get neither and are registered per transfer.
//
// All of this runs with the GIL held, which guards the tables.
#include <optional>
#include <unordered_map>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

struct Extent {
  uintptr_t base = 0;  // the storage's first byte
  size_t size = 0;     // 0: not known (not contiguous)
  bool operator==(const Extent&) const = default;
};

struct Entry {
  Extent extent;
  bool remembered = false;  // else `token` identifies it
  std::shared_ptr<const void> token;
  py::object weakref;  // to the root; its callback erases the entry
};

// Entries by root (unique while it lives: the callback erases an entry
// before its root's address can be reused), and remembered extents by
// first byte to the root that watches them. Leaked on purpose: weakref
// callbacks may run during interpreter shutdown.
struct Tables {
  std::unordered_map<PyObject*, Entry> roots;
  std::unordered_map<uintptr_t, PyObject*> remembered;
};

Tables& tables() {
  static auto* t = new Tables();
  return *t;
}

void forget(Entry& e) {
  if (!e.remembered) return;
  forget_memory(reinterpret_cast<const void*>(e.extent.base), e.extent.size);
  tables().remembered.erase(e.extent.base);
  e.remembered = false;
}

// Gives `e` its extent, remembered where it can be, else a fresh token.
void adopt(Entry& e, PyObject* root, Extent extent) {
  forget(e);
  e.extent = extent;
  e.token.reset();
  if (extent.size > 0 &&
      remember_memory(reinterpret_cast<const void*>(extent.base), extent.size).ok()) {
    e.remembered = true;
    tables().remembered[extent.base] = root;
  } else {
    e.token = std::make_shared<const char>(0);
  }
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

// The extent of the buffer `root` exports (size 0 when not contiguous); a
// null optional when it exports none.
std::optional<Extent> buffer_extent(py::handle root) {
  Py_buffer view;
  if (PyObject_GetBuffer(root.ptr(), &view, PyBUF_ANY_CONTIGUOUS) == 0) {
    Extent e{reinterpret_cast<uintptr_t>(view.buf), static_cast<size_t>(view.len)};
    PyBuffer_Release(&view);
    return e;
  }
  PyErr_Clear();
  if (PyObject_GetBuffer(root.ptr(), &view, PyBUF_STRIDES) != 0) {
    PyErr_Clear();
    return std::nullopt;
  }
  Extent e{reinterpret_cast<uintptr_t>(view.buf), 0};
  PyBuffer_Release(&view);
  return e;
}

Extent storage_extent(py::handle storage) {
  return Extent{storage.attr("data_ptr")().cast<uintptr_t>(),
                storage.attr("nbytes")().cast<size_t>()};
}

// The object whose life bounds where `obj`'s bytes are (a new reference:
// torch may make the storage object on request), and its storage's extent;
// a null object when there is none to watch.
std::pair<py::object, Extent> root_of(py::handle obj, bool is_tensor) {
  if (is_tensor) {
    // torch 2 keeps one Python object per live storage: the storage itself.
    if (PyObject_HasAttrString(obj.ptr(), "untyped_storage")) {
      py::object storage = obj.attr("untyped_storage")();
      if (Py_TYPE(storage.ptr())->tp_weaklistoffset != 0) {
        Extent extent = storage_extent(storage);
        return {std::move(storage), extent};
      }
    }
    // torch 1: the tensor at the bottom of the chain of views.
    py::handle root = obj;
    for (;;) {
      py::object base = root.attr("_base");
      if (base.is_none()) break;
      root = base;  // kept alive by the view that names it
    }
    return {py::reinterpret_borrow<py::object>(root), storage_extent(root.attr("storage")())};
  }
  py::handle root = obj;
  if (PyMemoryView_Check(obj.ptr())) {
    PyObject* exporter = PyMemoryView_GET_BASE(obj.ptr());
    if (exporter && is_ndarray(exporter)) root = ndarray_root(exporter);
  } else if (is_ndarray(obj)) {
    root = ndarray_root(obj);
  }
  if (Py_TYPE(root.ptr())->tp_weaklistoffset == 0) return {py::object(), {}};
  auto extent = buffer_extent(root);
  if (!extent) return {py::object(), {}};
  return {py::reinterpret_borrow<py::object>(root), *extent};
}

}  // namespace

std::shared_ptr<const void> storage_identity(py::handle obj, bool is_tensor) {
  auto [root, extent] = root_of(obj, is_tensor);
  if (!root) return nullptr;
  Tables& t = tables();
  auto it = t.roots.find(root.ptr());
  if (it != t.roots.end()) {
    // A moved storage (resize): what was registered for the old place must
    // not be matched again.
    if (!(it->second.extent == extent)) adopt(it->second, root.ptr(), extent);
    return it->second.token;
  }
  // Another live root of the same storage (a view that does not name its
  // base) has remembered it already.
  if (auto same = t.remembered.find(extent.base); same != t.remembered.end()) {
    const Entry& watcher = t.roots.at(same->second);
    if (watcher.extent == extent) return nullptr;
  }
  PyObject* key = root.ptr();
  py::cpp_function on_collected([key](py::handle) {
    Tables& all = tables();
    auto found = all.roots.find(key);
    if (found == all.roots.end()) return;
    forget(found->second);
    py::object ref = std::move(found->second.weakref);  // dies after the erase
    all.roots.erase(found);
  });
  PyObject* ref = PyWeakref_NewRef(key, on_collected.ptr());
  if (!ref) {
    PyErr_Clear();
    return nullptr;
  }
  Entry& entry = t.roots[key];
  entry.weakref = py::reinterpret_steal<py::object>(ref);
  adopt(entry, key, extent);
  return entry.token;
}

size_t storage_identity_count() {
  return tables().roots.size();
}

}  // namespace rdmabuf::python
