#include "backends/memory/file_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

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
    // The same pages registered again: take the mapping back.
    for (auto idle = idle_.begin(); idle != idle_.end(); ++idle) {
      if (idle->range == range) {
        idle_bytes_ -= range.length;
        counters_.reused.fetch_add(1, std::memory_order_relaxed);
        Mapped& taken = buffers_.emplace(key, std::move(*idle)).first->second;
        idle_.erase(idle);
        return in_buffer(taken);
      }
    }
  }
  RDMABUF_ASSIGN_OR_RETURN(Address pages, map(range, file));
  std::lock_guard lock(mu_);
  // Another thread may have mapped it meanwhile: keep the first.
  return in_buffer(buffers_.emplace(key, Mapped{range, std::move(pages)}).first->second);
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
  counters_.made.fetch_add(1, std::memory_order_relaxed);
  auto* base = static_cast<std::byte*>(const_cast<void*>(mapping.get()));
  return Address{base, std::move(mapping)};
}

void FileMappings::keep_idle(Mapped mapped) {
  idle_bytes_ += mapped.range.length;
  idle_.push_back(std::move(mapped));
  while (idle_bytes_ > kIdleBytes) {
    idle_bytes_ -= idle_.front().range.length;
    idle_.pop_front();
  }
}

void FileMappings::sweep(const Segment& segment) {
  const uint64_t retractions = segment.header().retractions.load(std::memory_order_acquire);
  if (retractions == seen_retractions_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mu_);
  seen_retractions_.store(retractions, std::memory_order_relaxed);
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    const uint64_t generation = target_generation(it->first);
    const bool live = segment.slot(target_slot(it->first)).state.load(std::memory_order_acquire) ==
                      (generation << 1 | 1);
    if (live) {
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
    idle_bytes_ = 0;
  }
  // Unmapped here, outside the lock.
}

size_t FileMappings::mapped() const {
  std::lock_guard lock(mu_);
  return buffers_.size();
}

}  // namespace rdmabuf::memory
