// Enforces the deadlines of transfers that nobody may be waiting on (those
// submitted with a completion callback), so that their callbacks fire on
// time even when no thread calls wait().
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "rdmabuf/backend.h"

namespace rdmabuf {

class DeadlineWatcher {
 public:
  DeadlineWatcher() = default;
  ~DeadlineWatcher() { stop(); }
  DeadlineWatcher(const DeadlineWatcher&) = delete;
  DeadlineWatcher& operator=(const DeadlineWatcher&) = delete;

  // Enforces `transfer`'s deadline when it comes, unless forget() came
  // first. Starts the watcher's thread on first use.
  void watch(const std::shared_ptr<TransferState>& transfer);
  // Stops watching `transfer` (it finished). Cheap; safe from any thread,
  // including from inside the transfer's own completion.
  void forget(const TransferState* transfer);
  // Joins the thread (on the thread itself, a callback: only ends it, and
  // the destructor joins it); deadlines still pending are no longer
  // enforced.
  void stop();

 private:
  using Key = std::pair<Deadline, const TransferState*>;
  void run();

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<Key, std::weak_ptr<TransferState>> pending_;
  std::thread thread_;
  bool stopping_ = false;
  // When the thread will wake next (max: not until notified). A new
  // deadline wakes it only when earlier; a transfer that finishes never
  // does, so a stream of transfers costs a wake-up per deadline period, not
  // per transfer.
  Deadline wakes_at_ = Deadline::max();
};

}  // namespace rdmabuf
