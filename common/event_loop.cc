#include "common/event_loop.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>

#include "common/log.h"

namespace rdmabuf {
namespace {

// Events taken from the kernel per epoll_wait.
constexpr int kEventsPerWait = 64;

// Set for the life of a loop's thread.
thread_local bool t_on_a_loop = false;

}  // namespace

Result<std::unique_ptr<EventLoop>> EventLoop::create(std::chrono::microseconds busy_poll) {
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return Internal("epoll_create1: " + errno_text(errno));
  RDMABUF_ASSIGN_OR_RETURN(Fd wake, make_eventfd());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake.get();
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) {
    return Internal("epoll_ctl: " + errno_text(errno));
  }
  std::unique_ptr<EventLoop> loop(new EventLoop(std::move(epoll), std::move(wake), busy_poll));
  loop->thread_ = std::thread([l = loop.get()] { l->run(); });
  return loop;
}

EventLoop::EventLoop(Fd epoll, Fd wake, std::chrono::microseconds busy_poll)
    : epoll_(std::move(epoll)), wake_(std::move(wake)), busy_poll_(busy_poll) {}

EventLoop::~EventLoop() {
  stop();
}

bool EventLoop::kick(std::shared_ptr<LoopTask> task) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (ended_) return false;  // nothing would run it
    kicked_.push_back(std::move(task));
    has_kicks_.store(true, std::memory_order_relaxed);
    wake = sleeping_.load(std::memory_order_seq_cst);
  }
  if (wake) signal_eventfd(wake_.get());
  return true;
}

void EventLoop::unwatch(int fd) {
  auto it = watched_.find(fd);
  if (it == watched_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  watched_.erase(it);
}

Status EventLoop::watch(const std::shared_ptr<LoopTask>& task, int fd, uint32_t events) {
  auto it = watched_.find(fd);
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (it == watched_.end()) {
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return ResourceExhausted("epoll_ctl: " + errno_text(errno));
    }
    watched_.emplace(fd, Watch{task, events});
    return Status::Ok();
  }
  if (it->second.events != events) {
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) {
      return ResourceExhausted("epoll_ctl: " + errno_text(errno));
    }
    it->second.events = events;
  }
  it->second.task = task;
  return Status::Ok();
}

void EventLoop::wake_at(const std::shared_ptr<LoopTask>& task, Deadline at) {
  auto it = timer_of_.find(task.get());
  if (it != timer_of_.end()) {
    if (it->second.first == at) return;
    timers_.erase({it->second.first, task.get()});
    timer_of_.erase(it);
  }
  if (at == Deadline::max()) return;
  timers_.emplace(at, task.get());
  timer_of_.emplace(task.get(), std::pair{at, task});
}

bool EventLoop::run_task(const std::shared_ptr<LoopTask>& task) {
  wake_at(task, Deadline::max());
  quiet_ = false;
  task->on_run(*this);
  return !quiet_;
}

bool EventLoop::run_kicked() {
  std::vector<std::shared_ptr<LoopTask>> kicked;
  {
    std::lock_guard lock(mu_);
    kicked.swap(kicked_);
    has_kicks_.store(false, std::memory_order_relaxed);
  }
  bool active = false;
  for (const auto& task : kicked)
    active |= run_task(task);
  return active;
}

bool EventLoop::run_timers() {
  bool ran = false;
  const Deadline now = Clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    std::shared_ptr<LoopTask> task = timer_of_.at(timers_.begin()->second).second;
    ran |= run_task(task);  // cancels the time first
  }
  return ran;
}

int EventLoop::sleep_ms() const {
  return poll_timeout_ms(timers_.empty() ? Deadline::max() : timers_.begin()->first);
}

bool EventLoop::on_a_loop_thread() {
  return t_on_a_loop;
}

void EventLoop::run() {
  pthread_setname_np(pthread_self(), "rdmabuf-loop");
  t_on_a_loop = true;
  Clock::time_point active = Clock::now();
  epoll_event events[kEventsPerWait];
  for (;;) {
    bool ran = run_kicked();
    ran |= run_timers();
    const Clock::time_point now = Clock::now();
    if (ran) active = now;
    const bool spinning = busy_poll_.count() > 0 && now - active < busy_poll_;
    int timeout = spinning ? 0 : sleep_ms();
    {
      std::lock_guard lock(mu_);
      if (stopping_ && kicked_.empty()) {
        ended_ = true;
        break;
      }
      if (!kicked_.empty()) timeout = 0;
      // Set under the lock: a kick after this sees it and signals.
      sleeping_.store(timeout != 0, std::memory_order_seq_cst);
    }
    const int n = ::epoll_wait(epoll_.get(), events, kEventsPerWait, timeout);
    sleeping_.store(false, std::memory_order_relaxed);
    if (n < 0 && errno != EINTR) {
      RDMABUF_LOG_ERROR("event loop: epoll_wait: " + errno_text(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no spin on a lasting error
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_.get()) {
        drain_eventfd(fd);
        continue;
      }
      auto it = watched_.find(fd);
      if (it == watched_.end()) continue;  // no longer watched by an earlier run of this batch
      std::shared_ptr<LoopTask> task = it->second.task;
      ready_fd_ = fd;
      if (run_task(task)) active = Clock::now();
      ready_fd_ = -1;
    }
    if (n == 0 && spinning && !has_kicks()) sched_yield();
  }
  // Lets go of the tasks still watched or timed here, on the loop's own
  // thread: a stop() from a task's run (which cannot join) ends them too.
  watched_.clear();
  timers_.clear();
  timer_of_.clear();
}

namespace {

// Tells drain() that the loop has run everything kicked before it.
class Barrier final : public LoopTask {
 public:
  void on_run(EventLoop&) override {
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace

void EventLoop::drain() {
  if (on_loop_thread()) return;
  auto barrier = std::make_shared<Barrier>();
  // Before the loop ends it runs every kicked task once more: this too.
  if (kick(barrier)) barrier->wait();
}

void EventLoop::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  signal_eventfd(wake_.get());
  // On the loop's own thread (a completion callback that shuts its manager
  // down): the loop ends after this run; it cannot be joined from inside.
  if (on_loop_thread()) return;
  if (thread_.joinable()) thread_.join();
}

Result<std::unique_ptr<EventLoops>> EventLoops::create(int threads,
                                                       std::chrono::microseconds busy_poll) {
  auto loops = std::make_unique<EventLoops>();
  for (int i = 0; i < std::max(threads, 1); ++i) {
    RDMABUF_ASSIGN_OR_RETURN(auto loop, EventLoop::create(busy_poll));
    loops->loops_.push_back(std::move(loop));
  }
  return loops;
}

EventLoop& EventLoops::next() {
  return *loops_[turn_.fetch_add(1, std::memory_order_relaxed) % loops_.size()];
}

void EventLoops::drain() {
  for (auto& loop : loops_)
    loop->drain();
}

void EventLoops::stop() {
  for (auto& loop : loops_)
    loop->stop();
}

Result<EventLoops*> SharedLoops::get() {
  std::lock_guard lock(mu_);
  if (stopped_) return Cancelled("the manager is shutting down");
  if (!loops_) {
    RDMABUF_ASSIGN_OR_RETURN(loops_, EventLoops::create(threads_, busy_poll_));
  }
  return loops_.get();
}

int SharedLoops::threads() const {
  std::lock_guard lock(mu_);
  return loops_ ? loops_->threads() : 0;
}

void SharedLoops::drain() {
  EventLoops* loops = nullptr;
  {
    std::lock_guard lock(mu_);
    loops = loops_.get();
  }
  if (loops) loops->drain();  // (made once; destroyed only with this)
}

void SharedLoops::stop() {
  EventLoops* loops = nullptr;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    loops = loops_.get();
  }
  if (loops) loops->stop();
}

}  // namespace rdmabuf
