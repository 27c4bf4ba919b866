// Host memory that lies in a file another process on this host can map too
// (a memfd, a file in /dev/shm, a torch tensor after share_memory_()): the
// memory backend hands such a file to same-host readers, which map it once
// and copy with plain loads and stores instead of a system call per op.
//
// LocalMemory::allocate puts its memory in a memfd of its own and notes it
// here; other memory is looked up in /proc/self/maps.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/socket.h"

namespace rdmabuf {

// The file behind a range of this process's memory.
struct FileBacking {
  // The descriptor that names the file: one of LocalMemory::allocate's,
  // open while its memory lives; else `fd`'s, a dup made for this value.
  int number = -1;
  Fd fd;
  uint64_t offset = 0;  // of the range's first byte within the file
  uint64_t device = 0;  // the file's st_dev and st_ino, for a reader to check
  uint64_t inode = 0;   //   the file it opened is this one
  bool sealed = false;  // sealed at its size: it can never shrink under a reader
};

// Notes that [addr, addr + size) is a MAP_SHARED mapping, from offset 0, of
// the memfd `fd` (sealed at its size), until forget_allocation(addr). `fd`
// stays the caller's and must stay open until then. Thread-safe.
void note_allocation(const void* addr, size_t size, int fd);
void forget_allocation(const void* addr);

// The file behind [addr, addr + size) when all of it lies in a read-write,
// shared mapping of one regular file that this process holds open (or can
// open again by its path); nullopt for any other memory (anonymous,
// private, a file it cannot name). Costs a lookup for noted allocations, a
// read of /proc/self/maps and of the open files otherwise. Thread-safe.
std::optional<FileBacking> find_file_backing(const void* addr, size_t size);

}  // namespace rdmabuf
