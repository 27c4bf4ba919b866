#include "common/worker_pool.h"

#include <pthread.h>

#include <system_error>
#include <utility>

namespace rdmabuf {

WorkerPool::WorkerPool(std::string thread_name, int most_threads,
                       std::chrono::milliseconds idle_end)
    : thread_name_(std::move(thread_name)),
      most_threads_(most_threads < 1 ? 1 : most_threads),
      idle_end_(idle_end) {}

WorkerPool::~WorkerPool() {
  stop();
}

bool WorkerPool::run(std::function<void()> job) {
  std::vector<std::thread> ended;
  const bool taken = queue(std::move(job), ended);
  join(std::move(ended));
  return taken;
}

bool WorkerPool::queue(std::function<void()> job, std::vector<std::thread>& ended) {
  std::lock_guard lock(mu_);
  ended.swap(ended_);
  if (stopping_) return false;
  jobs_.push_back(std::move(job));
  // A thread with no job takes it (an idle one, woken, or one back from
  // its last job, which looks before it sleeps), unless the jobs queued
  // already use them all.
  if (jobs_.size() <= running_.size() - static_cast<size_t>(busy_)) {
    has_job_.notify_one();
    return true;
  }
  if (static_cast<int>(running_.size()) < most_threads_) {
    std::thread t;
    try {
      t = std::thread([this] { work(); });
    } catch (const std::system_error&) {   // out of threads (EAGAIN)
      if (!running_.empty()) return true;  // a busy thread takes it later
      jobs_.pop_back();
      return false;
    }
    // Named here, so that it has its name before the job runs.
    pthread_setname_np(t.native_handle(), thread_name_.substr(0, 15).c_str());
    const std::thread::id id = t.get_id();
    running_.emplace(id, std::move(t));
  }
  return true;  // a busy thread takes it next
}

int WorkerPool::threads() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(running_.size());
}

int WorkerPool::busy_threads() const {
  std::lock_guard lock(mu_);
  return busy_;
}

void WorkerPool::stop() {
  std::vector<std::thread> ended;
  {
    std::unique_lock lock(mu_);
    stopping_ = true;
    has_job_.notify_all();
    all_ended_.wait(lock, [&] { return running_.empty(); });
    ended.swap(ended_);
  }
  join(std::move(ended));
}

void WorkerPool::join(std::vector<std::thread> ended) {
  for (std::thread& t : ended)
    t.join();
}

void WorkerPool::work() {
  std::unique_lock lock(mu_);
  while (true) {
    if (!jobs_.empty()) {
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_;
      lock.unlock();
      job();
      job = nullptr;  // what it holds goes before the pool's lock is taken
      lock.lock();
      --busy_;
      continue;
    }
    if (stopping_) break;
    const bool woken =
        has_job_.wait_for(lock, idle_end_, [&] { return !jobs_.empty() || stopping_; });
    if (!woken) break;  // idle for idle_end_
  }
  // (running_ holds this thread until now: run() may start none meanwhile
  // while the queued jobs wait for it.)
  auto self = running_.find(std::this_thread::get_id());
  ended_.push_back(std::move(self->second));
  running_.erase(self);
  if (running_.empty()) all_ended_.notify_all();
}

}  // namespace rdmabuf
