// OpRanges (common/op_ranges.cc): the shape a list of ranges is found to
// have once, when it is made (what Manager::submit then checks in constant
// time), against a plain pairwise check; and the cursor that walks an op's
// extents from any byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/op_extents.h"
#include "rdmabuf/op.h"

namespace rdmabuf {
namespace {

// Whether two ranges share a byte on the side `offset` picks: each pair.
template <class Offset>
bool overlap_pairwise(const std::vector<OpRange>& ranges, Offset offset) {
  for (size_t a = 0; a < ranges.size(); ++a) {
    for (size_t b = a + 1; b < ranges.size(); ++b) {
      const uint64_t a0 = offset(ranges[a]), b0 = offset(ranges[b]);
      if (a0 < b0 + ranges[b].length && b0 < a0 + ranges[a].length) return true;
    }
  }
  return false;
}

TEST(OpRangesTest, PagesInOrderTouchingButApartHaveNoOverlap) {
  std::vector<OpRange> pages;
  for (uint64_t k = 0; k < 1024; ++k)
    pages.push_back({k * 4096, 2 * k * 4096, 4096});
  const OpRanges list(pages);
  EXPECT_TRUE(list.well_formed());
  EXPECT_FALSE(list.local_overlap());
  EXPECT_FALSE(list.remote_overlap());
  EXPECT_EQ(list.remote_end(), 1024u * 4096);
  EXPECT_EQ(list.local_end(), 2u * 1023 * 4096 + 4096);
  EXPECT_EQ(list.bytes(), 1024u * 4096);
}

TEST(OpRangesTest, OverlapIsFoundOnEachSideInAnyOrder) {
  // Out of order, overlapping by one byte in local memory only.
  const OpRanges local_only({{500, 500, 10}, {0, 0, 100}, {300, 99, 10}});
  EXPECT_TRUE(local_only.local_overlap());
  EXPECT_FALSE(local_only.remote_overlap());
  // In order, overlapping in remote memory only.
  const OpRanges remote_only({{0, 0, 100}, {99, 200, 10}});
  EXPECT_FALSE(remote_only.local_overlap());
  EXPECT_TRUE(remote_only.remote_overlap());
  // The same offset twice.
  const OpRanges twice({{64, 0, 8}, {64, 8, 8}});
  EXPECT_TRUE(twice.remote_overlap());
  EXPECT_FALSE(twice.local_overlap());
}

TEST(OpRangesTest, OverlapAgreesWithEveryPairOnRandomLists) {
  std::mt19937_64 random(58);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<OpRange> ranges(1 + random() % 12);
    const bool ascending = trial % 2 == 0;
    uint64_t next = 0;
    for (OpRange& r : ranges) {
      r.length = 1 + random() % 16;
      r.local_offset = random() % 200;
      // Half the lists in ascending remote order, which takes the linear path.
      r.remote_offset = ascending ? next + random() % 8 : random() % 200;
      next = r.remote_offset + (random() % 3 == 0 ? 0 : r.length);
    }
    const OpRanges list(ranges);
    SCOPED_TRACE(trial);
    ASSERT_TRUE(list.well_formed());
    EXPECT_EQ(list.local_overlap(),
              overlap_pairwise(ranges, [](const OpRange& r) { return r.local_offset; }));
    EXPECT_EQ(list.remote_overlap(),
              overlap_pairwise(ranges, [](const OpRange& r) { return r.remote_offset; }));
  }
}

TEST(OpRangesTest, EmptyOrWrappingRangesAreNotWellFormed) {
  EXPECT_FALSE(OpRanges({{0, 0, 10}, {100, 100, 0}}).well_formed());
  EXPECT_FALSE(OpRanges({{~uint64_t{0} - 1, 0, 4}}).well_formed());
  EXPECT_FALSE(OpRanges({{0, ~uint64_t{0}, 2}}).well_formed());
  EXPECT_FALSE(OpRanges({{0, 0, ~uint64_t{0} / 2 + 1}, {0, 0, ~uint64_t{0} / 2 + 1}}).well_formed())
      << "a sum past 2^64";
  EXPECT_TRUE(OpRanges({{~uint64_t{0} - 4, 0, 4}}).well_formed());
}

TEST(OpRangesTest, ExtentsFromAnyByteFollowTheRanges) {
  Op op;
  op.ranges = std::make_shared<const OpRanges>(
      std::vector<OpRange>{{100, 0, 10}, {0, 50, 5}, {300, 20, 20}});
  // 23 bytes from byte 12 of the sequence (2 B into the second range).
  std::vector<Extent> got;
  for_each_extent(op, 12, 23, [&](const Extent& e) { got.push_back(e); });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].local_offset, 52u);
  EXPECT_EQ(got[0].remote_offset, 2u);
  EXPECT_EQ(got[0].length, 3u);
  EXPECT_EQ(got[1].local_offset, 20u);
  EXPECT_EQ(got[1].remote_offset, 300u);
  EXPECT_EQ(got[1].length, 20u);
  EXPECT_EQ(count_extents(op, 12, 23), 2u);
  EXPECT_EQ(count_extents(op, 0, 35), 3u);
  EXPECT_EQ(count_extents(op, 3, 4), 1u);
}

}  // namespace
}  // namespace rdmabuf
