#include "core/registry.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace rdmabuf {

struct Registry::Entry {
  uint64_t id = 0;
  Token token{};
  LocalMemory memory;
  std::atomic<int64_t> pins{0};
  std::atomic<bool> dead{false};
  std::mutex mu;  // guards aborts
  std::vector<PinAbort*> aborts;
};

void Registry::add(uint64_t id, const Token& token, LocalMemory memory) {
  auto entry = std::make_shared<Entry>();
  entry->id = id;
  entry->token = token;
  entry->memory = std::move(memory);
  std::unique_lock lock(mu_);
  entries_.emplace(id, std::move(entry));
}

Result<PinnedRegion> Registry::pin(uint64_t id, const Token& token, PinAbort* abort) {
  Entry* entry = nullptr;
  {
    std::shared_lock lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      return NotFound("buffer " + std::to_string(id) + " is not registered");
    }
    entry = it->second.get();
    // Pin before looking at `dead`: release() sets `dead` and then waits for
    // pins to drain, so one of the two always sees the other.
    entry->pins.fetch_add(1, std::memory_order_seq_cst);
  }
  if (entry->dead.load(std::memory_order_seq_cst)) {
    unpin(entry, nullptr);
    return NotFound("buffer " + std::to_string(id) + " is being released");
  }
  uint8_t diff = 0;  // constant time
  for (size_t i = 0; i < token.size(); ++i)
    diff |= static_cast<uint8_t>(token[i] ^ entry->token[i]);
  if (diff != 0) {
    unpin(entry, nullptr);
    return PermissionDenied("wrong token for buffer " + std::to_string(id));
  }
  if (abort) {
    std::lock_guard lock(entry->mu);
    entry->aborts.push_back(abort);
  }
  return PinnedRegion(entry->memory, entry, &Registry::unpin, abort);
}

void Registry::unpin(void* opaque, PinAbort* abort) {
  auto* entry = static_cast<Entry*>(opaque);
  if (abort) {
    std::lock_guard lock(entry->mu);
    auto it = std::find(entry->aborts.begin(), entry->aborts.end(), abort);
    if (it != entry->aborts.end()) entry->aborts.erase(it);
  }
  // The last touch of `entry`: release() may free it as soon as it sees 0.
  entry->pins.fetch_sub(1, std::memory_order_seq_cst);
}

Result<LocalMemory> Registry::release(uint64_t id) {
  std::shared_ptr<Entry> entry;
  {
    std::unique_lock lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      return NotFound("buffer " + std::to_string(id) + " is not registered (released already?)");
    }
    entry = std::move(it->second);
    entries_.erase(it);
  }
  entry->dead.store(true, std::memory_order_seq_cst);
  // Pins are held for one request's worth of I/O, so they drain quickly;
  // poll rather than have every unpin pay for a wake-up.
  auto start = Clock::now();
  auto next_abort = start + kReleaseGrace;
  while (entry->pins.load(std::memory_order_seq_cst) != 0) {
    auto now = Clock::now();
    auto waited = now - start;
    if (now >= next_abort) {
      // A peer holds the buffer mid-transfer and is not finishing (stalled
      // or slow): make its I/O fail, then wait for the pin to go. Repeated,
      // for holders that registered while we were aborting the others.
      std::lock_guard lock(entry->mu);
      for (PinAbort* abort : entry->aborts)
        abort->abort_pinned_io();
      next_abort = now + std::chrono::milliseconds(100);
    }
    if (waited < std::chrono::microseconds(200)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return std::move(entry->memory);
}

std::vector<uint64_t> Registry::ids() const {
  std::shared_lock lock(mu_);
  std::vector<uint64_t> out;
  out.reserve(entries_.size());
  for (const auto& [id, entry] : entries_)
    out.push_back(id);
  return out;
}

size_t Registry::size() const {
  std::shared_lock lock(mu_);
  return entries_.size();
}

}  // namespace rdmabuf
