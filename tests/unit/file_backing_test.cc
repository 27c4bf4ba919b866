// find_file_backing: which host memory lies in a file another process can
// map, against real mappings of each kind.
#include "common/file_backing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "rdmabuf/memory.h"

namespace rdmabuf {
namespace {

constexpr size_t kSize = 64 << 10;

// A mapping that unmaps itself.
struct Mapping {
  void* at = MAP_FAILED;
  size_t size = 0;
  Mapping(size_t bytes, int prot, int flags, int fd)
      : at(::mmap(nullptr, bytes, prot, flags, fd, 0)), size(bytes) {}
  ~Mapping() {
    if (at != MAP_FAILED) ::munmap(at, size);
  }
  std::byte* bytes() const { return static_cast<std::byte*>(at); }
};

bool names_file(const FileBacking& backing, int fd) {
  struct stat mine {
  }, theirs{};
  return ::fstat(fd, &mine) == 0 && ::fstat(backing.number, &theirs) == 0 &&
         mine.st_dev == theirs.st_dev && mine.st_ino == theirs.st_ino &&
         backing.device == mine.st_dev && backing.inode == mine.st_ino;
}

TEST(FileBackingTest, AllocatedMemoryIsInASealedFileOfItsOwn) {
  auto memory = LocalMemory::allocate(kSize);
  ASSERT_TRUE(memory.ok());
  auto backing = find_file_backing(memory->data() + 4096, 8192);
  ASSERT_TRUE(backing.has_value());
  EXPECT_EQ(backing->offset, 4096u);
  EXPECT_TRUE(backing->sealed);
  EXPECT_FALSE(backing->fd.valid()) << "the allocation's own descriptor names it: no dup";
  EXPECT_GE(backing->number, 0);
  EXPECT_FALSE(find_file_backing(memory->data() + kSize - 8, 16).has_value())
      << "a range running past the allocation";
}

TEST(FileBackingTest, AForgottenAllocationIsNotFound) {
  std::byte* at = nullptr;
  {
    auto memory = LocalMemory::allocate(kSize);
    ASSERT_TRUE(memory.ok());
    at = memory->data();
  }
  // Whatever is mapped there now (maybe nothing), it is not the memfd.
  auto backing = find_file_backing(at, kSize);
  if (backing) {
    struct stat st {};
    ASSERT_EQ(::fstat(backing->number, &st), 0);
    EXPECT_FALSE(backing->sealed && st.st_size == static_cast<off_t>(kSize));
  }
}

TEST(FileBackingTest, ASharedMappingOfAMemfdIsFoundThroughTheOpenDescriptor) {
  int fd = ::memfd_create("file-backing-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 2 * kSize), 0);
  Mapping m(2 * kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd);
  ASSERT_NE(m.at, MAP_FAILED);
  auto backing = find_file_backing(m.bytes() + kSize, kSize);
  ASSERT_TRUE(backing.has_value());
  EXPECT_EQ(backing->offset, kSize);
  EXPECT_FALSE(backing->sealed);
  EXPECT_TRUE(names_file(*backing, fd));
  EXPECT_NE(backing->number, fd) << "a descriptor of its own, not the caller's";
  EXPECT_EQ(backing->number, backing->fd.get());
  ::close(fd);
  EXPECT_FALSE(find_file_backing(m.bytes(), 2 * kSize + 1).has_value()) << "past the mapping";
}

TEST(FileBackingTest, AFileInDevShmIsFoundAgainByItsPathOnceItsDescriptorIsClosed) {
  const std::string path = "/dev/shm/rdmabuf-file-backing-test-" + std::to_string(::getpid());
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) GTEST_SKIP() << "no /dev/shm here";
  ASSERT_EQ(::ftruncate(fd, kSize), 0);
  Mapping m(kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd);
  ASSERT_NE(m.at, MAP_FAILED);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  ::close(fd);
  auto backing = find_file_backing(m.bytes(), kSize);
  ::unlink(path.c_str());
  ASSERT_TRUE(backing.has_value());
  EXPECT_EQ(backing->inode, st.st_ino);
  EXPECT_EQ(backing->offset, 0u);
}

TEST(FileBackingTest, PrivateAnonymousAndReadOnlyMemoryIsNotInASharedFile) {
  Mapping anonymous(kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
  EXPECT_FALSE(find_file_backing(anonymous.bytes(), kSize).has_value());
  Mapping shared_anonymous(kSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1);
  EXPECT_FALSE(find_file_backing(shared_anonymous.bytes(), kSize).has_value())
      << "shared anonymous memory has no file another process can open";

  int fd = ::memfd_create("file-backing-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kSize), 0);
  Mapping private_file(kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd);
  EXPECT_FALSE(find_file_backing(private_file.bytes(), kSize).has_value())
      << "a private mapping's writes never reach the file";
  Mapping read_only(kSize, PROT_READ, MAP_SHARED, fd);
  EXPECT_FALSE(find_file_backing(read_only.bytes(), kSize).has_value());
  ::close(fd);

  std::string heap(kSize, 'x');
  EXPECT_FALSE(find_file_backing(heap.data(), heap.size()).has_value());
  EXPECT_FALSE(find_file_backing(nullptr, 0).has_value());
}

}  // namespace
}  // namespace rdmabuf
