// PyLocal: the memory of an ndarray, memoryview, bytearray, bytes or torch
// tensor, checked and held.
#include <cstring>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

std::string type_name(py::handle obj) {
  return Py_TYPE(obj.ptr())->tp_name;
}

// True when a struct-module format string contains an object ('O') item,
// outside of field names (":name:" in structured formats).
bool format_has_objects(const char* format) {
  if (format == nullptr) return false;
  bool in_name = false;
  for (const char* p = format; *p; ++p) {
    if (*p == ':') in_name = !in_name;
    if (!in_name && *p == 'O') return true;
  }
  return false;
}

// torch.Tensor and torch.strided, once torch has been imported by someone;
// never imports it. Strong references kept for the life of the process.
struct Torch {
  PyObject* tensor = nullptr;
  PyObject* strided = nullptr;
};

const Torch* torch_types() {
  static Torch cached;
  if (cached.tensor) return &cached;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (!torch) return nullptr;
  PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
  PyObject* strided = PyObject_GetAttrString(torch, "strided");
  if (!tensor || !strided) {  // torch half-imported
    PyErr_Clear();
    Py_XDECREF(tensor);
    Py_XDECREF(strided);
    return nullptr;
  }
  cached.strided = strided;
  cached.tensor = tensor;
  return &cached;
}

}  // namespace

void PyLocal::identify(py::handle obj) {
  if (memory_.on_gpu() || memory_.keepalive() || memory_.size() == 0) return;
  auto token = storage_identity(obj, tensor_);
  if (token) memory_ = LocalMemory(memory_.data(), memory_.size(), std::move(token));
}

PyLocal::PyLocal(PyLocal&& other) noexcept {
  *this = std::move(other);
}

PyLocal& PyLocal::operator=(PyLocal&& other) noexcept {
  if (this != &other) {
    reset();
    memory_ = std::move(other.memory_);
    view_ = other.view_;
    has_view_ = std::exchange(other.has_view_, false);
    other.view_ = Py_buffer{};
    keep_ = std::move(other.keep_);
    tensor_ = std::exchange(other.tensor_, false);
    dlpack_ = std::exchange(other.dlpack_, nullptr);
    other.memory_ = LocalMemory();
  }
  return *this;
}

void PyLocal::reset() {
  if (has_view_) {
    PyBuffer_Release(&view_);
    has_view_ = false;
  }
  release_dlpack(dlpack_);
  dlpack_ = nullptr;
  keep_ = py::object();
  tensor_ = false;
  memory_ = LocalMemory();
}

PyLocal PyLocal::acquire(py::handle obj, bool writable, const char* what) {
  PyLocal local;
  PyObject* o = obj.ptr();
  if (PyObject_CheckBuffer(o)) {
    if (PyObject_GetBuffer(o, &local.view_, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      // The exporter says why (e.g. "ndarray is not C-contiguous").
      py::error_already_set cause;
      raise_code(StatusCode::kInvalidArgument,
                 std::string(what) + " must be 1-D and contiguous (" + cause.what() + ")");
    }
    local.has_view_ = true;
    const Py_buffer& v = local.view_;
    if (v.ndim != 1) {
      const std::string msg = std::string(what) + " must be 1-D, not " + std::to_string(v.ndim) +
                              "-D (reshape(-1) gives a 1-D view of contiguous data)";
      local.reset();
      raise_code(StatusCode::kInvalidArgument, msg);
    }
    if (writable && v.readonly) {
      const std::string msg = std::string(what) + " is read-only (" + type_name(obj) +
                              "); rdmabuf writes into it, so it must be writable";
      local.reset();
      raise_code(StatusCode::kInvalidArgument, msg);
    }
    if (format_has_objects(v.format)) {
      const std::string msg =
          std::string(what) + " holds Python objects (format '" + v.format + "'), not plain data";
      local.reset();
      raise_code(StatusCode::kInvalidArgument, msg);
    }
    local.memory_ = LocalMemory(v.buf, static_cast<size_t>(v.len));
    return local;
  }

  const Torch* torch = torch_types();
  if (torch && PyObject_IsInstance(o, torch->tensor) == 1) {
    const bool cuda = obj.attr("is_cuda").cast<bool>();
    if (!cuda && !obj.attr("is_cpu").cast<bool>()) {
      const std::string device = py::str(obj.attr("device").attr("type"));
      raise_code(StatusCode::kUnimplemented,
                 std::string(what) + " is a " + device +
                     " tensor; rdmabuf takes CPU and CUDA tensors (copy it with .cpu())");
    }
    if (obj.attr("layout").ptr() != torch->strided) {
      raise_code(StatusCode::kInvalidArgument, std::string(what) + " is a " +
                                                   std::string(py::str(obj.attr("layout"))) +
                                                   " tensor; only dense (strided) tensors work");
    }
    const auto dim = obj.attr("ndim").cast<int64_t>();
    if (dim != 1) {
      raise_code(StatusCode::kInvalidArgument,
                 std::string(what) + " must be 1-D, not " + std::to_string(dim) +
                     "-D (view(-1) gives a 1-D view of a contiguous tensor)");
    }
    if (!obj.attr("is_contiguous")().cast<bool>()) {
      raise_code(StatusCode::kInvalidArgument,
                 std::string(what) + " must be contiguous (.contiguous() makes a contiguous copy)");
    }
    // numel() * element_size(): torch 1.x has no nbytes.
    const auto nbytes =
        obj.attr("numel")().cast<uint64_t>() * obj.attr("element_size")().cast<uint64_t>();
    const auto ptr = obj.attr("data_ptr")().cast<uintptr_t>();
    local.memory_ = cuda ? torch_cuda_memory(obj, ptr, nbytes, what)
                         : LocalMemory(reinterpret_cast<void*>(ptr), nbytes);
    local.keep_ = py::reinterpret_borrow<py::object>(obj);
    local.tensor_ = true;
    return local;
  }

  if (acquire_cuda_array(obj, writable, what, local)) return local;
  if (acquire_dlpack(obj, writable, what, local)) return local;
  throw py::type_error(std::string(what) +
                       " must be a 1-D contiguous torch.Tensor, numpy.ndarray, memoryview or "
                       "bytearray (any object with the buffer protocol), or a GPU array with "
                       "__cuda_array_interface__ or DLPack, not " +
                       type_name(obj));
}

}  // namespace rdmabuf::python
