// copy_received (common/copy.h): sizes on both sides of 1 KiB, where it
// switches from memcpy to the inline string move (where the CPU's is fast;
// both ways are tried), at several offsets of source and destination: it
// copies exactly the bytes asked for and touches none around them. The
// same for copy_short at every size up to past its inline copies.
#include "common/copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace rdmabuf {
namespace {

constexpr uint8_t kUntouched = 0xEE;

// `to` holds kUntouched but for `size` bytes from `begin`, which are
// those of `from`.
void expect_copied_exactly(const std::vector<uint8_t>& to, size_t begin, const uint8_t* from,
                           size_t size) {
  for (size_t i = 0; i < begin; ++i)
    ASSERT_EQ(to[i], kUntouched) << "wrote before the destination";
  for (size_t i = 0; i < size; ++i)
    ASSERT_EQ(to[begin + i], from[i]) << "byte " << i;
  for (size_t i = begin + size; i < to.size(); ++i)
    ASSERT_EQ(to[i], kUntouched) << "wrote past the destination";
}

class CopyReceived : public testing::TestWithParam<bool> {};

TEST_P(CopyReceived, CopiesExactlyTheBytesAskedForOnBothSidesOfTheSwitch) {
  const bool string_move = GetParam();
  constexpr size_t kGuard = 64;
  const std::vector<size_t> sizes = {0,    1,    7,    63,   64,   1000, 1023,
                                     1024, 1025, 2111, 2112, 4096, 4109, 8176};
  std::vector<uint8_t> from(8192 + 2 * kGuard);
  for (size_t i = 0; i < from.size(); ++i)
    from[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t size : sizes) {
    for (size_t from_at : {size_t{0}, size_t{1}, size_t{13}, size_t{63}}) {
      for (size_t to_at : {size_t{0}, size_t{5}, size_t{32}}) {
        // The destination to_at bytes past a guard of kGuard; a guard after.
        std::vector<uint8_t> to(kGuard + to_at + size + kGuard, kUntouched);
        const size_t begin = kGuard + to_at;
        copy_received(to.data() + begin, from.data() + from_at, size, string_move);
        SCOPED_TRACE("size " + std::to_string(size) + ", source +" + std::to_string(from_at) +
                     ", destination +" + std::to_string(to_at));
        ASSERT_NO_FATAL_FAILURE(expect_copied_exactly(to, begin, from.data() + from_at, size));
      }
    }
  }
}

// copy_short's inline copies: every size up to past its 32 bytes, through
// each width's two overlapping halves.
TEST(CopyShort, CopiesExactlyTheBytesAskedForAtEverySmallSize) {
  constexpr size_t kGuard = 16;
  std::vector<uint8_t> from(64);
  for (size_t i = 0; i < from.size(); ++i)
    from[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t size = 0; size <= 40; ++size) {
    for (size_t from_at : {size_t{0}, size_t{3}}) {
      std::vector<uint8_t> to(kGuard + size + kGuard, kUntouched);
      copy_short(to.data() + kGuard, from.data() + from_at, size);
      SCOPED_TRACE("size " + std::to_string(size) + ", source +" + std::to_string(from_at));
      ASSERT_NO_FATAL_FAILURE(expect_copied_exactly(to, kGuard, from.data() + from_at, size));
    }
  }
  copy_short(nullptr, nullptr, 0);  // none: touches neither
}

INSTANTIATE_TEST_SUITE_P(BothWays, CopyReceived, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& way) {
                           return way.param ? "StringMove" : "Memcpy";
                         });

}  // namespace
}  // namespace rdmabuf
