#include "common/file_backing.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace rdmabuf {
namespace {

struct Allocation {
  size_t size;
  int fd;
};

// LocalMemory::allocate's memfds, by address. Guarded by allocations_mu().
std::mutex& allocations_mu() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, Allocation>& allocations() {
  static auto* table = new std::map<uintptr_t, Allocation>;  // never destroyed: used at exit
  return *table;
}

// One line of /proc/self/maps.
struct MapLine {
  uintptr_t start = 0, end = 0;
  bool readable = false, writable = false, shared = false;
  uint64_t offset = 0;
  uint64_t device = 0;
  uint64_t inode = 0;
  std::string path;
};

bool parse_map_line(const char* text, MapLine& line) {
  char perms[5] = {};
  unsigned major = 0, minor = 0;
  unsigned long long start = 0, end = 0, offset = 0, inode = 0;
  int path_at = 0;
  if (std::sscanf(text, "%llx-%llx %4s %llx %x:%x %llu %n", &start, &end, perms, &offset, &major,
                  &minor, &inode, &path_at) < 7) {
    return false;
  }
  line.start = static_cast<uintptr_t>(start);
  line.end = static_cast<uintptr_t>(end);
  line.readable = perms[0] == 'r';
  line.writable = perms[1] == 'w';
  line.shared = perms[3] == 's';
  line.offset = offset;
  line.device = makedev(major, minor);
  line.inode = inode;
  line.path = path_at > 0 ? std::string(text + path_at) : std::string();
  while (!line.path.empty() && line.path.back() == '\n')
    line.path.pop_back();
  return true;
}

bool usable(const MapLine& line) {
  return line.readable && line.writable && line.shared && line.inode != 0;
}

// The mapping that holds [addr, addr + size), merged across adjacent lines
// of the same file at consecutive offsets: its first line, with `end`
// extended. False when the range is not all in one such mapping.
bool find_mapping(uintptr_t addr, size_t size, MapLine& found) {
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (!maps) return false;
  char* text = nullptr;
  size_t capacity = 0;
  bool have = false;
  MapLine line;
  while (::getline(&text, &capacity, maps) > 0) {
    if (!parse_map_line(text, line)) continue;
    if (!have) {
      if (line.start <= addr && addr < line.end) {
        if (!usable(line)) break;
        found = line;
        have = true;
      }
    } else if (found.end < addr + size) {
      const bool continues = line.start == found.end && usable(line) &&
                             line.device == found.device && line.inode == found.inode &&
                             line.offset == found.offset + (found.end - found.start);
      if (!continues) break;
      found.end = line.end;
    }
    if (have && found.end >= addr + size) break;
  }
  std::free(text);
  std::fclose(maps);
  return have && found.end >= addr + size;
}

bool same_file(int fd, uint64_t device, uint64_t inode) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == device && st.st_ino == inode;
}

// A descriptor of the file (device, inode): a dup of one this process
// holds, else the file opened again by `path`; invalid when neither works.
Fd open_file(uint64_t device, uint64_t inode, const std::string& path) {
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(dir);
    while (const dirent* entry = ::readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || fd == own) continue;
      if (same_file(static_cast<int>(fd), device, inode)) {
        ::closedir(dir);
        return Fd(::fcntl(static_cast<int>(fd), F_DUPFD_CLOEXEC, 0));
      }
    }
    ::closedir(dir);
  }
  constexpr std::string_view kDeleted = " (deleted)";
  if (path.empty() || path[0] != '/' || path.ends_with(kDeleted)) return Fd();
  // Only the regular file the mapping names is opened: never a device
  // (/dev/nvidiactl behind CUDA's pinned memory, say), whose open has
  // effects of its own.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != device ||
      st.st_ino != inode) {
    return Fd();
  }
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.valid() && !same_file(fd.get(), device, inode)) return Fd();
  return fd;
}

bool sealed_against_shrinking(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
}

}  // namespace

void note_allocation(const void* addr, size_t size, int fd) {
  std::lock_guard lock(allocations_mu());
  allocations()[reinterpret_cast<uintptr_t>(addr)] = Allocation{size, fd};
}

void forget_allocation(const void* addr) {
  std::lock_guard lock(allocations_mu());
  allocations().erase(reinterpret_cast<uintptr_t>(addr));
}

std::optional<FileBacking> find_file_backing(const void* addr, size_t size) {
  const auto at = reinterpret_cast<uintptr_t>(addr);
  if (size == 0 || at + size < at) return std::nullopt;
  {
    std::lock_guard lock(allocations_mu());
    auto& table = allocations();
    auto it = table.upper_bound(at);
    if (it != table.begin()) {
      --it;
      if (at - it->first + size <= it->second.size) {
        FileBacking backing;
        backing.number = it->second.fd;  // open while the allocation lives: no dup
        struct stat st {};
        if (::fstat(backing.number, &st) != 0) return std::nullopt;
        backing.offset = at - it->first;
        backing.device = st.st_dev;
        backing.inode = st.st_ino;
        backing.sealed = true;
        return backing;
      }
    }
  }
  MapLine mapping;
  if (!find_mapping(at, size, mapping)) return std::nullopt;
  FileBacking backing;
  backing.fd = open_file(mapping.device, mapping.inode, mapping.path);
  if (!backing.fd.valid()) return std::nullopt;
  backing.number = backing.fd.get();
  backing.offset = mapping.offset + (at - mapping.start);
  backing.device = mapping.device;
  backing.inode = mapping.inode;
  backing.sealed = sealed_against_shrinking(backing.number);
  return backing;
}

}  // namespace rdmabuf
