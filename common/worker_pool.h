// Threads for short jobs that may block (user code such as a notification
// handler, a write waiting for its peer to read): a thread starts when a
// job finds none free, up to a limit, and ends after a while idle. So the
// threads follow the jobs under way, not the number of things that may
// make one: many idle endpoints cost none. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rdmabuf {

class WorkerPool {
 public:
  // Threads named `thread_name` (at most 15 characters), `most_threads` at
  // once (>= 1): beyond it jobs wait their turn, oldest first. A thread
  // with no job for `idle_end` ends.
  WorkerPool(std::string thread_name, int most_threads, std::chrono::milliseconds idle_end);
  ~WorkerPool();  // stop()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `job` on a pool thread soon; false, and never runs it, once
  // stopped, or when no thread runs and none can start (the process is out
  // of threads).
  bool run(std::function<void()> job);
  // Threads running now, busy or idle; of them, those running a job.
  int threads() const;
  int busy_threads() const;
  // Runs the jobs queued already, waits for those under way, and joins
  // every thread; run() fails from now on. Not from a job.
  void stop();

 private:
  // run() under mu_: queues `job` and starts a thread if none is free;
  // hands over the threads that ended, to join once mu_ is free.
  bool queue(std::function<void()> job, std::vector<std::thread>& ended);
  void work();
  // Joins `ended` (threads taken from ended_; mu_ not held).
  static void join(std::vector<std::thread> ended);

  const std::string thread_name_;
  const int most_threads_;
  const std::chrono::milliseconds idle_end_;

  mutable std::mutex mu_;              // guards everything below
  std::condition_variable has_job_;    // jobs_ is not empty, or stopping_
  std::condition_variable all_ended_;  // running_ became empty (stop() waits for it)
  std::deque<std::function<void()>> jobs_;
  std::unordered_map<std::thread::id, std::thread> running_;  // by the thread's own id
  std::vector<std::thread> ended_;  // left work(): for whoever comes next to join
  int busy_ = 0;                    // threads running a job
  bool stopping_ = false;
};

}  // namespace rdmabuf
