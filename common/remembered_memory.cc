#include "common/remembered_memory.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/strings.h"

namespace rdmabuf {
namespace {

struct Range {
  size_t size = 0;
  // The identity of the range while it is remembered. Caches hold it
  // weakly; ops in flight hold it strongly, which keeps nothing mapped.
  std::shared_ptr<const void> token;
};

// Remembered ranges by first byte; they never overlap. Guarded by `mu`.
struct Table {
  std::mutex mu;
  std::map<uintptr_t, Range> ranges;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: used until the process ends
  return *t;
}

std::atomic<uint64_t> g_forgotten{0};

}  // namespace

Status remember_memory(const void* addr, size_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  if (addr == nullptr || size == 0) {
    return InvalidArgument("remember_memory: the range is empty or null");
  }
  if (begin + size < begin) return InvalidArgument("remember_memory: the range wraps around");
  Table& t = table();
  std::lock_guard lock(t.mu);
  // The first range that ends after `begin` is the only one that can overlap
  // [begin, begin + size) from below; the one after it, from above.
  auto next = t.ranges.upper_bound(begin);
  if (next != t.ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > begin) next = prev;
  }
  if (next != t.ranges.end() && next->first < begin + size) {
    return InvalidArgument("remember_memory: " + format_bytes(size) + " at 0x" + hex_id(begin) +
                           " overlaps the remembered " + format_bytes(next->second.size) +
                           " at 0x" + hex_id(next->first) + " (forget_memory it first)");
  }
  t.ranges.emplace(begin, Range{size, std::make_shared<const char>(0)});
  return Status::Ok();
}

size_t forget_memory(const void* addr, size_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  const size_t length = size == 0 ? 1 : size;  // the range that holds `addr`
  const uintptr_t end = begin + length < begin ? UINTPTR_MAX : begin + length;
  Table& t = table();
  size_t forgotten = 0;
  {
    std::lock_guard lock(t.mu);
    auto it = t.ranges.upper_bound(begin);
    if (it != t.ranges.begin() && std::prev(it)->first + std::prev(it)->second.size > begin) {
      --it;
    }
    while (it != t.ranges.end() && it->first < end) {
      it = t.ranges.erase(it);
      ++forgotten;
    }
  }
  if (forgotten > 0) g_forgotten.fetch_add(1, std::memory_order_release);
  return forgotten;
}

std::optional<LocalMemory> remembered_memory_holding(const std::byte* addr, size_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  Table& t = table();
  std::lock_guard lock(t.mu);
  if (t.ranges.empty()) return std::nullopt;
  auto it = t.ranges.upper_bound(begin);
  if (it == t.ranges.begin()) return std::nullopt;
  --it;
  if (begin + size > it->first + it->second.size) return std::nullopt;
  return LocalMemory(reinterpret_cast<void*>(it->first), it->second.size, it->second.token);
}

uint64_t forgotten_generation() {
  return g_forgotten.load(std::memory_order_acquire);
}

}  // namespace rdmabuf
