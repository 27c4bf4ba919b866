// EventLoop (common/event_loop.h): tasks run on the loop's thread only, one
// call at a time, after kicks from any thread, when a watched descriptor is
// ready, and when their time comes; a run cancels the time; stop() runs
// what was kicked and lets go of every task.
#include "common/event_loop.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/socket.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;

// Counts its runs, checks that they never overlap and all come on the
// loop's thread, and calls `body` in each.
class CountingTask : public LoopTask {
 public:
  void on_run(EventLoop& loop) override {
    EXPECT_TRUE(loop.on_loop_thread());
    EXPECT_FALSE(running_.exchange(true)) << "two runs at once";
    if (body) body(loop);
    runs.fetch_add(1);
    running_.store(false);
  }
  std::function<void(EventLoop&)> body;
  std::atomic<int> runs{0};

 private:
  std::atomic<bool> running_{false};
};

// Waits up to 5 s for `done()`.
bool eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 500 && !done(); ++i)
    std::this_thread::sleep_for(10ms);
  return done();
}

TEST(EventLoopTest, KicksFromManyThreadsRunTheTaskOnTheLoopAfterTheLastOne) {
  auto loop = EventLoop::create(0us);
  ASSERT_TRUE(loop.ok()) << loop.status().to_string();
  auto task = std::make_shared<CountingTask>();
  std::atomic<int> kicked_value{0}, seen_value{0};
  task->body = [&](EventLoop&) { seen_value.store(kicked_value.load()); };
  std::vector<std::thread> kickers;
  for (int t = 0; t < 4; ++t) {
    kickers.emplace_back([&, t] {
      for (int i = 1; i <= 1000; ++i) {
        if (t == 0) kicked_value.store(i);
        (*loop)->kick(task);
      }
    });
  }
  for (auto& k : kickers)
    k.join();
  // A run starts after the last kick, so it sees the last value.
  EXPECT_TRUE(eventually([&] { return seen_value.load() == 1000; }));
  EXPECT_GE(task->runs.load(), 1);
  EXPECT_LE(task->runs.load(), 4000);
}

TEST(EventLoopTest, AWatchedDescriptorRunsItsTaskUntilUnwatched) {
  auto loop = EventLoop::create(0us);
  ASSERT_TRUE(loop.ok());
  auto fd = make_eventfd();
  ASSERT_TRUE(fd.ok());
  auto task = std::make_shared<CountingTask>();
  std::atomic<bool> watch{true};
  task->body = [&](EventLoop& l) {
    drain_eventfd(fd->get());
    if (watch.load()) {
      EXPECT_TRUE(l.watch(task, fd->get(), EPOLLIN).ok());
    } else {
      l.unwatch(fd->get());
    }
  };
  (*loop)->kick(task);  // the first run starts the watch
  ASSERT_TRUE(eventually([&] { return task->runs.load() == 1; }));
  signal_eventfd(fd->get());
  ASSERT_TRUE(eventually([&] { return task->runs.load() == 2; }));
  watch.store(false);
  signal_eventfd(fd->get());  // this run unwatches
  ASSERT_TRUE(eventually([&] { return task->runs.load() == 3; }));
  signal_eventfd(fd->get());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(task->runs.load(), 3) << "an unwatched descriptor ran its task";
}

TEST(EventLoopTest, ATimeRunsTheTaskOnceAndAnEarlierRunCancelsIt) {
  auto loop = EventLoop::create(0us);
  ASSERT_TRUE(loop.ok());
  auto task = std::make_shared<CountingTask>();
  std::atomic<int> arm{1};  // runs that set a time 150 ms on
  std::atomic<int64_t> last_run_ns{0};
  const auto start = Clock::now();
  task->body = [&](EventLoop& l) {
    last_run_ns.store((Clock::now() - start).count());
    if (arm.fetch_sub(1) > 0) l.wake_at(task, Clock::now() + 150ms);
  };
  (*loop)->kick(task);                                              // run 1 sets a time
  ASSERT_TRUE(eventually([&] { return task->runs.load() == 2; }));  // the time came
  EXPECT_GE(std::chrono::nanoseconds(last_run_ns.load()), 150ms);

  // A time set, then a kick before it: the kick's run cancels the time.
  arm.store(1);
  (*loop)->kick(task);  // run 3 sets a time
  ASSERT_TRUE(eventually([&] { return task->runs.load() == 3; }));
  (*loop)->kick(task);  // run 4, before the time, sets none (arm is spent)
  ASSERT_TRUE(eventually([&] { return task->runs.load() == 4; }));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(task->runs.load(), 4) << "a cancelled time ran the task";
}

TEST(EventLoopTest, StopRunsWhatWasKickedAndLetsGoOfEveryTask) {
  auto loop = EventLoop::create(0us);
  ASSERT_TRUE(loop.ok());
  auto fd = make_eventfd();
  ASSERT_TRUE(fd.ok());
  auto watched = std::make_shared<CountingTask>();
  watched->body = [&](EventLoop& l) {
    EXPECT_TRUE(l.watch(watched, fd->get(), EPOLLIN).ok());
    l.wake_at(watched, Clock::now() + 1h);
  };
  (*loop)->kick(watched);
  ASSERT_TRUE(eventually([&] { return watched->runs.load() == 1; }));
  EXPECT_GT(watched.use_count(), 1) << "the loop keeps what it watches";
  auto kicked = std::make_shared<CountingTask>();
  (*loop)->kick(kicked);
  (*loop)->stop();
  EXPECT_EQ(kicked->runs.load(), 1) << "a kick before stop() did not run";
  (*loop)->kick(kicked);
  EXPECT_EQ(kicked.use_count(), 1) << "a kick after stop() was kept";
  EXPECT_EQ(watched.use_count(), 1) << "the loop kept a watched task after stop()";
}

TEST(EventLoopTest, LoopsTakeNewTasksInTurn) {
  auto loops = EventLoops::create(3, 0us);
  ASSERT_TRUE(loops.ok());
  EXPECT_EQ((*loops)->threads(), 3);
  EventLoop* first = &(*loops)->next();
  EventLoop* second = &(*loops)->next();
  EventLoop* third = &(*loops)->next();
  EXPECT_NE(first, second);
  EXPECT_NE(second, third);
  EXPECT_NE(first, third);
  EXPECT_EQ(&(*loops)->next(), first);
  (*loops)->stop();
}

// drain() returns once what was kicked before it has run, including a
// slow run under way; on the loop's own thread, and after stop(), at once.
TEST(EventLoopTest, DrainReturnsOnceWhatWasKickedBeforeHasRun) {
  auto loop = EventLoop::create(0us);
  ASSERT_TRUE(loop.ok()) << loop.status().to_string();
  auto slow = std::make_shared<CountingTask>();
  slow->body = [](EventLoop&) { std::this_thread::sleep_for(50ms); };
  auto last = std::make_shared<CountingTask>();
  bool drained_inside = false;
  last->body = [&](EventLoop& l) {
    l.drain();  // its own thread: returns at once
    drained_inside = true;
  };
  (*loop)->kick(slow);
  (*loop)->kick(last);
  (*loop)->drain();
  EXPECT_EQ(slow->runs.load(), 1);
  EXPECT_EQ(last->runs.load(), 1);
  EXPECT_TRUE(drained_inside);
  (*loop)->stop();
  (*loop)->drain();  // ended: nothing to wait for
}

// The loops a manager's backends share: started on the first get(), the
// same set afterwards, and none once stopped.
TEST(EventLoopTest, SharedLoopsStartOnFirstUseAndEndWhenStopped) {
  SharedLoops shared(2, 0us);
  EXPECT_EQ(shared.threads(), 0);
  shared.drain();  // none yet: nothing to wait for
  auto first = shared.get();
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto again = shared.get();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*first, *again);
  EXPECT_EQ(shared.threads(), 2);
  auto task = std::make_shared<CountingTask>();
  (*first)->next().kick(task);
  shared.drain();
  EXPECT_EQ(task->runs.load(), 1);
  shared.stop();
  EXPECT_EQ(shared.get().status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace rdmabuf
