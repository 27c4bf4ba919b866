// The memory backend's shared state (backends/memory/shared_state.h): the
// file readers map must not change size under anyone's mapping.
#include "backends/memory/shared_state.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

namespace rdmabuf::memory {
namespace {

// A reader opens the owner's segment read-write through /proc; neither it
// nor the owner can shrink or grow it (a load past the end would be SIGBUS).
TEST(SharedStateTest, TheSegmentCannotChangeSize) {
  auto segment = Segment::create(42);
  ASSERT_TRUE(segment.ok()) << segment.status().to_string();
  const std::string path = "/proc/self/fd/" + std::to_string((*segment)->fd());
  Fd reader(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(reader.valid());
  EXPECT_NE(::ftruncate(reader.get(), 0), 0) << "a reader shrank the owner's segment";
  EXPECT_NE(::ftruncate((*segment)->fd(), 0), 0) << "the owner shrank its segment";
  EXPECT_NE(::ftruncate(reader.get(), static_cast<off_t>(2 * segment_bytes())), 0);
  auto opened = Segment::open(getpid(), (*segment)->fd(), 42);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
}

// A file of the right size that is not sealed is not a segment to map.
TEST(SharedStateTest, AnUnsealedFileIsRefused) {
  Fd file(static_cast<int>(::syscall(SYS_memfd_create, "rdmabuf-test-unsealed", MFD_CLOEXEC)));
  ASSERT_TRUE(file.valid());
  ASSERT_EQ(::ftruncate(file.get(), static_cast<off_t>(segment_bytes())), 0);
  auto opened = Segment::open(getpid(), file.get(), 42);
  EXPECT_EQ(opened.status().code(), StatusCode::kNotFound) << opened.status().to_string();
  EXPECT_NE(opened.status().message().find("not sealed"), std::string::npos);
}

}  // namespace
}  // namespace rdmabuf::memory
