// The table of ranges given to remember_memory() (common/remembered_memory.h):
// what it accepts, what it finds, and what forget_memory() takes out.
#include "common/remembered_memory.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace rdmabuf {
namespace {

TEST(RememberedMemoryTest, FindsTheRangeThatHoldsASpanAndNothingElse) {
  std::vector<std::byte> bytes(4096);
  std::byte* p = bytes.data();
  ASSERT_TRUE(remember_memory(p + 1024, 1024).ok());

  auto whole = remembered_memory_holding(p + 1024, 1024);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->data(), p + 1024);
  EXPECT_EQ(whole->size(), 1024u);
  EXPECT_NE(whole->keepalive(), nullptr);
  auto inside = remembered_memory_holding(p + 1500, 10);
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->keepalive(), whole->keepalive()) << "one identity per remembered range";

  EXPECT_FALSE(remembered_memory_holding(p + 1000, 100).has_value()) << "starts before it";
  EXPECT_FALSE(remembered_memory_holding(p + 2000, 100).has_value()) << "ends after it";
  EXPECT_FALSE(remembered_memory_holding(p + 2048, 1).has_value()) << "just past it";
  EXPECT_FALSE(remembered_memory_holding(p, 1).has_value());

  const uint64_t generation = forgotten_generation();
  EXPECT_EQ(forget_memory(p + 1500, 1), 1u);
  EXPECT_GT(forgotten_generation(), generation);
  EXPECT_FALSE(remembered_memory_holding(p + 1500, 10).has_value());
  std::weak_ptr<const void> token = whole->keepalive();
  whole.reset();
  inside.reset();
  EXPECT_TRUE(token.expired()) << "forgetting drops the table's reference to the identity";
  EXPECT_EQ(forget_memory(p + 1500, 1), 0u);
}

TEST(RememberedMemoryTest, RefusesEmptyAndOverlappingRanges) {
  std::vector<std::byte> bytes(4096);
  std::byte* p = bytes.data();
  EXPECT_EQ(remember_memory(nullptr, 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(remember_memory(p, 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(remember_memory(p + 1024, 1024).ok());
  for (auto [at, size] :
       {std::pair<size_t, size_t>{0, 1025}, {1024, 1}, {2047, 10}, {1100, 10}, {0, 4096}}) {
    Status s = remember_memory(p + at, size);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << at << "+" << size;
    EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.to_string();
  }
  // Neighbours on both sides are fine.
  EXPECT_TRUE(remember_memory(p, 1024).ok());
  EXPECT_TRUE(remember_memory(p + 2048, 1024).ok());
  // One forget over all three.
  EXPECT_EQ(forget_memory(p + 1000, 1100), 3u);
  EXPECT_FALSE(remembered_memory_holding(p, 1).has_value());
  EXPECT_FALSE(remembered_memory_holding(p + 2048, 1).has_value());
}

TEST(RememberedMemoryTest, ForgettingAnEmptySpanForgetsTheRangeThatHoldsIt) {
  std::vector<std::byte> bytes(4096);
  ASSERT_TRUE(remember_memory(bytes.data(), bytes.size()).ok());
  EXPECT_EQ(forget_memory(bytes.data() + 100, 0), 1u);
  EXPECT_FALSE(remembered_memory_holding(bytes.data(), 1).has_value());
}

}  // namespace
}  // namespace rdmabuf
