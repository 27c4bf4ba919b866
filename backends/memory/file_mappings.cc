#include "backends/memory/file_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "common/log.h"
#include "common/socket.h"
#include "common/strings.h"

namespace rdmabuf::memory {
namespace {

uint64_t page_size() {
  static const auto size = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// The pages [offset, offset + length) of `fd` mapped read-write, shared.
Result<std::shared_ptr<const void>> map_pages(int fd, uint64_t offset, uint64_t length,
                                              const std::string& what) {
  void* at =
      ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (at == MAP_FAILED) return ResourceExhausted("mapping " + what + ": " + errno_text(errno));
  return std::shared_ptr<const void>(
      at, [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
}

}  // namespace

Result<FileMappings::Address> FileMappings::address_of(const Slot& slot, uint32_t index,
                                                       uint64_t generation) {
  const uint64_t key = slot_target(index, generation);
  // The slot's fields once: they are stable while the caller's pin holds
  // (the owner rewrites a slot only after retracting it), but copied so that
  // each is read once.
  const FileExport file = slot.file;
  const uint64_t size = slot.size;
  if (file.offset + size < file.offset) return NotFound("the owner's slot is corrupt");
  const uint64_t first_page = file.offset / page_size() * page_size();
  const Range range{file.device, file.inode, first_page, file.offset - first_page + size};
  auto in_buffer = [&](const Mapped& m) {
    return Address{m.address.base + (file.offset - first_page), m.address.mapping};
  };
  {
    std::lock_guard lock(mu_);
    auto it = buffers_.find(key);
    if (it != buffers_.end()) return in_buffer(it->second);
    auto refused = unmappable_.find(key);
    if (refused != unmappable_.end()) return refused->second;
    // The same pages registered again: take the mapping back.
    for (auto idle = idle_.begin(); idle != idle_.end(); ++idle) {
      if (idle->range == range) {
        idle_bytes_ -= pages_of(range);
        counters_.reused.fetch_add(1, std::memory_order_relaxed);
        Mapped& taken = buffers_.emplace(key, std::move(*idle)).first->second;
        idle_.erase(idle);
        return in_buffer(taken);
      }
    }
  }
  auto pages = map(range, file);
  std::lock_guard lock(mu_);
  if (!pages.ok()) {
    RDMABUF_LOG_INFO("memory: " + pages.status().message() +
                     "; copies of that buffer go through the kernel");
    unmappable_.emplace(key, pages.status());
    return pages.status();
  }
  // Another thread may have mapped it meanwhile: keep the first.
  auto [it, inserted] = buffers_.emplace(key, Mapped{range, std::move(*pages)});
  if (inserted) counters_.made.fetch_add(1, std::memory_order_relaxed);
  return in_buffer(it->second);
}

Result<FileMappings::Address> FileMappings::map(const Range& range, const FileExport& file) {
  const std::string path = "/proc/" + std::to_string(owner_) + "/fd/" + std::to_string(file.fd);
  // Opened without blocking (a slot could name a FIFO) and checked to be the
  // regular file the slot names, holding all of the buffer.
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) {
    return NotFound("cannot open the owner's memory file " + path + ": " + errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != range.device ||
      st.st_ino != range.inode) {
    return NotFound(path + " is not the file the owner's shared state names");
  }
  if (static_cast<uint64_t>(st.st_size) < range.first_page + range.length) {
    return NotFound("the owner's memory file " + path + " is shorter than its buffer");
  }
  RDMABUF_ASSIGN_OR_RETURN(
      auto mapping, map_pages(fd.get(), range.first_page, range.length, "the owner's memory file"));
  auto* base = static_cast<std::byte*>(const_cast<void*>(mapping.get()));
  return Address{base, std::move(mapping)};
}

uint64_t FileMappings::pages_of(const Range& range) {
  return (range.length + page_size() - 1) / page_size() * page_size();
}

void FileMappings::keep_idle(Mapped mapped) {
  idle_bytes_ += pages_of(mapped.range);
  idle_.push_back(std::move(mapped));
  while (idle_bytes_ > kIdleBytes || idle_.size() > kIdleMappings) {
    idle_bytes_ -= pages_of(idle_.front().range);
    idle_.pop_front();
  }
}

void FileMappings::sweep(const Segment& segment) {
  const uint64_t retractions = segment.header().retractions.load(std::memory_order_acquire);
  if (retractions == seen_retractions_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mu_);
  seen_retractions_.store(retractions, std::memory_order_relaxed);
  auto live = [&segment](uint64_t target) {
    return segment.slot(target_slot(target)).state.load(std::memory_order_acquire) ==
           (target_generation(target) << 1 | 1);
  };
  std::erase_if(unmappable_, [&](const auto& entry) { return !live(entry.first); });
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if (live(it->first)) {
      ++it;
      continue;
    }
    keep_idle(std::move(it->second));
    it = buffers_.erase(it);
  }
}

void FileMappings::clear() {
  std::unordered_map<uint64_t, Mapped> dropped;
  std::deque<Mapped> idle;
  {
    std::lock_guard lock(mu_);
    dropped.swap(buffers_);
    idle.swap(idle_);
    unmappable_.clear();
    idle_bytes_ = 0;
  }
  // Unmapped here, outside the lock.
}

}  // namespace rdmabuf::memory
