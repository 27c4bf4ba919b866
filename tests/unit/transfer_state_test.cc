// TransferState (the completion / cancellation protocol between backends,
// the manager and Transfer) and Transfer itself (common/transfer_state.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "rdmabuf/backend.h"
#include "rdmabuf/transfer.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<TransferState> make_state(size_t ops, std::chrono::milliseconds timeout = 30s,
                                          std::chrono::microseconds busy_poll = 0us) {
  return std::make_shared<TransferState>(std::vector<Op>(ops), timeout, busy_poll);
}

template <typename F>
auto elapsed(F&& f) {
  auto start = Clock::now();
  f();
  return Clock::now() - start;
}

TEST(TransferStateTest, NoOpsIsFinishedAtOnce) {
  auto st = make_state(0);
  EXPECT_TRUE(st->finished());
  EXPECT_TRUE(st->status().ok());
  Transfer t(st);
  EXPECT_TRUE(t.done());
  EXPECT_TRUE(t.wait().ok());
  EXPECT_EQ(t.op_count(), 0u);
}

TEST(TransferStateTest, FinishesWhenTheLastOpCompletes) {
  auto st = make_state(3);
  EXPECT_FALSE(st->finished());
  EXPECT_EQ(st->status().code(), StatusCode::kFailedPrecondition) << "still in flight";
  EXPECT_EQ(st->op_status(0).code(), StatusCode::kFailedPrecondition);
  st->complete_part(1, Status::Ok());
  st->complete_part(0, Status::Ok());
  EXPECT_FALSE(st->finished());
  st->complete_part(2, Status::Ok());
  EXPECT_TRUE(st->finished());
  EXPECT_TRUE(st->status().ok());
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(st->op_status(i).ok());
}

TEST(TransferStateTest, MultiPartOpKeepsItsFirstError) {
  auto st = make_state(2);
  st->expect_parts(0, 3);
  st->complete_part(0, Status::Ok());
  st->complete_part(0, NotFound("first"));
  st->complete_part(1, Status::Ok());
  EXPECT_FALSE(st->finished()) << "op 0 has one part left";
  st->complete_part(0, Unavailable("second"));
  ASSERT_TRUE(st->finished());
  EXPECT_EQ(st->op_status(0), NotFound("first"));
  EXPECT_TRUE(st->op_status(1).ok());
  EXPECT_EQ(st->status(), NotFound("first"));
}

TEST(TransferStateTest, StatusIsTheFirstFailedOpByIndex) {
  auto st = make_state(4);
  st->complete_part(3, Unavailable("three"));
  st->complete_part(0, Status::Ok());
  st->complete_part(2, NotFound("two"));
  st->complete_part(1, Status::Ok());
  ASSERT_TRUE(st->finished());
  EXPECT_EQ(st->status(), NotFound("two"));
}

TEST(TransferStateTest, FailOpFinishesTheOpAtOnce) {
  auto st = make_state(2);
  st->expect_parts(0, 5);
  st->fail_op(0, InvalidArgument("bad op"));
  EXPECT_FALSE(st->finished());
  st->complete_part(1, Status::Ok());
  ASSERT_TRUE(st->finished());
  EXPECT_EQ(st->op_status(0), InvalidArgument("bad op"));
  EXPECT_TRUE(st->op_status(1).ok());
}

TEST(TransferStateTest, RoutesAndNotes) {
  auto st = make_state(2);
  st->set_route(0, "tcp", "nic: peer is on another host");
  EXPECT_EQ(st->op_backend(0), "tcp");
  EXPECT_EQ(st->op_note(0), "nic: peer is on another host");
  EXPECT_EQ(st->op_backend(1), "");
  EXPECT_EQ(st->op_note(1), "");
  Transfer t(st);
  EXPECT_EQ(t.op_backend(0), "tcp");
  EXPECT_EQ(t.op_backend(7), "") << "out of range";
  EXPECT_EQ(t.op_note(7), "");
  EXPECT_EQ(t.op_status(7).code(), StatusCode::kInvalidArgument);
  st->complete_part(0, Status::Ok());
  st->complete_part(1, Status::Ok());
}

// Every part of every op reported from many threads at once: the transfer
// finishes exactly when the last one arrives, never before.
TEST(TransferStateTest, ConcurrentPartsFinishExactlyOnce) {
  constexpr size_t kOps = 16;
  constexpr uint32_t kParts = 200;
  constexpr int kThreads = 8;
  for (int round = 0; round < 20; ++round) {
    auto st = make_state(kOps);
    for (size_t i = 0; i < kOps; ++i)
      st->expect_parts(i, kParts);
    std::atomic<int> reported{0};
    std::atomic<bool> early{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = 0; i < kOps; ++i) {
          for (uint32_t p = static_cast<uint32_t>(t); p < kParts; p += kThreads) {
            if (st->finished()) early = true;
            reported.fetch_add(1);
            st->complete_part(i, (p == 17 && i % 3 == 0) ? Unavailable("x") : Status::Ok());
          }
        }
      });
    }
    Transfer transfer(st);
    Status s = transfer.wait();
    EXPECT_EQ(reported.load(), static_cast<int>(kOps * kParts)) << "wait returned early";
    for (auto& th : threads)
      th.join();
    EXPECT_FALSE(early.load()) << "finished before every part was in";
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    for (size_t i = 0; i < kOps; ++i)
      EXPECT_EQ(st->op_status(i).code(), i % 3 == 0 ? StatusCode::kUnavailable : StatusCode::kOk);
  }
}

TEST(TransferStateTest, CancelFailsUnfinishedOpsOnly) {
  auto st = make_state(3);
  st->complete_part(0, Status::Ok());
  st->expect_parts(1, 2);
  st->complete_part(1, Status::Ok());
  st->cancel(StatusCode::kCancelled, "because the test said so");
  ASSERT_TRUE(st->finished());
  EXPECT_TRUE(st->cancelled());
  EXPECT_TRUE(st->op_status(0).ok()) << "op 0 had finished";
  EXPECT_EQ(st->op_status(1).code(), StatusCode::kCancelled);
  EXPECT_NE(st->op_status(1).message().find("because the test said so"), std::string::npos)
      << st->op_status(1).to_string();
  EXPECT_EQ(st->op_status(2).code(), StatusCode::kCancelled);
  EXPECT_EQ(st->status().code(), StatusCode::kCancelled);
}

TEST(TransferStateTest, CompletePartAfterCancelIsIgnored) {
  auto st = make_state(2);
  st->expect_parts(0, 2);
  st->cancel(StatusCode::kCancelled, "gone");
  Status before0 = st->op_status(0);
  Status before1 = st->op_status(1);
  // Backends still report every part they had, with any status.
  st->complete_part(0, Status::Ok());
  st->complete_part(0, Unavailable("late error"));
  st->complete_part(1, Status::Ok());
  EXPECT_TRUE(st->finished());
  EXPECT_EQ(st->op_status(0), before0);
  EXPECT_EQ(st->op_status(1), before1);
  EXPECT_EQ(st->op_status(0).code(), StatusCode::kCancelled);
  // A second cancel changes nothing either.
  st->cancel(StatusCode::kDeadlineExceeded, "later");
  EXPECT_EQ(st->op_status(0), before0);
}

TEST(TransferStateTest, BeginTouchFailsAfterCancel) {
  auto st = make_state(1);
  ASSERT_TRUE(st->begin_touch());
  st->end_touch();
  EXPECT_FALSE(st->cancelled());
  st->cancel(StatusCode::kCancelled, "x");
  EXPECT_TRUE(st->cancelled());
  for (int i = 0; i < 3; ++i)
    EXPECT_FALSE(st->begin_touch());
  // A failed begin_touch must not leave the guard counted: a second cancel
  // (from another caller) would otherwise wait for ever.
  auto done = std::async(std::launch::async, [&] { st->cancel(StatusCode::kCancelled, "y"); });
  EXPECT_EQ(done.wait_for(5s), std::future_status::ready);
}

// cancel() must not return while a backend is inside a begin/end_touch
// bracket: that is what makes "no byte lands after wait() returns" true.
TEST(TransferStateTest, CancelWaitsForAnOpenTouchBracket) {
  auto st = make_state(1);
  std::atomic<bool> inside{false}, release{false};
  std::thread backend([&] {
    ASSERT_TRUE(st->begin_touch());
    inside = true;
    while (!release.load())
      std::this_thread::sleep_for(1ms);
    st->end_touch();
  });
  while (!inside.load())
    std::this_thread::yield();
  std::atomic<bool> cancel_returned{false};
  std::thread canceller([&] {
    st->cancel(StatusCode::kCancelled, "test");
    cancel_returned = true;
  });
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(cancel_returned.load()) << "cancel returned while a backend touched the memory";
  EXPECT_TRUE(st->cancelled()) << "the flag is set at once so new brackets fail";
  EXPECT_FALSE(st->begin_touch());
  release = true;
  backend.join();
  canceller.join();
  EXPECT_TRUE(cancel_returned.load());
  EXPECT_TRUE(st->finished());
  EXPECT_EQ(st->op_status(0).code(), StatusCode::kCancelled);
}

// backend.h: complete_part calls "after the transfer was cancelled are
// accepted and ignored", and cancel() fails every unfinished op with its
// code. A backend that notices the cancellation (cancelled() is true) while
// cancel() waits for another backend thread's touch bracket reports its
// part; that report must not replace the cancellation's status.
// Regression: a bug this suite found at 1bfea06 (fixed in the working tree:
// cancel() claims the statuses before it sets the bit). cancel() set
// kCancelledBit, waited for the brackets, and only then recorded its code,
// so a backend's report in between won; the tcp backend's "cancelled before
// it was sent" then replaced DeadlineExceeded (seen end to end in
// ConformanceTest.ZeroTimeoutFailsWithDeadlineExceededAndNeverHangs).
TEST(TransferStateTest, PartReportedWhileCancelWaitsIsIgnored) {
  auto st = make_state(1);
  st->expect_parts(0, 2);
  std::atomic<bool> holding{false}, reported{false};
  // Backend thread 1: inside a bracket (a recv into the op's memory).
  std::thread toucher([&] {
    ASSERT_TRUE(st->begin_touch());
    holding = true;
    while (!reported.load())
      std::this_thread::sleep_for(1ms);
    st->end_touch();
    st->complete_part(0, Status::Ok());
  });
  // Backend thread 2: notices the cancellation and reports its part.
  std::thread noticer([&] {
    while (!st->cancelled())
      std::this_thread::sleep_for(1ms);
    st->complete_part(0, Cancelled("the backend noticed the cancellation"));
    reported = true;
  });
  while (!holding.load())
    std::this_thread::yield();
  st->cancel(StatusCode::kDeadlineExceeded, "the deadline passed");
  toucher.join();
  noticer.join();
  ASSERT_TRUE(st->finished());
  EXPECT_EQ(st->op_status(0).code(), StatusCode::kDeadlineExceeded) << st->op_status(0).to_string();
}

TEST(TransferStateTest, ManyTouchersAndACancel) {
  for (int round = 0; round < 50; ++round) {
    auto st = make_state(1);
    std::atomic<int> in_bracket{0};
    std::atomic<bool> violation{false}, stop{false};
    std::atomic<bool> cancel_done{false};
    std::vector<std::thread> touchers;
    for (int t = 0; t < 3; ++t) {
      touchers.emplace_back([&] {
        while (!stop.load()) {
          if (!st->begin_touch()) continue;
          in_bracket.fetch_add(1);
          if (cancel_done.load()) violation = true;
          in_bracket.fetch_sub(1);
          st->end_touch();
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    st->cancel(StatusCode::kCancelled, "x");
    cancel_done = true;
    EXPECT_EQ(in_bracket.load(), 0);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    stop = true;
    for (auto& th : touchers)
      th.join();
    EXPECT_FALSE(violation.load()) << "a bracket was open after cancel() returned";
  }
}

// The DeadlineExceeded message names the caller's timeout exactly.
// Regressions: at 1bfea06 the message said "149 ms" for a 150 ms timeout
// (the timeout was derived from the deadline and a later clock reading);
// at afb3659 CI failed this test under a sanitizer on a loaded machine, where
// the test's own clock started after the deadline was fixed. Now the state
// keeps the timeout as given, and the wait is timed from before the state
// exists, so both checks are exact however slow the machine.
TEST(TransferTest, WaitEnforcesTheDeadline) {
  const auto before = Clock::now();
  auto st = make_state(2, 150ms);
  st->complete_part(1, Status::Ok());
  Transfer t(st);
  Status s = t.wait();
  const auto took = Clock::now() - before;
  EXPECT_GE(took, 150ms) << "the deadline is 150 ms after the state was made";
  EXPECT_LT(took, 5s);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("timeout of 150 ms"), std::string::npos) << s.to_string();
  EXPECT_TRUE(t.done());
  EXPECT_EQ(t.op_status(0).code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(t.op_status(1).ok()) << "op 1 finished in time";
  EXPECT_TRUE(st->cancelled()) << "the memory guard is closed";
  // The backend reporting late changes nothing.
  st->complete_part(0, Status::Ok());
  EXPECT_EQ(t.op_status(0).code(), StatusCode::kDeadlineExceeded);
}

TEST(TransferTest, DoneEnforcesTheDeadline) {
  auto st = make_state(1, 100ms);
  Transfer t(st);
  EXPECT_FALSE(t.done());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.op_status(0).code(), StatusCode::kFailedPrecondition);
  std::this_thread::sleep_for(120ms);
  EXPECT_TRUE(t.done()) << "done() past the deadline finishes the transfer";
  EXPECT_EQ(t.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(st->begin_touch());
}

TEST(TransferTest, WaitForBeforeTheDeadlineChangesNothing) {
  auto st = make_state(1, 10s);
  Transfer t(st);
  bool finished = true;
  auto took = elapsed([&] { finished = t.wait_for(50ms); });
  EXPECT_FALSE(finished);
  EXPECT_GE(took, 45ms);
  EXPECT_LT(took, 5s);
  EXPECT_FALSE(st->cancelled()) << "a false wait_for must not cancel";
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  st->complete_part(0, Status::Ok());
  EXPECT_TRUE(t.wait_for(0ns));
  EXPECT_TRUE(t.status().ok());
}

TEST(TransferTest, WaitForPastTheDeadlineFinishes) {
  auto st = make_state(1, 100ms);
  Transfer t(st);
  bool finished = false;
  auto took = elapsed([&] { finished = t.wait_for(10s); });
  EXPECT_TRUE(finished);
  EXPECT_LT(took, 5s) << "wait_for must stop at the transfer's deadline";
  EXPECT_EQ(t.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(TransferTest, WakesEveryWaiter) {
  for (auto busy_poll : {0us, 200us}) {
    auto st = make_state(1, 30s, busy_poll);
    Transfer t(st);
    std::vector<std::future<Status>> waiters;
    for (int i = 0; i < 4; ++i)
      waiters.push_back(std::async(std::launch::async, [&] { return t.wait(); }));
    std::this_thread::sleep_for(50ms);
    st->complete_part(0, NotFound("woken"));
    for (auto& w : waiters) {
      ASSERT_EQ(w.wait_for(5s), std::future_status::ready);
      EXPECT_EQ(w.get(), NotFound("woken"));
    }
  }
}

TEST(TransferTest, CancelFailsTheUnfinished) {
  auto st = make_state(2);
  st->complete_part(0, Status::Ok());
  Transfer t(st);
  t.cancel();
  EXPECT_TRUE(t.done());
  EXPECT_TRUE(t.op_status(0).ok());
  EXPECT_EQ(t.op_status(1).code(), StatusCode::kCancelled);
  EXPECT_EQ(t.wait().code(), StatusCode::kCancelled);
}

TEST(TransferTest, CancelOnceDoneIsANoOp) {
  auto st = make_state(1);
  st->complete_part(0, Status::Ok());
  Transfer t(st);
  t.cancel();
  EXPECT_TRUE(t.status().ok());
  EXPECT_FALSE(st->cancelled());
}

TEST(TransferTest, DestructorCancels) {
  auto st = make_state(1);
  { Transfer t(st); }
  EXPECT_TRUE(st->finished());
  EXPECT_TRUE(st->cancelled());
  EXPECT_EQ(st->op_status(0).code(), StatusCode::kCancelled);
}

TEST(TransferTest, MoveAssignmentCancelsTheOldTransfer) {
  auto a = make_state(1);
  auto b = make_state(1);
  Transfer t(a);
  t = Transfer(b);
  EXPECT_TRUE(a->cancelled());
  EXPECT_FALSE(b->cancelled());
  Transfer moved(std::move(t));
  EXPECT_FALSE(b->cancelled()) << "a move keeps the transfer alive";
  b->complete_part(0, Status::Ok());
  EXPECT_TRUE(moved.wait().ok());
}

TEST(TransferTest, EmptyTransfer) {
  Transfer t;
  EXPECT_TRUE(t.done());
  EXPECT_TRUE(t.wait().ok());
  EXPECT_TRUE(t.wait_for(0ns));
  EXPECT_TRUE(t.status().ok());
  EXPECT_EQ(t.op_count(), 0u);
  EXPECT_EQ(t.op_status(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.op_backend(0), "");
  t.cancel();
}

TEST(TransferTest, ConcurrentWaitDoneCancel) {
  for (int round = 0; round < 100; ++round) {
    auto st = make_state(4, 5ms);
    Transfer t(st);
    std::thread a([&] { (void)t.wait(); });
    std::thread b([&] {
      while (!t.done()) {
      }
    });
    std::thread c([&] { t.cancel(); });
    std::thread d([&] {
      for (size_t i = 0; i < 4; ++i)
        st->complete_part(i, Status::Ok());
    });
    a.join();
    b.join();
    c.join();
    d.join();
    EXPECT_TRUE(t.done());
    for (size_t i = 0; i < 4; ++i) {
      StatusCode code = t.op_status(i).code();
      EXPECT_TRUE(code == StatusCode::kOk || code == StatusCode::kCancelled ||
                  code == StatusCode::kDeadlineExceeded)
          << t.op_status(i).to_string();
    }
  }
}

}  // namespace
}  // namespace rdmabuf
