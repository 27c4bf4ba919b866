// The CUDA driver, loaded at run time as libibverbs is: rdmabuf builds,
// loads and runs where there is none, and GPU memory is then a clear
// kFailedPrecondition saying why. RDMABUF_CUDA_DRIVER names another library
// to load instead of libcuda.so.1 (the tests' driver, tests/fake_cuda/).
//
// On top of the entry points (common/cuda_api.h), what the library does with
// GPU memory: tell where a pointer lives, copy between any two kinds of
// memory, stage through pinned host memory, and share an allocation with
// another process (IPC). Every call makes the device's primary context
// current on the calling thread first. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/cuda_api.h"
#include "rdmabuf/gpu.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf::cuda {

using GpuInfo = rdmabuf::GpuInfo;

// Where a pointer's driver allocation lies (cuMemGetAddressRange), and its
// id, unique in the process for its life (CU_POINTER_ATTRIBUTE_BUFFER_ID):
// an allocation freed and made again at the same address has a new one.
struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;
  uint64_t id = 0;
};

// One copy of Driver::copy_all: `size` bytes from `from` to `to`.
struct CopyRange {
  void* to;
  const void* from;
  size_t size;
};

class Driver {
 public:
  // The driver, loaded and initialized once per process; or why there is
  // none here (kFailedPrecondition: no library, no GPU).
  static Result<const Driver*> get();
  // The driver if this process has loaded the library already (a process
  // with GPU memory has), without loading it otherwise: then
  // kFailedPrecondition.
  static Result<const Driver*> get_if_loaded();

  // The entry points, named as in cuda.h.
#define RDMABUF_CUDA_MEMBER(name, symbol, ret, params) name##_t* name = nullptr;
  RDMABUF_CUDA_ENTRY_POINTS(RDMABUF_CUDA_MEMBER)
#undef RDMABUF_CUDA_MEMBER

  // `result` as a Status: OK, or `code` with "what: CUDA_ERROR_X (its text)".
  Status check(CUresult result, const std::string& what,
               StatusCode code = StatusCode::kInternal) const;

  int version() const {
    return version_;
  }  // e.g. 13000 for 13.0
  const std::string& path() const {
    return path_;
  }
  const std::vector<GpuInfo>& gpus() const {
    return gpus_;
  }

  // Makes the primary context of GPU `ordinal` current on this thread
  // (retained once, for the life of the process).
  Status use_device(int ordinal) const;
  // Where `pointer` lives: kCuda with its GPU, or kHost (host memory, and
  // memory the driver does not know).
  Status kind_of(const void* pointer, MemoryKind& kind, int& ordinal) const;
  // The driver allocation containing [pointer, pointer + size).
  Result<Allocation> allocation_of(const void* pointer, size_t size) const;
  // Copies `size` bytes between host and GPU memory, either way or GPU to
  // GPU, with the context of GPU `device`, on a stream of this thread's
  // own, finished on return: no byte moves after it (a plain cuMemcpy
  // between GPU memories may return before).
  Status copy(void* to, const void* from, size_t size, int device) const;
  // Many such copies, queued on that stream together and waited for once
  // (all finished on return, also when one failed to queue).
  Status copy_all(std::span<const CopyRange> copies, int device) const;

  // This thread's own non-blocking stream on GPU `device` (created on
  // first use, destroyed when the thread exits). Makes the device current.
  Result<CUstream> thread_stream(int device) const;

 private:
  Driver() = default;
  static Result<std::unique_ptr<Driver>> load();

  void* library_ = nullptr;
  std::string path_;
  int version_ = 0;
  std::vector<GpuInfo> gpus_;
  mutable std::mutex contexts_mu_;
  mutable std::vector<CUcontext> contexts_;  // by ordinal, retained on first use
};

// Driver::copy and copy_all, through the driver loaded once per process (or
// why there is none).
Status copy(void* to, const void* from, size_t size, int device);
Status copy_all(std::span<const CopyRange> copies, int device);
// Copies `size` bytes of host memory at `from` into `to` at `offset`,
// through the driver when `to` is on a GPU.
Status copy_into(const LocalMemory& to, size_t offset, const void* from, size_t size);
// A copy of `memory` (on a GPU) in host memory, owned by its keepalive.
Result<LocalMemory> host_copy(const LocalMemory& memory);

// Pinned host memory (cuMemHostAlloc), for staging: DMA to and from it runs
// at the bus's speed and asynchronously. Owned by the keepalive.
Result<LocalMemory> allocate_pinned(size_t size);

// The driver library's name: RDMABUF_CUDA_DRIVER, else libcuda.so.1.
const char* library_name();

}  // namespace rdmabuf::cuda
