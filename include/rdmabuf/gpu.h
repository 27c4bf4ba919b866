// Whether this process can use GPU memory: the CUDA driver rdmabuf loaded
// at run time (libcuda.so.1, or RDMABUF_CUDA_DRIVER) and the GPUs it sees.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

struct GpuInfo {
  int ordinal = 0;         // CUDA's numbering in this process
  std::string name;        // "NVIDIA H200"
  std::string pci_bus_id;  // "0000:19:00.0"
  uint64_t memory = 0;     // bytes
};

struct GpuSupport {
  // OK, or why GPU memory cannot be used here (kFailedPrecondition: no
  // driver library, no GPU, a driver too old).
  Status status;
  std::string driver;      // the library loaded (or tried)
  int driver_version = 0;  // e.g. 13000 for CUDA 13.0
  std::vector<GpuInfo> gpus;
};

// Loads the driver on first call (cuInit; this may take a while on a
// machine with GPUs) and says what it found.
GpuSupport gpu_support();

// Waits until the work queued so far on CUDA stream `stream` of GPU `device`
// has finished: a CUstream, or 1 and 2 for the legacy and the per-thread
// default streams (as __cuda_array_interface__ and DLPack number them).
// rdmabuf copies GPU memory on streams of its own, so memory that kernels
// on another stream are still writing must be waited for first; the Python
// package does this for the tensors it is given (docs/gpu.md).
Status synchronize_stream(int device, uintptr_t stream);

// Copies the bytes of `from` into the front of `to`, host or GPU memory
// either way (through the driver when either is on a GPU), finished on
// return. kInvalidArgument when `to` is smaller than `from`.
Status copy_memory(const LocalMemory& to, const LocalMemory& from);

}  // namespace rdmabuf
