// PyLocal: the memory of an ndarray, memoryview, bytearray, bytes or torch
// tensor, checked and held.
#include <algorithm>
#include <cstring>
#include <span>

#include "python/src/binding.h"
#include "python/src/strided.h"

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
    bytes_ = std::exchange(other.bytes_, 0);
    runs_ = std::move(other.runs_);
    other.runs_.clear();
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
  bytes_ = 0;
  runs_.clear();
}

void PyLocal::take_layout(void* first, std::span<const int64_t> shape,
                          std::span<const int64_t> strides, uint64_t itemsize, const char* what) {
  auto layout = strided_layout(shape, strides, itemsize, what);
  if (!layout.ok()) {
    reset();
    raise_status(layout.status());
  }
  memory_ = LocalMemory(static_cast<std::byte*>(first) + layout->low, layout->span);
  bytes_ = layout->bytes;
  // One run from the lowest byte to the highest is contiguous memory.
  if (layout->runs.size() == 1 && layout->runs[0].length == layout->span) return;
  runs_ = std::move(layout->runs);
}

Op PyLocal::op(OpKind kind, const RemoteBuffer& remote) const {
  if (runs_.empty()) return Op{kind, remote, memory_};
  // A read fills the runs in order with the whole remote range, as far as
  // it goes; a write sends every run, end to end, to the front of it.
  const uint64_t want = kind == OpKind::kReadIntoLocal ? remote.size() : bytes_;
  std::vector<OpRange> ranges;
  uint64_t at = 0;
  for (const OpRange& run : runs_) {
    if (at == want) break;
    const uint64_t length = std::min(run.length, want - at);
    ranges.push_back(OpRange{at, run.local_offset, length});
    at += length;
  }
  if (ranges.empty()) return Op{kind, remote, memory_};  // nothing to move
  return kind == OpKind::kReadIntoLocal ? Op::read_ranges(remote, memory_, std::move(ranges))
                                        : Op::write_ranges(remote, memory_, std::move(ranges));
}

void PyLocal::check_view(py::handle obj, bool writable, const char* what) {
  std::string why;
  if (writable && view_.readonly) {
    why = std::string(what) + " is read-only (" + type_name(obj) +
          "); rdmabuf writes into it, so it must be writable";
  } else if (format_has_objects(view_.format)) {
    why =
        std::string(what) + " holds Python objects (format '" + view_.format + "'), not plain data";
  }
  if (why.empty()) return;
  reset();
  raise_code(StatusCode::kInvalidArgument, why);
}

PyLocal PyLocal::acquire(py::handle obj, bool writable, const char* what, bool strided) {
  PyLocal local;
  PyObject* o = obj.ptr();
  if (strided && PyObject_CheckBuffer(o)) {
    if (PyObject_GetBuffer(o, &local.view_, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
    local.has_view_ = true;
    const Py_buffer& v = local.view_;
    local.check_view(obj, writable, what);
    if (PyBuffer_IsContiguous(&v, 'C')) {
      local.memory_ = LocalMemory(v.buf, static_cast<size_t>(v.len));
      local.bytes_ = local.memory_.size();
      return local;
    }
    const auto n = static_cast<size_t>(v.ndim);
    local.take_layout(v.buf, std::span<const int64_t>(reinterpret_cast<const int64_t*>(v.shape), n),
                      std::span<const int64_t>(reinterpret_cast<const int64_t*>(v.strides), n),
                      static_cast<uint64_t>(v.itemsize), what);
    return local;
  }
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
    local.check_view(obj, writable, what);
    local.memory_ = LocalMemory(v.buf, static_cast<size_t>(v.len));
    local.bytes_ = local.memory_.size();
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
    if (strided) return acquire_strided_tensor(obj, cuda, what);
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
    local.bytes_ = local.memory_.size();
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

PyLocal PyLocal::acquire_strided_tensor(py::handle obj, bool cuda, const char* what) {
  PyLocal local;
  const auto itemsize = obj.attr("element_size")().cast<uint64_t>();
  std::vector<int64_t> shape, strides;
  for (py::handle n : py::tuple(obj.attr("shape")))
    shape.push_back(n.cast<int64_t>());
  for (py::handle s : py::tuple(obj.attr("stride")()))
    strides.push_back(s.cast<int64_t>() * static_cast<int64_t>(itemsize));  // in bytes
  auto* first = reinterpret_cast<std::byte*>(obj.attr("data_ptr")().cast<uintptr_t>());
  local.take_layout(first, shape, strides, itemsize, what);
  if (cuda && local.memory_.size() > 0) {
    local.memory_ = torch_cuda_memory(obj, reinterpret_cast<uintptr_t>(local.memory_.data()),
                                      local.memory_.size(), what);
  }
  local.keep_ = py::reinterpret_borrow<py::object>(obj);
  local.tensor_ = true;
  return local;
}

}  // namespace rdmabuf::python
