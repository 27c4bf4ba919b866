#include "common/io_pool.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/futex.h"
#include "common/log.h"

namespace rdmabuf {
namespace {

// epoll data of the pool's own descriptors; sessions' ids start at 1.
constexpr uint64_t kStopId = 0;
constexpr uint64_t kTimerId = ~uint64_t{0};

uint32_t events_for(IoSession::Wait wait) {
  // Not EPOLLRDHUP with EPOLLOUT: a peer that has shut its side down and
  // stopped reading would make the session ready again at every re-arm.
  // (EPOLLHUP and EPOLLERR come whatever is asked.)
  if (wait == IoSession::Wait::kWritable) return EPOLLONESHOT | EPOLLOUT;
  return EPOLLONESHOT | EPOLLIN | EPOLLRDHUP;
}

// The pool whose thread this is, if any, and whether this thread holds its
// spin token (see may_spin).
thread_local IoPool* this_threads_pool = nullptr;
thread_local bool this_thread_spins = false;

}  // namespace

int io_threads_for(int requested) {
  if (requested > 0) return requested;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 4, 16);
}

Result<std::unique_ptr<IoPool>> IoPool::create(int threads, std::chrono::microseconds busy_poll) {
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return Internal("epoll_create1: " + errno_text(errno));
  RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
  Fd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer.valid()) return Internal("timerfd_create: " + errno_text(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;  // level-triggered: every thread sees it
  ev.data.u64 = kStopId;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, stop.get(), &ev) != 0) {
    return Internal("epoll_ctl: " + errno_text(errno));
  }
  ev.data.u64 = kTimerId;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, timer.get(), &ev) != 0) {
    return Internal("epoll_ctl: " + errno_text(errno));
  }
  std::unique_ptr<IoPool> pool(
      new IoPool(std::move(epoll), std::move(stop), std::move(timer), busy_poll));
  for (int i = 0; i < std::max(threads, 1); ++i)
    pool->threads_.emplace_back([p = pool.get()] { p->run(); });
  return pool;
}

IoPool::IoPool(Fd epoll, Fd stop, Fd timer, std::chrono::microseconds busy_poll)
    : epoll_(std::move(epoll)),
      stop_(std::move(stop)),
      timer_(std::move(timer)),
      busy_poll_(busy_poll) {}

IoPool::~IoPool() {
  stop();
}

void IoPool::add(std::unique_ptr<IoSession> session) {
  auto entry = std::make_unique<Entry>();
  entry->session = std::move(session);
  entry->deadline = entry->session->deadline();
  std::lock_guard lock(mu_);
  if (stopped_) return;  // the session closes as `entry` goes
  const uint64_t id = next_id_++;
  Entry* e = entry.get();
  epoll_event ev{};
  ev.events = events_for(IoSession::Wait::kReadable);
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, e->session->fd(), &ev) != 0) {
    RDMABUF_LOG_WARN("io pool: cannot watch a connection: " + errno_text(errno));
    return;
  }
  e->parked = true;
  entries_.emplace(id, std::move(entry));
  count_.fetch_add(1, std::memory_order_relaxed);
  if (e->deadline < timer_at_) arm_timer_locked(e->deadline);
}

bool IoPool::may_spin() {
  IoPool* pool = this_threads_pool;
  if (pool == nullptr) return true;
  if (pool->waiting_.load(std::memory_order_relaxed) == 0) return false;
  return pool->take_spin_token();
}

bool IoPool::take_spin_token() {
  if (this_thread_spins) return true;
  int none = 0;
  this_thread_spins = spinners_.compare_exchange_strong(none, 1, std::memory_order_relaxed);
  return this_thread_spins;
}

void IoPool::drop_spin_token() {
  if (!this_thread_spins) return;
  this_thread_spins = false;
  spinners_.store(0, std::memory_order_relaxed);
}

void IoPool::run() {
  this_threads_pool = this;
  BusyPoll spin(busy_poll_);
  while (true) {
    epoll_event ev{};
    waiting_.fetch_add(1, std::memory_order_relaxed);
    // One thread at a time spins on the whole set for busy_poll after its
    // last event; the others sleep at once (spinners compete for the cores
    // with the threads doing the work).
    int n = ::epoll_wait(epoll_.get(), &ev, 1, 0);
    if (n == 0 && take_spin_token()) {
      while (n == 0 && spin.spin())
        n = ::epoll_wait(epoll_.get(), &ev, 1, 0);
    }
    if (n == 0) {
      drop_spin_token();
      n = ::epoll_wait(epoll_.get(), &ev, 1, -1);
    }
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    if (n < 0) {
      if (errno == EINTR) continue;
      RDMABUF_LOG_ERROR("io pool: epoll_wait failed: " + errno_text(errno));
      return;
    }
    if (n == 0) continue;
    const uint64_t id = ev.data.u64;
    if (id == kStopId) {
      if (stopping_.load(std::memory_order_acquire)) return;
      continue;
    }
    if (id == kTimerId) {
      run_timeouts();
      continue;
    }
    Entry* e = claim(id);
    if (e == nullptr) continue;
    settle(id, e, e->session->on_ready());
    drop_spin_token();
    spin.activity();
  }
}

IoPool::Entry* IoPool::claim(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second->parked) return nullptr;
  Entry* e = it->second.get();
  e->parked = false;
  if (e->idle) idle_lru_.erase(e->lru);
  return e;
}

void IoPool::settle(uint64_t id, Entry* entry, IoSession::Wait wait) {
  if (wait == IoSession::Wait::kClose) {
    remove(id, entry);
    return;
  }
  // Asked of the session before it is parked: once parked, another thread
  // may take it.
  const Deadline deadline = entry->session->deadline();
  const bool idle = entry->session->idle();
  std::lock_guard lock(mu_);
  entry->deadline = deadline;
  entry->idle = idle;
  park_locked(id, entry, wait);
}

void IoPool::park_locked(uint64_t id, Entry* entry, IoSession::Wait wait) {
  epoll_event ev{};
  ev.events = events_for(wait);
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, entry->session->fd(), &ev) != 0) {
    // Cannot happen for a socket the pool watches; run its timeout soon
    // rather than leave it unwatched.
    RDMABUF_LOG_ERROR("io pool: epoll_ctl failed: " + errno_text(errno));
    entry->deadline = Clock::now();
  }
  entry->parked = true;
  if (entry->idle) entry->lru = idle_lru_.insert(idle_lru_.end(), id);
  if (entry->deadline < timer_at_) arm_timer_locked(entry->deadline);
}

void IoPool::remove(uint64_t id, Entry* entry) {
  std::unique_ptr<Entry> gone;
  {
    std::lock_guard lock(mu_);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, entry->session->fd(), nullptr);
    auto it = entries_.find(id);
    gone = std::move(it->second);
    entries_.erase(it);
  }
  count_.fetch_sub(1, std::memory_order_relaxed);
  // `gone` closes the socket here, outside the lock.
}

size_t IoPool::idle_count() const {
  std::lock_guard lock(mu_);
  return idle_lru_.size();
}

bool IoPool::evict_idle() {
  // A session found busy after all goes back; a few more are tried.
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint64_t id = 0;
    Entry* e = nullptr;
    {
      std::lock_guard lock(mu_);
      if (idle_lru_.empty()) return false;
      id = idle_lru_.front();
      e = entries_.at(id).get();
      idle_lru_.pop_front();
      e->parked = false;
    }
    if (e->session->on_evict()) {
      remove(id, e);
      return true;
    }
    std::lock_guard lock(mu_);
    e->idle = false;
    park_locked(id, e, IoSession::Wait::kReadable);
  }
  return false;
}

void IoPool::arm_timer_locked(Deadline at) {
  timer_at_ = at;
  itimerspec spec{};
  if (at != Deadline::max()) {
    auto left = std::max<Clock::duration>(at - Clock::now(), std::chrono::microseconds(1));
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  }
  ::timerfd_settime(timer_.get(), 0, &spec, nullptr);
}

void IoPool::run_timeouts() {
  uint64_t expirations = 0;
  if (::read(timer_.get(), &expirations, sizeof expirations) < 0) return;  // another thread has it
  std::vector<std::pair<uint64_t, Entry*>> due;
  {
    std::lock_guard lock(mu_);
    const Deadline now = Clock::now();
    Deadline next = Deadline::max();
    for (auto& [id, entry] : entries_) {
      Entry* e = entry.get();
      if (!e->parked || e->deadline == Deadline::max()) continue;
      if (e->deadline > now) {
        next = std::min(next, e->deadline);
        continue;
      }
      e->parked = false;
      if (e->idle) idle_lru_.erase(e->lru);
      due.emplace_back(id, e);
    }
    arm_timer_locked(next);
  }
  for (auto& [id, e] : due)
    settle(id, e, e->session->on_timeout());
}

void IoPool::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true, std::memory_order_release);
  signal_eventfd(stop_.get());
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  std::unordered_map<uint64_t, std::unique_ptr<Entry>> all;
  {
    std::lock_guard lock(mu_);
    all.swap(entries_);
    idle_lru_.clear();
  }
  count_.store(0, std::memory_order_relaxed);
  all.clear();  // closes every session's socket
}

void serve_on_this_thread(IoSession& session, int stop_fd) {
  IoSession::Wait wait = session.on_ready();
  while (wait != IoSession::Wait::kClose) {
    const short events = wait == IoSession::Wait::kWritable ? POLLOUT : POLLIN;
    pollfd fds[2] = {{session.fd(), events, 0}, {stop_fd, POLLIN, 0}};
    int rc = ::poll(fds, stop_fd >= 0 ? 2 : 1, poll_timeout_ms(session.deadline()));
    if (rc < 0 && errno != EINTR) return;
    if (stop_fd >= 0 && fds[1].revents) return;
    if (rc == 0) {
      wait = session.on_timeout();
    } else if (rc > 0) {
      wait = session.on_ready();
    }
  }
}

}  // namespace rdmabuf
