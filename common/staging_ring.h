// Pinned host memory through which one thread moves bytes between GPU memory
// and something the CPU drives (a socket), with the GPU copies running while
// that thread does the rest: the copy of chunk k+1 overlaps the send (or the
// receive) of chunk k.
//
// An arena of pinned memory handed out front to back, and per GPU one CUDA
// stream on which its copies run in the order they were issued, so a read
// staged after a write of the same bytes sees the write. Once everything
// staged has been used (sent, or copied to the GPU and waited for), reset()
// starts the arena over. Not thread-safe: it belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "common/cuda_driver.h"
#include "rdmabuf/memory.h"
#include "rdmabuf/status.h"

namespace rdmabuf {

class StagingRing {
 public:
  static constexpr size_t kDefaultCapacity = 8 << 20;

  explicit StagingRing(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  size_t capacity() const { return capacity_; }
  // Bytes of the arena not yet handed out.
  size_t room() const { return capacity_ - used_; }

  // Starts copying `size` (at most room()) bytes of GPU `device` memory at
  // `from` into the arena and returns where they will be: readable once
  // wait_until() has passed their end.
  Result<const std::byte*> stage_from_gpu(const std::byte* from, size_t size, int device);
  // The next `size` (at most room()) bytes of the arena, for the caller to
  // fill; then to_gpu() takes them to the GPU.
  Result<std::byte*> take(size_t size);
  // Starts copying `size` bytes at `staged` (from take()) to GPU `device`
  // memory at `to`; done once wait_all() returns.
  Status to_gpu(std::byte* to, const std::byte* staged, size_t size, int device);

  // Waits for the copies that fill the arena up to `end` (an address
  // stage_from_gpu returned, plus its size).
  Status wait_until(const std::byte* end);
  // Waits for every copy issued.
  Status wait_all();
  // Starts the arena over. Call once nothing staged is needed any more
  // (after wait_all, and after sending what was staged).
  void reset() { used_ = 0; }

 private:
  struct Pending {
    const std::byte* end;  // the arena is filled up to here once it is done
    cuda::CUevent event;
    int device;
  };

  Status ensure_arena();
  Result<cuda::CUstream> stream_for(int device);
  // Tracks the copy just issued on `device`'s stream, whose staged bytes
  // end at `end`; on failure, waits for the stream before returning.
  Status record(const std::byte* end, int device);
  Status record_on(cuda::CUstream stream, const std::byte* end, int device);

  const size_t capacity_;
  const cuda::Driver* driver_ = nullptr;
  LocalMemory arena_;  // pinned; allocated on first use
  size_t used_ = 0;
  std::vector<std::pair<int, cuda::CUstream>> streams_;      // (device, stream)
  std::deque<Pending> pending_;                              // in the order issued
  std::vector<std::pair<int, cuda::CUevent>> spare_events_;  // (device, event)
};

}  // namespace rdmabuf
