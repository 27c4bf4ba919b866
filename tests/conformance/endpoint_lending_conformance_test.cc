// The conformance suite, what endpoints pass besides messages: handles, and
// memory lent for a lease; each backend in turn (fixture.h).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/conformance/endpoint_pair.h"
#include "tests/conformance/fixture.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"
#include "tests/helpers/threads.h"

namespace rdmabuf::conformance {
namespace {

TEST_P(ConformanceTest, EndpointPassesHandlesInOrder) {
  auto [receiver, sender] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(receiver && sender);
  Owned a = own(100, 1), b = own(200, 2);
  ASSERT_TRUE(receiver->send_buffer(a.handle, kTimeout).ok());
  ASSERT_TRUE(receiver->send_buffer(slice(b.handle, 10, 20), kTimeout).ok());
  auto first = sender->receive_buffer(kTimeout);
  auto second = sender->receive_buffer(kTimeout);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->id(), a.handle.id());
  EXPECT_EQ(second->id(), b.handle.id());
  EXPECT_EQ(second->offset(), 10u);
  EXPECT_EQ(second->size(), 20u);
  // The handle works: read through it.
  LocalMemory got = allocate(100);
  EXPECT_TRUE(reader_->read_into(*first, got).ok());
  EXPECT_EQ(std::memcmp(bytes(got).data(), bytes(a.memory).data(), 100), 0);
  EXPECT_EQ(sender->receive_buffer(50ms).status().code(), StatusCode::kDeadlineExceeded);
}

TEST_P(ConformanceTest, EndpointLentMemoryIsUsableUntilItsLeaseEnds) {
  auto [lender, borrower] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(lender && borrower);
  const size_t registered = owner_->registered_count();
  auto lease = borrower->request_remote_buffer(64 << 10, 400ms, kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(lease->buffer.size(), 64u << 10);
  EXPECT_EQ(lease->buffer.owner().manager_id, owner_->identity().manager_id);
  EXPECT_EQ(lease->granted, 400ms);
  EXPECT_EQ(owner_->registered_count(), registered + 1);
  // Renewed at once (one round trip; the first write over a transport may
  // take longer than the first lease where a sanitizer runs under an
  // emulated CPU): it outlives its first lease.
  const auto granted_at = Clock::now();
  auto renewed = borrower->renew(lease->buffer, 3s, kTimeout);
  ASSERT_TRUE(renewed.ok()) << renewed.status().to_string();
  ASSERT_TRUE(reader_->write_from(lease->buffer, with_pattern(64 << 10, 5)).ok());
  std::this_thread::sleep_until(granted_at + 600ms);
  LocalMemory back = allocate(64 << 10);
  ASSERT_TRUE(reader_->read_into(lease->buffer, back).ok()) << "renewed, yet gone";
  EXPECT_FALSE(find_mismatch(bytes(back).span(), 5));
  // Not renewed again: reclaimed at its end (the lender releases it), and
  // refused from then on. (An op racing the release: see
  // ReleaseWhileAnOpIsInFlightEndsItSoon.)
  const auto until = Clock::now() + kTimeout;
  while (owner_->registered_count() != registered && Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(owner_->registered_count(), registered) << "the lease never ended";
  Status st = reader_->read_into(lease->buffer, back);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_EQ(reader_->write_from(lease->buffer, back).code(), StatusCode::kNotFound);
  EXPECT_EQ(borrower->renew(lease->buffer, 1s, kTimeout).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(owner_->registered_count(), registered);
}

// An endpoint's lease keeper starts with its first loan: endpoints that
// lend nothing (most) cost one thread each, not two.
TEST_P(ConformanceTest, EndpointLeaseKeeperStartsWithTheFirstLoan) {
  auto [lender, borrower] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(lender && borrower);
  EXPECT_EQ(testing::threads_named("rdmabuf-leases"), 0) << "no lease keeper before a loan";
  auto lease = borrower->request_remote_buffer(4096, 10s, kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(testing::threads_named("rdmabuf-leases"), 1) << "the lender's lease keeper";
  auto again = borrower->request_remote_buffer(4096, 10s, kTimeout);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(testing::threads_named("rdmabuf-leases"), 1) << "one lease keeper for every loan";
}

TEST_P(ConformanceTest, EndpointLentMemoryComesBackWithWhatWasWritten) {
  auto [lender, borrower] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(lender && borrower);
  auto lease = borrower->request_remote_buffer(8192, 60s, kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  ASSERT_TRUE(reader_->write_from(lease->buffer, with_pattern(8192, 11)).ok());
  // Passed back (a slice of it): the lender gets its memory, the borrower
  // loses access.
  ASSERT_TRUE(borrower->send_buffer(slice(lease->buffer, 4096, 4096), kTimeout).ok());
  auto memory = lender->receive_local_buffer(kTimeout);
  ASSERT_TRUE(memory.ok()) << memory.status().to_string();
  EXPECT_EQ(memory->size(), 4096u);
  auto landed = snapshot(*memory);
  EXPECT_FALSE(find_mismatch(landed, 11, 4096));
  EXPECT_EQ(reader_->read_into(lease->buffer, allocate(8192)).code(), StatusCode::kNotFound);
  // A handle that is not lent memory is an ordinary handle.
  EXPECT_EQ(lender->receive_buffer(50ms).status().code(), StatusCode::kDeadlineExceeded);
}

TEST_P(ConformanceTest, EndpointLendingRespectsTheLimitAndTheMaximumLease) {
  owner_ = make([](Config& c) {
    c.lend_limit = 1 << 20;
    c.max_lease = 300ms;
  });
  auto [lender, borrower] = connect_endpoints(*owner_, *reader_);
  ASSERT_TRUE(lender && borrower);
  auto big = borrower->request_remote_buffer((1 << 20) + 1, 1s, kTimeout);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted) << big.status().to_string();
  auto first = borrower->request_remote_buffer(768 << 10, 1h, kTimeout);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->granted, 300ms);
  EXPECT_EQ(borrower->request_remote_buffer(512 << 10, 1s, kTimeout).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(borrower->request_remote_buffer(0, 1s, kTimeout).status().code(),
            StatusCode::kInvalidArgument);
  // Once the first lease ends, its bytes are back in the budget.
  const auto until = Clock::now() + kTimeout;
  Result<Lease> second = ResourceExhausted("not tried");
  while (!second.ok() && Clock::now() < until) {
    std::this_thread::sleep_for(50ms);
    second = borrower->request_remote_buffer(512 << 10, 1s, kTimeout);
  }
  EXPECT_TRUE(second.ok()) << second.status().to_string();
}

}  // namespace
}  // namespace rdmabuf::conformance
