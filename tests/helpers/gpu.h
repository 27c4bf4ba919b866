// GPU memory for tests. Machines without a GPU (CI) run the GPU tests on the
// test CUDA driver (tests/fake_cuda/): its "GPU memory" faults on any host
// access but the driver's own copies, so a code path that touches GPU
// memory with the CPU crashes the test. RDMABUF_TEST_REAL_GPU=1 runs the
// same tests on the real driver (scripts/gpu-check.sh).
#pragma once

#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "rdmabuf/gpu.h"
#include "rdmabuf/memory.h"
#include "tests/helpers/pattern.h"

namespace rdmabuf::testing {

inline bool real_gpu_requested() {
  const char* real = std::getenv("RDMABUF_TEST_REAL_GPU");
  return real && std::strcmp(real, "1") == 0;
}

// Makes this process (and the processes it starts) use the test driver,
// unless RDMABUF_TEST_REAL_GPU=1; then checks that GPU memory works. Call
// before anything in the process touches GPU memory: the driver is loaded
// once.
inline Status use_test_gpu() {
#ifdef RDMABUF_TEST_CUDA_DRIVER
  if (!real_gpu_requested()) ::setenv("RDMABUF_CUDA_DRIVER", RDMABUF_TEST_CUDA_DRIVER, 1);
#endif
  return gpu_support().status;
}

// The bytes of any memory, copied to host memory when it is on a GPU.
class HostBytes {
 public:
  explicit HostBytes(const LocalMemory& m) {
    if (!m.on_gpu()) {
      view_ = m.span();
      return;
    }
    copy_.resize(m.size());
    cuda::copy(copy_.data(), m.data(), m.size(), m.device()).ignore();
    view_ = copy_;
  }
  std::span<const std::byte> span() const { return view_; }
  const std::byte* data() const { return view_.data(); }
  size_t size() const { return view_.size(); }
  std::vector<std::byte> vector() const { return {view_.begin(), view_.end()}; }

 private:
  std::vector<std::byte> copy_;
  std::span<const std::byte> view_;
};

// `bytes` into `m` at `offset`, whatever its kind.
inline void put_bytes(const LocalMemory& m, size_t offset, std::span<const std::byte> bytes) {
  cuda::copy_into(m, offset, bytes.data(), bytes.size()).ignore();
}

// Whether allocate_of() gives host memory private to this process
// (LocalMemory::allocate_private), which the memory transport copies through the
// kernel, instead of LocalMemory::allocate's shared file, which it copies
// through a mapping. RDMABUF_TEST_PRIVATE_HOST=1 sets it for a process (a
// test peer); a test sets it for its own.
inline bool& private_host_memory() {
  static bool on = [] {
    const char* v = std::getenv("RDMABUF_TEST_PRIVATE_HOST");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

inline LocalMemory allocate_of(MemoryKind kind, size_t size) {
  auto m = kind == MemoryKind::kCuda ? LocalMemory::allocate_gpu(size)
           : private_host_memory()   ? LocalMemory::allocate_private(size)
                                     : LocalMemory::allocate(size);
  if (!m.ok()) return LocalMemory();
  if (kind == MemoryKind::kCuda) {  // zero-filled, as host memory is
    std::vector<std::byte> zeros(size);
    put_bytes(*m, 0, zeros);
  }
  return *m;
}

inline LocalMemory with_pattern_of(MemoryKind kind, size_t size, uint64_t seed,
                                   uint64_t start = 0) {
  LocalMemory m = allocate_of(kind, size);
  std::vector<std::byte> bytes(size);
  fill_pattern(bytes, seed, start);
  if (m.data()) put_bytes(m, 0, bytes);
  return m;
}

inline LocalMemory filled_of(MemoryKind kind, size_t size, std::byte value) {
  LocalMemory m = allocate_of(kind, size);
  std::vector<std::byte> bytes(size, value);
  if (m.data()) put_bytes(m, 0, bytes);
  return m;
}

}  // namespace rdmabuf::testing
