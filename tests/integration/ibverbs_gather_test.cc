// Scattered ops over ibverbs (backends/ibverbs/ibverbs_backend.cc): ranges
// that follow one another in the owner's memory share one work request, a
// local piece each, up to the device's limit; ranges apart in the owner's
// memory take one work request each. Every byte is checked both ways.
//
// Needs an RDMA device (scripts/softroce-vm runs it, as part of the ctest
// test ibverbs_in_softroce_vm); skipped with the reason elsewhere.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/helpers/backend_detail.h"
#include "tests/helpers/sanitizer.h"
#include "tests/integration/ibverbs_pair.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPages = 64;

class IbverbsGatherTest : public IbverbsPairTest {
 protected:
  void SetUp() override { set_up(with_pattern(2 * kPages * kPage, 71)); }

  uint64_t detail(const std::string& key) const {
    return std::stoull(backend_detail(*reader_, "ibverbs", key));
  }

  // Runs `op` alone over ibverbs; the work requests it took, and how many
  // of them had local pieces.
  std::pair<uint64_t, uint64_t> run(Op op) {
    const uint64_t requests = detail("work requests");
    const uint64_t gathering = detail("work requests with local pieces");
    Transfer t = reader_->submit({std::move(op)}, kTimeout);
    Status s = t.wait();
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(t.op_backend(0), "ibverbs");
    return {detail("work requests") - requests,
            detail("work requests with local pieces") - gathering};
  }
};

// What `memory` holds now (the owner's memory, written by the NIC).
std::vector<std::byte> contents(const LocalMemory& memory) {
  ScopedIgnoreReads quiet;
  return {memory.data(), memory.data() + memory.size()};
}

// Page k of the owner's first kPages pages, end to end, to or from every
// other local page, backwards: local pieces out of order.
std::vector<OpRange> remote_run_to_local_pages() {
  std::vector<OpRange> ranges;
  for (uint64_t k = 0; k < kPages; ++k)
    ranges.push_back({k * kPage, 2 * (kPages - 1 - k) * kPage, kPage});
  return ranges;
}

TEST_F(IbverbsGatherTest, ARemoteRunIsReadIntoLocalPiecesWithFewWorkRequests) {
  const uint64_t limit = detail("local pieces per work request");
  ASSERT_GT(limit, 1u) << "the device gathers one piece per work request";
  LocalMemory dst = with_sentinel(2 * kPages * kPage);
  const auto [requests, gathering] =
      run(Op::read_ranges(remote_, dst, remote_run_to_local_pages()));
  EXPECT_EQ(requests, (kPages + limit - 1) / limit);
  EXPECT_EQ(gathering, requests);
  ScopedIgnoreReads quiet;  // written by the NIC
  const std::vector<std::byte> remote = contents(remote_memory_);
  for (uint64_t k = 0; k < kPages; ++k) {
    SCOPED_TRACE(k);
    const std::byte* got = dst.data() + 2 * (kPages - 1 - k) * kPage;
    ASSERT_EQ(std::memcmp(got, remote.data() + k * kPage, kPage), 0);
    ASSERT_EQ(find_not(std::span(got + kPage, kPage), kSentinel), std::nullopt);
  }
}

TEST_F(IbverbsGatherTest, LocalPiecesAreWrittenToARemoteRunWithFewWorkRequests) {
  const uint64_t limit = detail("local pieces per work request");
  LocalMemory src = with_pattern(2 * kPages * kPage, 72);
  const auto [requests, gathering] =
      run(Op::write_ranges(remote_, src, remote_run_to_local_pages()));
  EXPECT_EQ(requests, (kPages + limit - 1) / limit);
  EXPECT_EQ(gathering, requests);
  const std::vector<std::byte> remote = contents(remote_memory_);
  for (uint64_t k = 0; k < kPages; ++k) {
    SCOPED_TRACE(k);
    ASSERT_EQ(
        std::memcmp(remote.data() + k * kPage, src.data() + 2 * (kPages - 1 - k) * kPage, kPage),
        0);
  }
  EXPECT_EQ(find_mismatch(std::span(remote).subspan(kPages * kPage), 71, kPages * kPage),
            std::nullopt)
      << "bytes past the run changed";
}

TEST_F(IbverbsGatherTest, RangesApartInTheOwnersMemoryTakeOneWorkRequestEach) {
  std::vector<OpRange> ranges;
  for (uint64_t k = 0; k < kPages; ++k)
    ranges.push_back({2 * k * kPage, k * kPage, kPage});
  LocalMemory dst = with_sentinel(kPages * kPage);
  const auto [requests, gathering] = run(Op::read_ranges(remote_, dst, ranges));
  EXPECT_EQ(requests, kPages);
  EXPECT_EQ(gathering, 0u);
  ScopedIgnoreReads quiet;
  const std::vector<std::byte> remote = contents(remote_memory_);
  for (uint64_t k = 0; k < kPages; ++k)
    ASSERT_EQ(std::memcmp(dst.data() + k * kPage, remote.data() + 2 * k * kPage, kPage), 0) << k;
}

TEST_F(IbverbsGatherTest, RangesAdjacentOnBothSidesAreOnePiece) {
  std::vector<OpRange> ranges;
  for (uint64_t k = 0; k < kPages; ++k)
    ranges.push_back({k * kPage, k * kPage, kPage});
  LocalMemory dst = with_sentinel(kPages * kPage);
  const auto [requests, gathering] = run(Op::read_ranges(remote_, dst, ranges));
  EXPECT_EQ(requests, 1u);
  EXPECT_EQ(gathering, 0u);
  ScopedIgnoreReads quiet;
  EXPECT_EQ(find_mismatch(std::span(dst.data(), kPages * kPage), 71), std::nullopt);
}

}  // namespace
}  // namespace rdmabuf::testing
