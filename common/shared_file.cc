#include "common/shared_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rdmabuf {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

}  // namespace

Result<Fd> create_sealed_memfd(const char* name, size_t bytes, const std::string& what) {
  Fd fd(static_cast<int>(syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!fd.valid()) return ResourceExhausted("memfd_create: " + errno_text(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ResourceExhausted("sizing " + what + ": " + errno_text(errno));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    return ResourceExhausted("sealing " + what + ": " + errno_text(errno));
  }
  return fd;
}

bool sealed_at_size(int fd, size_t bytes) {
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes && seals >= 0 &&
         (seals & kSizeSeals) == kSizeSeals;
}

}  // namespace rdmabuf
