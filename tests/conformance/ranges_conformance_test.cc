// The conformance suite, scattered ops: one op that reads or writes a list
// of ranges of one remote buffer, with one status, run once per backend
// (fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/conformance/fixture.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"

namespace rdmabuf::conformance {
namespace {

using testing::find_mismatch;
using testing::find_not;

// `count` ranges of the given lengths (cycled), laid out apart from each
// other on both sides in shuffled orders, so that neither side's offsets
// follow the list's order; or, with `remote_run`, end to end in remote
// memory in the list's order (one run that a transport may move as one
// piece, scattered only locally). Returns the ranges and how much room each
// side needs.
struct Layout {
  std::vector<OpRange> ranges;
  uint64_t remote_span = 0;
  uint64_t local_span = 0;
};
Layout scattered_layout(size_t count, std::initializer_list<uint64_t> lengths, uint32_t seed,
                        bool remote_run = false) {
  const std::vector<uint64_t> cycle(lengths);
  Layout l;
  l.ranges.resize(count);
  for (size_t k = 0; k < count; ++k)
    l.ranges[k].length = cycle[k % cycle.size()];
  std::mt19937 rng(seed);
  std::vector<size_t> remote_order(count), local_order(count);
  std::iota(remote_order.begin(), remote_order.end(), 0);
  std::iota(local_order.begin(), local_order.end(), 0);
  if (!remote_run) std::shuffle(remote_order.begin(), remote_order.end(), rng);
  std::shuffle(local_order.begin(), local_order.end(), rng);
  const uint64_t remote_gap = remote_run ? 0 : 3;  // before each
  for (size_t k : remote_order) {
    l.ranges[k].remote_offset = l.remote_span + remote_gap;
    l.remote_span += l.ranges[k].length + remote_gap;
  }
  for (size_t k : local_order) {
    l.ranges[k].local_offset = l.local_span + 5;
    l.local_span += l.ranges[k].length + 5;
  }
  return l;
}

// What `dst` holds after a scattered copy of `ranges` from `src` (bytes
// outside the ranges untouched).
std::vector<std::byte> apply_model(std::vector<std::byte> dst, std::span<const std::byte> src,
                                   const std::vector<OpRange>& ranges, bool read) {
  for (const OpRange& r : ranges) {
    const uint64_t from = read ? r.remote_offset : r.local_offset;
    const uint64_t to = read ? r.local_offset : r.remote_offset;
    std::memcpy(dst.data() + to, src.data() + from, r.length);
  }
  return dst;
}

// The layouts both directions are tried with.
struct LayoutCase {
  const char* what;
  size_t count;
  std::initializer_list<uint64_t> lengths;
  bool remote_run = false;
};
const LayoutCase kLayoutCases[] = {
    {"one range", 1, {1000}},
    {"odd sizes", 37, {1, 7, 8, 9, 63, 4096, 4097, 100000}},
    {"pages", 256, {4096}},
    // About 10 KB in 5000 ranges: one chunk, cut into requests at 4096.
    {"more ranges than one request carries", 5000, {1, 2, 3}},
    // Over ibverbs: work requests that each gather (or scatter into) many
    // local pieces, more pieces than one takes.
    {"a remote run into local pieces", 300, {4096, 1, 700}, true},
};

class RangesTest : public ConformanceTest {};

TEST_P(RangesTest, ScatteredReadsLandWhereTheirRangesSay) {
  // Small chunks and three streams: ranges are cut between requests, and
  // requests of one op run on several connections at once.
  auto reader = make([](Config& c) {
    c.chunk_size = 64 << 10;
    c.tcp_streams = 3;
  });
  ASSERT_NE(reader, nullptr);
  for (const LayoutCase& c : kLayoutCases) {
    SCOPED_TRACE(c.what);
    Layout l = scattered_layout(c.count, c.lengths, static_cast<uint32_t>(c.count), c.remote_run);
    Owned o = own(l.remote_span + 11, 31);
    LocalMemory dst = with_sentinel(l.local_span + 7);
    const std::vector<std::byte> before = bytes(dst).vector();
    Transfer t = reader->submit(one(Op::read_ranges(o.handle, dst, l.ranges)), kTimeout);
    ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
    EXPECT_EQ(t.op_count(), 1u);
    EXPECT_EQ(t.op_backend(0), backend());
    const auto expected = apply_model(before, snapshot(o.memory), l.ranges, /*read=*/true);
    const auto got = bytes(dst).vector();
    ASSERT_EQ(got.size(), expected.size());
    auto diff = std::mismatch(got.begin(), got.end(), expected.begin());
    EXPECT_TRUE(diff.first == got.end()) << "first wrong byte at " << (diff.first - got.begin());
  }
}

TEST_P(RangesTest, ScatteredWritesLandWhereTheirRangesSay) {
  auto reader = make([](Config& c) {
    c.chunk_size = 64 << 10;
    c.tcp_streams = 3;
  });
  ASSERT_NE(reader, nullptr);
  for (const LayoutCase& c : kLayoutCases) {
    SCOPED_TRACE(c.what);
    Layout l =
        scattered_layout(c.count, c.lengths, static_cast<uint32_t>(c.count) + 1, c.remote_run);
    Owned o = own(l.remote_span + 11, 41);
    LocalMemory src = with_pattern(l.local_span + 7, 42);
    const std::vector<std::byte> before = snapshot(o.memory);
    Transfer t = reader->submit(one(Op::write_ranges(o.handle, src, l.ranges)), kTimeout);
    ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
    const auto expected = apply_model(before, bytes(src).vector(), l.ranges, /*read=*/false);
    const auto got = snapshot(o.memory);
    auto diff = std::mismatch(got.begin(), got.end(), expected.begin());
    EXPECT_TRUE(diff.first == got.end()) << "first wrong byte at " << (diff.first - got.begin());
  }
}

TEST_P(RangesTest, RangesAreRelativeToSlicesOnBothSides) {
  Owned o = own(10000, 51);
  LocalMemory dst = with_sentinel(3000);
  RemoteBuffer remote = slice(o.handle, 5000, 4000);
  LocalMemory local = slice(dst, 1000, 1500);
  const std::vector<OpRange> ranges = {{3990, 0, 10}, {0, 100, 500}, {1000, 1000, 500}};
  Transfer t = reader_->submit(one(Op::read_ranges(remote, local, ranges)), kTimeout);
  ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
  const auto got = bytes(dst).vector();
  const std::span<const std::byte> all(got);
  EXPECT_EQ(find_mismatch(all.subspan(1000, 10), 51, 8990), std::nullopt);
  EXPECT_EQ(find_mismatch(all.subspan(1100, 500), 51, 5000), std::nullopt);
  EXPECT_EQ(find_mismatch(all.subspan(2000, 500), 51, 6000), std::nullopt);
  EXPECT_EQ(find_not(all.subspan(1010, 90), kSentinel), std::nullopt);
  EXPECT_EQ(find_not(all.subspan(1600, 400), kSentinel), std::nullopt);
  EXPECT_EQ(find_not(all.first(1000), kSentinel), std::nullopt);
  EXPECT_EQ(find_not(all.subspan(2500), kSentinel), std::nullopt);
}

TEST_P(RangesTest, BadRangeListsAreRefusedAndMoveNothing) {
  Owned o = own(8192, 61);
  LocalMemory dst = with_sentinel(8192);
  LocalMemory src = with_pattern(8192, 62);
  struct Case {
    const char* what;
    Op op;
    const char* says;
  };
  auto read = [&](std::vector<OpRange> r) { return Op::read_ranges(o.handle, dst, std::move(r)); };
  auto write = [&](std::vector<OpRange> r) {
    return Op::write_ranges(o.handle, src, std::move(r));
  };
  Op atomic = Op::fetch_add(slice(o.handle, 0, 8), dst, 1);
  atomic.ranges = std::make_shared<const OpRanges>(std::vector<OpRange>{{0, 0, 8}});
  const Case cases[] = {
      {"no ranges", read({}), "empty"},
      {"an empty range", read({{0, 0, 10}, {100, 100, 0}}), "is empty"},
      {"past the remote end", read({{0, 0, 10}, {8190, 100, 3}}), "outside the remote"},
      {"past the local end", read({{0, 8190, 3}}), "outside the local"},
      {"offset + length wraps", read({{~uint64_t{0} - 1, 0, 4}}), "outside the remote"},
      {"overlap in local memory", read({{0, 0, 100}, {200, 99, 10}}), "overlap in local"},
      {"a write overlapping in remote memory", write({{0, 0, 100}, {50, 200, 10}}),
       "overlap in remote"},
      {"a write overlapping in local memory", write({{0, 0, 100}, {200, 10, 10}}),
       "overlap in local"},
      {"an atomic with ranges", atomic, "takes no ranges"},
  };
  std::vector<Op> ops;
  for (const Case& c : cases)
    ops.push_back(c.op);
  ops.push_back(read({{0, 0, 16}}));  // a good one beside them
  Transfer t = reader_->submit(std::move(ops), kTimeout);
  EXPECT_EQ(t.wait().code(), StatusCode::kInvalidArgument);
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(cases[i].what);
    EXPECT_EQ(t.op_status(i).code(), StatusCode::kInvalidArgument) << t.op_status(i).to_string();
    EXPECT_NE(t.op_status(i).message().find(cases[i].says), std::string::npos)
        << t.op_status(i).to_string();
    EXPECT_EQ(t.op_backend(i), "") << "a refused op reached a transport";
  }
  EXPECT_TRUE(t.op_status(std::size(cases)).ok()) << t.op_status(std::size(cases)).to_string();
  const auto got = bytes(dst).vector();
  EXPECT_EQ(find_mismatch(std::span<const std::byte>(got).first(16), 61), std::nullopt);
  EXPECT_EQ(find_not(std::span<const std::byte>(got).subspan(16), kSentinel), std::nullopt);
  EXPECT_EQ(find_mismatch(snapshot(o.memory), 61), std::nullopt) << "a refused write landed";
}

TEST_P(RangesTest, TooManyRangesIsInvalidArgument) {
  Owned o = own(4096, 63);
  LocalMemory dst = with_sentinel(4096);
  std::vector<OpRange> ranges(Op::kMaxRanges + 1, OpRange{0, 0, 1});
  Status s =
      reader_->submit(one(Op::read_ranges(o.handle, dst, std::move(ranges))), kTimeout).wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_EQ(find_not(bytes(dst).span(), kSentinel), std::nullopt);
}

TEST_P(RangesTest, ForgedHandleMovesNoRange) {
  constexpr size_t kSize = 64 << 10;
  Owned o = own(kSize, 65);
  auto token = testing::with_altered_token(o.handle, 9, 0x10);
  auto inside = testing::with_view(o.handle, 2 * kSize, 0, kSize);  // in-bounds bytes only
  ASSERT_TRUE(token.ok() && inside.ok());
  const std::vector<OpRange> ranges = {{0, 0, 100}, {5000, 200, 4096}, {kSize - 8, 9000, 8}};
  for (const auto& [handle, code] : {std::pair{*token, StatusCode::kPermissionDenied},
                                     std::pair{*inside, StatusCode::kInvalidArgument}}) {
    LocalMemory dst = with_sentinel(10000);
    Status s = reader_->submit(one(Op::read_ranges(handle, dst, ranges)), kTimeout).wait();
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_EQ(find_not(bytes(dst).span(), kSentinel), std::nullopt) << "a refused read landed";
    LocalMemory src = with_pattern(10000, 66);
    s = reader_->submit(one(Op::write_ranges(handle, src, ranges)), kTimeout).wait();
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_EQ(find_mismatch(snapshot(o.memory), 65), std::nullopt) << "a refused write landed";
  }
}

TEST_P(RangesTest, ScatteredOpsRideInBatchesBesidePlainOnes) {
  Owned o = own(1 << 20, 71);
  LocalMemory dst = with_sentinel(1 << 20);
  LocalMemory src = with_pattern(1 << 20, 72);
  std::vector<Op> ops;
  std::vector<OpRange> pages;
  for (uint64_t k = 0; k < 64; ++k)
    pages.push_back(OpRange{(63 - k) * 8192, k * 4096, 4096});  // every other page, reversed
  ops.push_back(Op::read_ranges(o.handle, slice(dst, 0, 256 << 10), pages));
  ops.push_back(Op::read(slice(o.handle, 4096, 4096), slice(dst, 512 << 10, 4096)));
  ops.push_back(Op::write_ranges(slice(o.handle, 600 << 10, 400 << 10), src,
                                 {{0, 0, 1000}, {10000, 5000, 2000}}));
  Transfer t = reader_->submit(std::move(ops), kTimeout);
  ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
  const auto got = bytes(dst).vector();
  const std::span<const std::byte> all(got);
  for (uint64_t k = 0; k < 64; ++k) {
    ASSERT_EQ(find_mismatch(all.subspan(k * 4096, 4096), 71, (63 - k) * 8192), std::nullopt) << k;
  }
  EXPECT_EQ(find_mismatch(all.subspan(512 << 10, 4096), 71, 4096), std::nullopt);
  const auto owner = snapshot(o.memory);
  const std::span<const std::byte> theirs(owner);
  EXPECT_EQ(find_mismatch(theirs.subspan(600 << 10, 1000), 72, 0), std::nullopt);
  EXPECT_EQ(find_mismatch(theirs.subspan((600 << 10) + 1000, 9000), 71, (600 << 10) + 1000),
            std::nullopt);
  EXPECT_EQ(find_mismatch(theirs.subspan((600 << 10) + 10000, 2000), 72, 5000), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Backends, RangesTest, ::testing::ValuesIn(backends_under_test()),
                         backend_name);
INSTANTIATE_TEST_SUITE_P(Gpu, RangesTest, ::testing::ValuesIn(gpu_setups_under_test()),
                         backend_name);

}  // namespace
}  // namespace rdmabuf::conformance
