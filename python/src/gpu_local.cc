// GPU memory from Python objects: CUDA torch tensors, and any array that
// offers __cuda_array_interface__ (CuPy, Numba, PyTorch, JAX) or DLPack.
// Each must be 1-D and contiguous, as host objects must; the work queued on
// its stream is waited for before the memory is used (binding.h).
#include <cstring>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

// DLPack's ABI (dlpack.h, stable since v0.2): what a "dltensor" capsule holds.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;
constexpr int32_t kDLCUDAManaged = 13;
// The stream a consumer names for the legacy default stream (DLPack and
// __cuda_array_interface__ number it 1).
constexpr uintptr_t kLegacyStream = 1;

// `pointer` as LocalMemory of the kind the driver says, waiting first for
// `stream` (0: nothing to wait for) with the GIL released.
LocalMemory gpu_memory(uintptr_t pointer, uint64_t nbytes, uintptr_t stream, int device_hint,
                       const char* what, bool claims_gpu = true) {
  auto memory = LocalMemory::recognize(reinterpret_cast<void*>(pointer), nbytes);
  if (!memory.ok()) raise_status(memory.status().with_context(what));
  if (claims_gpu && nbytes > 0 && !memory->on_gpu()) {
    // The object says it is on a GPU; the driver knows it as host memory
    // (managed memory) only when there is one.
    Status gpu = gpu_support().status;
    if (!gpu.ok()) raise_status(gpu.with_context(std::string(what) + " is GPU memory"));
  }
  if (stream != 0) {
    const int device = memory->on_gpu() ? memory->device() : device_hint;
    Status synced;
    {
      py::gil_scoped_release unlocked;
      synced = synchronize_stream(device, stream);
    }
    if (!synced.ok()) raise_status(synced.with_context(std::string(what) + ": its stream"));
  }
  return *memory;
}

[[noreturn]] void invalid(const char* what, const std::string& why) {
  raise_code(StatusCode::kInvalidArgument, std::string(what) + " " + why);
}

}  // namespace

LocalMemory torch_cuda_memory(py::handle tensor, uintptr_t data, uint64_t nbytes,
                              const char* what) {
  // The tensor's current stream: where the kernels that wrote it were queued.
  py::object torch_cuda = py::module_::import("torch.cuda");
  py::object stream = torch_cuda.attr("current_stream")(tensor.attr("device"));
  stream.attr("synchronize")();  // releases the GIL itself
  auto memory = LocalMemory::recognize(reinterpret_cast<void*>(data), nbytes);
  if (!memory.ok()) raise_status(memory.status().with_context(what));
  if (nbytes > 0 && !memory->on_gpu()) {
    raise_code(StatusCode::kFailedPrecondition,
               std::string(what) +
                   " is a CUDA tensor, but rdmabuf's CUDA driver does not know "
                   "its memory (" +
                   gpu_support().status.to_string() + ")");
  }
  return *memory;
}

void release_dlpack(void* managed) {
  auto* tensor = static_cast<DLManagedTensor*>(managed);
  if (tensor && tensor->deleter) tensor->deleter(tensor);
}

bool PyLocal::acquire_cuda_array(py::handle obj, bool writable, const char* what, PyLocal& local) {
  if (!py::hasattr(obj, "__cuda_array_interface__")) return false;
  py::dict cai = obj.attr("__cuda_array_interface__");
  py::tuple data = cai["data"];
  py::tuple shape = cai["shape"];
  const std::string typestr = py::str(cai["typestr"]);
  if (shape.size() != 1) {
    invalid(what, "must be 1-D, not " + std::to_string(shape.size()) + "-D");
  }
  if (typestr.size() < 3 || typestr[1] == 'O') {
    invalid(what, "has elements of type '" + typestr + "', not plain data");
  }
  const uint64_t itemsize = std::stoull(typestr.substr(2));
  const auto count = shape[0].cast<uint64_t>();
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    py::tuple strides = cai["strides"];
    if (count > 1 && strides[0].cast<int64_t>() != static_cast<int64_t>(itemsize)) {
      invalid(what, "must be contiguous");
    }
  }
  if (writable && data[1].cast<bool>()) {
    invalid(what, "is read-only; rdmabuf writes into it, so it must be writable");
  }
  uintptr_t stream = 0;  // none given: nothing to wait for (the interface's rule)
  if (cai.contains("stream") && !cai["stream"].is_none()) {
    stream = cai["stream"].cast<uintptr_t>();
    if (stream == 0) invalid(what, "names stream 0, which __cuda_array_interface__ forbids");
  }
  local.memory_ = gpu_memory(data[0].cast<uintptr_t>(), count * itemsize, stream, 0, what);
  local.bytes_ = local.memory_.size();
  local.keep_ = py::reinterpret_borrow<py::object>(obj);
  return true;
}

bool PyLocal::acquire_dlpack(py::handle obj, bool writable, const char* what, PyLocal& local) {
  if (!py::hasattr(obj, "__dlpack__") || !py::hasattr(obj, "__dlpack_device__")) return false;
  py::tuple device = obj.attr("__dlpack_device__")();
  const auto type = device[0].cast<int32_t>();
  const auto id = device[1].cast<int32_t>();
  const bool on_gpu = type == kDLCUDA || type == kDLCUDAManaged;
  if (!on_gpu && type != kDLCPU && type != kDLCUDAHost) {
    raise_code(StatusCode::kUnimplemented, std::string(what) + " is on DLPack device type " +
                                               std::to_string(type) +
                                               "; rdmabuf takes host memory and CUDA GPUs");
  }
  // On a GPU, the producer orders its work before the legacy default stream,
  // which is then waited for.
  py::object capsule =
      on_gpu ? obj.attr("__dlpack__")(py::arg("stream") = kLegacyStream) : obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!managed) {
    PyErr_Clear();
    invalid(what, "gave a DLPack capsule that is not an unused \"dltensor\"");
  }
  // Ours now: the deleter runs when the memory is let go.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  local.dlpack_ = managed;
  local.keep_ = py::reinterpret_borrow<py::object>(obj);
  const DLTensor& t = managed->dl_tensor;
  if (t.ndim != 1) invalid(what, "must be 1-D, not " + std::to_string(t.ndim) + "-D");
  if (t.dtype.bits % 8 != 0 || t.dtype.lanes == 0) invalid(what, "has elements of under a byte");
  if (t.strides && t.shape[0] > 1 && t.strides[0] != 1) invalid(what, "must be contiguous");
  if (t.shape[0] < 0) invalid(what, "has a negative length");
  (void)writable;  // DLPack says nothing of read-only memory (before its 1.0)
  const uint64_t nbytes = static_cast<uint64_t>(t.shape[0]) * (t.dtype.bits / 8) * t.dtype.lanes;
  const uintptr_t pointer = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  local.memory_ = gpu_memory(pointer, nbytes, on_gpu ? kLegacyStream : 0, id, what, on_gpu);
  local.bytes_ = local.memory_.size();
  return true;
}

}  // namespace rdmabuf::python
