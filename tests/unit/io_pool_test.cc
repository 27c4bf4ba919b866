// The shared I/O threads (common/io_pool.h): many sessions on few threads,
// one thread per session at a time, deadlines, eviction of the idlest
// session, and stopping. Real sockets (Unix socket pairs) throughout.
#include "common/io_pool.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;

struct Pair {
  Fd ours, theirs;
};

Pair socket_pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{Fd(fds[0]), Fd(fds[1])};
}

// What every session of a test records.
struct Record {
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::atomic<int> overlaps{0};
  std::atomic<int> timeouts{0};
  std::atomic<int> evicted{0};
  std::atomic<int> destroyed{0};
};

// Echoes every byte back; idle between messages; fails the test loudly
// (counts an overlap) if two threads ever run it at once.
class EchoSession final : public IoSession {
 public:
  EchoSession(Fd fd, Record* record, Deadline deadline = Deadline::max(), bool evictable = true)
      : fd_(std::move(fd)), record_(record), deadline_(deadline), evictable_(evictable) {}
  ~EchoSession() override { record_->destroyed.fetch_add(1); }

  int fd() const override { return fd_.get(); }
  Wait on_ready() override {
    if (running_.exchange(true)) record_->overlaps.fetch_add(1);
    {
      std::lock_guard lock(record_->mu);
      record_->threads.insert(std::this_thread::get_id());
    }
    Wait next = Wait::kReadable;
    char buf[256];
    while (true) {
      ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) {
        next = Wait::kClose;
        break;
      }
      if (n < 0) break;
      if (::send(fd_.get(), buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) {
        next = Wait::kClose;
        break;
      }
    }
    running_.store(false);
    return next;
  }
  Deadline deadline() const override { return deadline_; }
  Wait on_timeout() override {
    record_->timeouts.fetch_add(1);
    return Wait::kClose;
  }
  bool idle() const override { return evictable_; }
  bool on_evict() override {
    if (refuse_eviction_) return false;  // "a request came meanwhile"
    record_->evicted.fetch_add(1);
    return true;
  }
  void refuse_eviction() { refuse_eviction_ = true; }

 private:
  Fd fd_;
  Record* record_;
  Deadline deadline_;
  bool evictable_;
  bool refuse_eviction_ = false;
  std::atomic<bool> running_{false};
};

bool echoes(int fd, const std::string& text) {
  if (::send(fd, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    return false;
  }
  std::string got;
  const Deadline until = Clock::now() + 5s;
  while (got.size() < text.size() && Clock::now() < until) {
    char buf[256];
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return false;
    } else {
      std::this_thread::sleep_for(100us);
    }
  }
  return got == text;
}

// Whether the other end of `fd` has been closed (EOF within 5 s).
bool closed_within_5s(int fd) {
  const Deadline until = Clock::now() + 5s;
  while (Clock::now() < until) {
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (n == 0) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

// The number of idle sessions once `count` of them wait (within 5 s).
size_t idle_once(const IoPool& pool, size_t count) {
  for (int k = 0; k < 5000 && pool.idle_count() < count; ++k)
    std::this_thread::sleep_for(1ms);
  return pool.idle_count();
}

// A pool of two threads, and what its sessions record.
class IoPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = IoPool::create(2);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    pool_ = std::move(pool).value();
  }

  Record record_;
  std::unique_ptr<IoPool> pool_;
};

TEST_F(IoPoolTest, ManySessionsOnTwoThreadsEachOnOneThreadAtATime) {
  constexpr int kSessions = 300;
  std::vector<Fd> peers;
  for (int i = 0; i < kSessions; ++i) {
    Pair p = socket_pair();
    pool_->add(std::make_unique<EchoSession>(std::move(p.ours), &record_));
    peers.push_back(std::move(p.theirs));
  }
  EXPECT_EQ(pool_->size(), size_t{kSessions});
  EXPECT_EQ(pool_->threads(), 2);
  // Every session, several times over, from several threads at once.
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (int i = t; i < kSessions; i += 4) {
          if (!echoes(peers[i].get(), "message " + std::to_string(i) + "/" + std::to_string(round)))
            failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& c : clients)
    c.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(record_.overlaps.load(), 0);
  {
    std::lock_guard lock(record_.mu);
    EXPECT_LE(record_.threads.size(), 2u);
  }
  // A peer that hangs up ends its session.
  peers[0].reset();
  for (int i = 0; i < 500 && pool_->size() != size_t{kSessions - 1}; ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(pool_->size(), size_t{kSessions - 1});
  pool_->stop();
  EXPECT_EQ(record_.destroyed.load(), kSessions);
  EXPECT_EQ(pool_->size(), 0u);
}

TEST_F(IoPoolTest, ASessionPastItsDeadlineTimesOutAndTheOthersGoOn) {
  Pair late = socket_pair();
  Pair fine = socket_pair();
  const auto start = Clock::now();
  pool_->add(std::make_unique<EchoSession>(std::move(late.ours), &record_, start + 200ms));
  pool_->add(std::make_unique<EchoSession>(std::move(fine.ours), &record_));
  EXPECT_TRUE(closed_within_5s(late.theirs.get()));
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 3s);
  EXPECT_EQ(record_.timeouts.load(), 1);
  EXPECT_TRUE(echoes(fine.theirs.get(), "still here"));
}

TEST_F(IoPoolTest, EvictionClosesTheIdleSessionThatWaitedLongest) {
  Pair busy = socket_pair();
  pool_->add(std::make_unique<EchoSession>(std::move(busy.ours), &record_, Deadline::max(),
                                           /*evictable=*/false));
  std::vector<Pair> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(socket_pair());
    pool_->add(std::make_unique<EchoSession>(std::move(idle.back().ours), &record_));
  }
  // A session is idle once it has run and waits again: have each run, the
  // first last, so that the second has waited longest.
  size_t waiting_idle = 0;
  for (int i : {1, 2, 0}) {
    ASSERT_TRUE(echoes(idle[i].theirs.get(), "x"));
    // It waits, idle, again before the next runs.
    ++waiting_idle;
    ASSERT_EQ(idle_once(*pool_, waiting_idle), waiting_idle);
  }
  ASSERT_TRUE(echoes(busy.theirs.get(), "x"));
  for (int i : {1, 2, 0}) {
    EXPECT_TRUE(pool_->evict_idle());
    EXPECT_TRUE(closed_within_5s(idle[i].theirs.get())) << "session " << i;
  }
  EXPECT_FALSE(pool_->evict_idle()) << "the busy session is never evicted";
  EXPECT_EQ(record_.evicted.load(), 3);
  EXPECT_TRUE(echoes(busy.theirs.get(), "still here"));
}

TEST_F(IoPoolTest, ASessionThatTurnsOutBusyIsKeptAndTheNextIdleOneGoes) {
  Pair first = socket_pair(), second = socket_pair();
  auto refusing = std::make_unique<EchoSession>(std::move(first.ours), &record_);
  refusing->refuse_eviction();
  pool_->add(std::move(refusing));
  pool_->add(std::make_unique<EchoSession>(std::move(second.ours), &record_));
  ASSERT_TRUE(echoes(first.theirs.get(), "x"));
  ASSERT_EQ(idle_once(*pool_, 1), 1u);
  ASSERT_TRUE(echoes(second.theirs.get(), "x"));
  ASSERT_EQ(idle_once(*pool_, 2), 2u);
  EXPECT_TRUE(pool_->evict_idle());
  EXPECT_TRUE(closed_within_5s(second.theirs.get()));
  EXPECT_EQ(record_.evicted.load(), 1);
  EXPECT_TRUE(echoes(first.theirs.get(), "kept, and served"));
}

TEST_F(IoPoolTest, AddAfterStopClosesTheSession) {
  pool_->stop();
  Pair p = socket_pair();
  pool_->add(std::make_unique<EchoSession>(std::move(p.ours), &record_));
  EXPECT_EQ(record_.destroyed.load(), 1);
  EXPECT_TRUE(closed_within_5s(p.theirs.get()));
}

TEST_F(IoPoolTest, ServeOnThisThreadRunsOneSessionToItsEnd) {
  Pair p = socket_pair();
  EchoSession session(std::move(p.ours), &record_, Clock::now() + 2s);
  std::thread server([&] { serve_on_this_thread(session); });
  EXPECT_TRUE(echoes(p.theirs.get(), "hello"));
  server.join();  // the deadline ends it
  EXPECT_EQ(record_.timeouts.load(), 1);
}

TEST_F(IoPoolTest, ThreadsDefaultToTheCoresWithinBounds) {
  EXPECT_EQ(io_threads_for(3), 3);
  const int automatic = io_threads_for(0);
  EXPECT_GE(automatic, 4);
  EXPECT_LE(automatic, 16);
}

}  // namespace
}  // namespace rdmabuf
