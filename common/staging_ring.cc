#include "common/staging_ring.h"

#include "common/strings.h"

namespace rdmabuf {

StagingRing::~StagingRing() {
  if (!driver_) return;
  (void)wait_all();
  for (auto& [device, event] : spare_events_) {
    if (driver_->use_device(device).ok()) driver_->cuEventDestroy(event);
  }
  for (auto& [device, stream] : streams_) {
    if (driver_->use_device(device).ok()) driver_->cuStreamDestroy(stream);
  }
}

Status StagingRing::ensure_arena() {
  if (arena_.data()) return Status::Ok();
  RDMABUF_ASSIGN_OR_RETURN(driver_, cuda::Driver::get());
  RDMABUF_ASSIGN_OR_RETURN(arena_, cuda::allocate_pinned(capacity_));
  return Status::Ok();
}

Result<cuda::CUstream> StagingRing::stream_for(int device) {
  RDMABUF_RETURN_IF_ERROR(driver_->use_device(device));
  for (auto& [d, stream] : streams_) {
    if (d == device) return stream;
  }
  cuda::CUstream stream = nullptr;
  RDMABUF_RETURN_IF_ERROR(driver_->check(
      driver_->cuStreamCreate(&stream, cuda::CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  streams_.emplace_back(device, stream);
  return stream;
}

Status StagingRing::record(const std::byte* end, int device) {
  RDMABUF_ASSIGN_OR_RETURN(cuda::CUstream stream, stream_for(device));
  Status recorded = record_on(stream, end, device);
  if (!recorded.ok()) {
    // The copy just issued has no event to wait for: wait for its stream
    // instead, so that it does not outlive the caller's pin.
    (void)driver_->cuStreamSynchronize(stream);
  }
  return recorded;
}

Status StagingRing::record_on(cuda::CUstream stream, const std::byte* end, int device) {
  cuda::CUevent event = nullptr;
  for (size_t i = 0; i < spare_events_.size(); ++i) {
    if (spare_events_[i].first == device) {
      event = spare_events_[i].second;
      spare_events_.erase(spare_events_.begin() + static_cast<ptrdiff_t>(i));
      break;
    }
  }
  if (!event) {
    RDMABUF_RETURN_IF_ERROR(driver_->check(
        driver_->cuEventCreate(&event, cuda::CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  }
  Status recorded = driver_->check(driver_->cuEventRecord(event, stream), "cuEventRecord");
  if (!recorded.ok()) {
    spare_events_.emplace_back(device, event);
    return recorded;
  }
  pending_.push_back(Pending{end, event, device});
  return Status::Ok();
}

Result<const std::byte*> StagingRing::stage_from_gpu(const std::byte* from, size_t size,
                                                     int device) {
  RDMABUF_ASSIGN_OR_RETURN(std::byte * staged, take(size));
  RDMABUF_ASSIGN_OR_RETURN(cuda::CUstream stream, stream_for(device));
  RDMABUF_RETURN_IF_ERROR(driver_->check(
      driver_->cuMemcpyAsync(reinterpret_cast<cuda::CUdeviceptr>(staged),
                             reinterpret_cast<cuda::CUdeviceptr>(from), size, stream),
      "cuMemcpyAsync of " + format_bytes(size) + " from GPU " + std::to_string(device)));
  RDMABUF_RETURN_IF_ERROR(record(staged + size, device));
  return static_cast<const std::byte*>(staged);
}

Result<std::byte*> StagingRing::take(size_t size) {
  RDMABUF_RETURN_IF_ERROR(ensure_arena());
  if (size > room()) {
    return Internal("staging: " + format_bytes(size) + " asked of " + format_bytes(room()) +
                    " left");
  }
  std::byte* at = arena_.data() + used_;
  used_ += size;
  return at;
}

Status StagingRing::to_gpu(std::byte* to, const std::byte* staged, size_t size, int device) {
  RDMABUF_ASSIGN_OR_RETURN(cuda::CUstream stream, stream_for(device));
  RDMABUF_RETURN_IF_ERROR(driver_->check(
      driver_->cuMemcpyAsync(reinterpret_cast<cuda::CUdeviceptr>(to),
                             reinterpret_cast<cuda::CUdeviceptr>(staged), size, stream),
      "cuMemcpyAsync of " + format_bytes(size) + " to GPU " + std::to_string(device)));
  return record(staged + size, device);
}

Status StagingRing::wait_until(const std::byte* end) {
  Status result;
  while (!pending_.empty() && pending_.front().end <= end) {
    Pending p = pending_.front();
    pending_.pop_front();
    Status st = driver_->use_device(p.device);
    if (st.ok()) {
      st = driver_->check(driver_->cuEventSynchronize(p.event), "cuEventSynchronize");
    }
    spare_events_.emplace_back(p.device, p.event);
    if (result.ok()) result = st;
  }
  return result;
}

Status StagingRing::wait_all() {
  return wait_until(reinterpret_cast<const std::byte*>(UINTPTR_MAX));
}

}  // namespace rdmabuf
