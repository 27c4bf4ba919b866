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
  {
    std::lock_guard lock(mu_);
    auto it = buffers_.find(key);
    if (it != buffers_.end()) return it->second;
  }
  // The slot's fields once: they are stable while the caller's pin holds
  // (the owner rewrites a slot only after retracting it), but copied so that
  // each is read once.
  const FileExport file = slot.file;
  const uint64_t size = slot.size;
  const std::string path = "/proc/" + std::to_string(owner_) + "/fd/" + std::to_string(file.fd);
  // Opened without blocking (a slot could name a FIFO) and checked to be the
  // regular file the slot names, holding all of the buffer.
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) {
    return NotFound("cannot open the owner's memory file " + path + ": " + errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != file.device ||
      st.st_ino != file.inode) {
    return NotFound(path + " is not the file the owner's shared state names");
  }
  if (file.offset + size < file.offset || static_cast<uint64_t>(st.st_size) < file.offset + size) {
    return NotFound("the owner's memory file " + path + " is shorter than its buffer");
  }
  const uint64_t first_page = file.offset / page_size() * page_size();
  const uint64_t length = file.offset - first_page + size;
  RDMABUF_ASSIGN_OR_RETURN(auto mapping,
                           map_pages(fd.get(), first_page, length, "the owner's memory file"));
  Address address{
      static_cast<std::byte*>(const_cast<void*>(mapping.get())) + (file.offset - first_page),
      std::move(mapping)};
  std::lock_guard lock(mu_);
  // Another thread may have mapped it meanwhile: keep the first.
  return buffers_.emplace(key, std::move(address)).first->second;
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
    it = live ? std::next(it) : buffers_.erase(it);
  }
}

void FileMappings::clear() {
  std::unordered_map<uint64_t, Address> dropped;
  {
    std::lock_guard lock(mu_);
    dropped.swap(buffers_);
  }
  // Unmapped here, outside the lock.
}

size_t FileMappings::mapped() const {
  std::lock_guard lock(mu_);
  return buffers_.size();
}

}  // namespace rdmabuf::memory
