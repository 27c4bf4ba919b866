#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/strings.h"

namespace rdmabuf::cuda {
namespace {

std::string hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(v));
  return buf;
}

}  // namespace

const char* library_name() {
  const char* named = std::getenv("RDMABUF_CUDA_DRIVER");
  return named && *named ? named : "libcuda.so.1";
}

namespace {

// The streams a thread made (Driver::thread_stream), destroyed at its exit.
struct ThreadStreams {
  const Driver* driver = nullptr;
  std::vector<std::pair<int, CUstream>> streams;  // (device, stream)
  ~ThreadStreams() {
    for (auto& [device, stream] : streams) {
      if (driver->use_device(device).ok()) driver->cuStreamDestroy(stream);
    }
  }
};

}  // namespace

Result<std::unique_ptr<Driver>> Driver::load() {
  std::unique_ptr<Driver> d(new Driver);
  d->path_ = library_name();
  d->library_ = ::dlopen(d->path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!d->library_) {
    const char* why = ::dlerror();
    return FailedPrecondition("no CUDA driver: " + d->path_ + " cannot be loaded (" +
                              (why ? why : "unknown error") + ")");
  }
#define RDMABUF_CUDA_LOAD(name, symbol, ret, params)                          \
  d->name = reinterpret_cast<name##_t*>(::dlsym(d->library_, #symbol));       \
  if (!d->name) {                                                             \
    return FailedPrecondition("the CUDA driver " + d->path_ +                 \
                              " has no " #symbol " (older than CUDA 11.7?)"); \
  }
  RDMABUF_CUDA_ENTRY_POINTS(RDMABUF_CUDA_LOAD)
#undef RDMABUF_CUDA_LOAD
  // From here the library stays loaded for the life of the process: the
  // driver's own threads and handlers may refer to it.
  const CUresult init = d->cuInit(0);
  if (init != CUDA_SUCCESS) {
    return d->check(init, "cuInit", StatusCode::kFailedPrecondition)
        .with_context("no usable GPU (" + d->path_ + ")");
  }
  RDMABUF_RETURN_IF_ERROR(d->check(d->cuDriverGetVersion(&d->version_), "cuDriverGetVersion"));
  int count = 0;
  RDMABUF_RETURN_IF_ERROR(
      d->check(d->cuDeviceGetCount(&count), "cuDeviceGetCount", StatusCode::kFailedPrecondition));
  if (count <= 0) return FailedPrecondition("the CUDA driver " + d->path_ + " sees no GPU");
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    RDMABUF_RETURN_IF_ERROR(d->check(d->cuDeviceGet(&device, i), "cuDeviceGet"));
    GpuInfo gpu;
    gpu.ordinal = i;
    char name[256] = {};
    if (d->cuDeviceGetName(name, sizeof name - 1, device) == CUDA_SUCCESS) gpu.name = name;
    char bus[64] = {};
    if (d->cuDeviceGetPCIBusId(bus, sizeof bus - 1, device) == CUDA_SUCCESS) gpu.pci_bus_id = bus;
    size_t bytes = 0;
    if (d->cuDeviceTotalMem(&bytes, device) == CUDA_SUCCESS) gpu.memory = bytes;
    d->gpus_.push_back(std::move(gpu));
  }
  d->contexts_.assign(d->gpus_.size(), nullptr);
  return d;
}

Result<const Driver*> Driver::get() {
  // Loaded once; a failure is remembered (its reason too).
  static const Result<const Driver*> loaded = []() -> Result<const Driver*> {
    auto d = load();
    if (!d.ok()) return d.status();
    return d->release();  // for the life of the process
  }();
  return loaded;
}

Result<const Driver*> Driver::get_if_loaded() {
  static std::atomic<bool> seen{false};  // set once the library was resident
  if (!seen.load(std::memory_order_acquire)) {
    void* resident = ::dlopen(library_name(), RTLD_NOW | RTLD_NOLOAD);
    if (!resident) return FailedPrecondition("the CUDA driver is not loaded in this process");
    ::dlclose(resident);
    seen.store(true, std::memory_order_release);
  }
  return get();
}

}  // namespace rdmabuf::cuda

namespace rdmabuf {

GpuSupport gpu_support() {
  GpuSupport support;
  auto driver = cuda::Driver::get();
  support.status = driver.status();
  support.driver = cuda::library_name();
  if (driver.ok()) {
    support.driver = (*driver)->path();
    support.driver_version = (*driver)->version();
    support.gpus = (*driver)->gpus();
  }
  return support;
}

Status synchronize_stream(int device, uintptr_t stream) {
  RDMABUF_ASSIGN_OR_RETURN(const cuda::Driver* driver, cuda::Driver::get());
  RDMABUF_RETURN_IF_ERROR(driver->use_device(device));
  return driver->check(driver->cuStreamSynchronize(reinterpret_cast<cuda::CUstream>(stream)),
                       "cuStreamSynchronize");
}

Status copy_memory(const LocalMemory& to, const LocalMemory& from) {
  if (to.size() < from.size()) {
    return InvalidArgument("copy of " + format_bytes(from.size()) + " into " +
                           format_bytes(to.size()));
  }
  if (!to.on_gpu() && !from.on_gpu()) {
    if (from.size() > 0) std::memcpy(to.data(), from.data(), from.size());
    return Status::Ok();
  }
  return cuda::copy(to.data(), from.data(), from.size(), to.on_gpu() ? to.device() : from.device());
}

}  // namespace rdmabuf

namespace rdmabuf::cuda {

Status Driver::check(CUresult result, const std::string& what, StatusCode code) const {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(result, &name);
  if (cuGetErrorString) cuGetErrorString(result, &text);
  return Status(code, what + ": " + (name ? name : "CUDA error " + std::to_string(result)) +
                          (text ? std::string(" (") + text + ")" : std::string()));
}

Status Driver::use_device(int ordinal) const {
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= gpus_.size()) {
    return InvalidArgument("there is no GPU " + std::to_string(ordinal) + " (" +
                           std::to_string(gpus_.size()) + " here)");
  }
  CUcontext context;
  {
    std::lock_guard lock(contexts_mu_);
    context = contexts_[ordinal];
    if (!context) {
      CUdevice device = 0;
      RDMABUF_RETURN_IF_ERROR(check(cuDeviceGet(&device, ordinal), "cuDeviceGet"));
      RDMABUF_RETURN_IF_ERROR(
          check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain"));
      contexts_[ordinal] = context;
    }
  }
  return check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
}

Status Driver::kind_of(const void* pointer, MemoryKind& kind, int& ordinal) const {
  unsigned type = 0;
  const CUresult r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           reinterpret_cast<CUdeviceptr>(pointer));
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_INITIALIZED ||
      r == CUDA_ERROR_INVALID_CONTEXT || (r == CUDA_SUCCESS && type != CU_MEMORYTYPE_DEVICE)) {
    // Memory the driver does not know (or host memory it registered):
    // host memory to rdmabuf.
    kind = MemoryKind::kHost;
    ordinal = 0;
    return Status::Ok();
  }
  RDMABUF_RETURN_IF_ERROR(
      check(r, "cuPointerGetAttribute(" + hex(reinterpret_cast<uintptr_t>(pointer)) + ")"));
  int device = 0;
  RDMABUF_RETURN_IF_ERROR(check(cuPointerGetAttribute(&device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                      reinterpret_cast<CUdeviceptr>(pointer)),
                                "cuPointerGetAttribute(device ordinal)"));
  kind = MemoryKind::kCuda;
  ordinal = device;
  return Status::Ok();
}

Result<Allocation> Driver::allocation_of(const void* pointer, size_t size) const {
  CUdeviceptr base = 0;
  size_t bytes = 0;
  RDMABUF_RETURN_IF_ERROR(
      check(cuMemGetAddressRange(&base, &bytes, reinterpret_cast<CUdeviceptr>(pointer)),
            "cuMemGetAddressRange(" + hex(reinterpret_cast<uintptr_t>(pointer)) + ")",
            StatusCode::kInvalidArgument));
  const auto at = reinterpret_cast<uintptr_t>(pointer);
  if (at + size > base + bytes) {
    return InvalidArgument("GPU memory " + hex(at) + "+" + std::to_string(size) +
                           " runs past its allocation (" + hex(base) + "+" + std::to_string(bytes) +
                           ")");
  }
  unsigned long long id = 0;  // NOLINT(google-runtime-int): as cuda.h
  RDMABUF_RETURN_IF_ERROR(check(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base),
                                "cuPointerGetAttribute(buffer id)"));
  return Allocation{static_cast<uintptr_t>(base), bytes, id};
}

Result<CUstream> Driver::thread_stream(int device) const {
  RDMABUF_RETURN_IF_ERROR(use_device(device));
  thread_local ThreadStreams mine;
  mine.driver = this;
  for (auto& [d, stream] : mine.streams) {
    if (d == device) return stream;
  }
  CUstream stream = nullptr;
  RDMABUF_RETURN_IF_ERROR(check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
                                StatusCode::kInternal));
  mine.streams.emplace_back(device, stream);
  return stream;
}

Status Driver::copy(void* to, const void* from, size_t size, int device) const {
  if (size == 0) return Status::Ok();
  // Unified addressing: one copy moves bytes between any two of host and
  // GPU memory, with the context of the GPU involved (either's).
  RDMABUF_ASSIGN_OR_RETURN(CUstream stream, thread_stream(device));
  RDMABUF_RETURN_IF_ERROR(check(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(to),
                                              reinterpret_cast<CUdeviceptr>(from), size, stream),
                                "cuMemcpyAsync of " + format_bytes(size)));
  return check(cuStreamSynchronize(stream), "cuStreamSynchronize after a copy");
}

Status Driver::copy_all(std::span<const CopyRange> copies, int device) const {
  if (copies.empty()) return Status::Ok();
  RDMABUF_ASSIGN_OR_RETURN(CUstream stream, thread_stream(device));
  Status queued;
  for (const CopyRange& c : copies) {
    if (c.size == 0) continue;
    queued = check(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(c.to),
                                 reinterpret_cast<CUdeviceptr>(c.from), c.size, stream),
                   "cuMemcpyAsync of " + format_bytes(c.size));
    if (!queued.ok()) break;
  }
  // Those queued finish before this returns, whatever happened to the rest.
  Status done = check(cuStreamSynchronize(stream), "cuStreamSynchronize after copies");
  return queued.ok() ? done : queued;
}

Status copy(void* to, const void* from, size_t size, int device) {
  RDMABUF_ASSIGN_OR_RETURN(const Driver* driver, Driver::get());
  return driver->copy(to, from, size, device);
}

Status copy_all(std::span<const CopyRange> copies, int device) {
  RDMABUF_ASSIGN_OR_RETURN(const Driver* driver, Driver::get());
  return driver->copy_all(copies, device);
}

Status copy_into(const LocalMemory& to, size_t offset, const void* from, size_t size) {
  if (!to.on_gpu()) {
    std::memcpy(to.data() + offset, from, size);
    return Status::Ok();
  }
  return copy(to.data() + offset, from, size, to.device());
}

Result<LocalMemory> host_copy(const LocalMemory& memory) {
  std::shared_ptr<std::byte[]> bytes(new std::byte[std::max<size_t>(memory.size(), 1)]);
  RDMABUF_RETURN_IF_ERROR(copy(bytes.get(), memory.data(), memory.size(), memory.device()));
  std::byte* at = bytes.get();
  return LocalMemory(at, memory.size(), std::shared_ptr<const void>(std::move(bytes), at));
}

Result<LocalMemory> allocate_pinned(size_t size) {
  if (size == 0) return InvalidArgument("cannot allocate 0 bytes");
  RDMABUF_ASSIGN_OR_RETURN(const Driver* driver, Driver::get());
  RDMABUF_RETURN_IF_ERROR(driver->use_device(0));
  void* p = nullptr;
  RDMABUF_RETURN_IF_ERROR(driver->check(driver->cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE),
                                        "cuMemHostAlloc of " + format_bytes(size),
                                        StatusCode::kResourceExhausted));
  std::shared_ptr<const void> owner(p, [driver](const void* q) {
    if (driver->use_device(0).ok()) driver->cuMemFreeHost(const_cast<void*>(q));
  });
  return LocalMemory(p, size, std::move(owner));
}

}  // namespace rdmabuf::cuda
