#include "common/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "tests/helpers/threads.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;

// Jobs that wait until let go, and say when they started.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  bool open = false;

  void job() {
    std::unique_lock lock(mu);
    ++started;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  bool wait_started(int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 10s, [&] { return started >= n; });
  }
  void let_go() {
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(WorkerPoolTest, StartsAThreadOnlyWhenNoneIsIdle) {
  WorkerPool pool("test-workers", 8, 10s);
  EXPECT_EQ(pool.threads(), 0);
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(pool.run([&] { ++ran; }));
    while (ran.load() <= i || pool.busy_threads() > 0)  // its thread back from the job
      std::this_thread::yield();
  }
  EXPECT_EQ(pool.threads(), 1) << "one job at a time needs one thread";
  EXPECT_EQ(testing::threads_named("test-workers"), 1);
}

TEST(WorkerPoolTest, BlockedJobsGetAThreadEachUpToTheLimitThenTheRestWait) {
  WorkerPool pool("test-workers", 3, 10s);
  Gate gate;
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(pool.run([&] { gate.job(); }));
  ASSERT_TRUE(gate.wait_started(3));
  EXPECT_EQ(pool.threads(), 3);
  std::this_thread::sleep_for(50ms);
  {
    std::lock_guard lock(gate.mu);
    EXPECT_EQ(gate.started, 3) << "two wait for a thread to come free";
  }
  gate.let_go();
  EXPECT_TRUE(gate.wait_started(5));
}

TEST(WorkerPoolTest, QueuedJobsRunInTheOrderGiven) {
  WorkerPool pool("test-workers", 1, 10s);
  Gate gate;
  std::mutex mu;
  std::vector<int> order;
  ASSERT_TRUE(pool.run([&] { gate.job(); }));
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(pool.run([&, i] {
      std::lock_guard lock(mu);
      order.push_back(i);
    }));
  }
  gate.let_go();
  pool.stop();  // runs what was queued first
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(WorkerPoolTest, AnIdleThreadEnds) {
  WorkerPool pool("test-workers", 4, 50ms);
  std::atomic<bool> ran{false};
  ASSERT_TRUE(pool.run([&] { ran = true; }));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while ((!ran || pool.threads() > 0) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(ran);
  EXPECT_EQ(pool.threads(), 0);
  // And a later job starts one again.
  std::atomic<bool> again{false};
  ASSERT_TRUE(pool.run([&] { again = true; }));
  while (!again && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  EXPECT_TRUE(again);
}

TEST(WorkerPoolTest, AStoppedPoolRefusesJobs) {
  WorkerPool pool("test-workers", 2, 10s);
  pool.stop();
  bool ran = false;
  EXPECT_FALSE(pool.run([&] { ran = true; }));
  EXPECT_FALSE(ran);
  EXPECT_EQ(pool.threads(), 0);
}

}  // namespace
}  // namespace rdmabuf
