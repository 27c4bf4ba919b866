// Completion queues shared by many queue pairs (SharedCq, and the room one
// pair takes on one, CqRoom). The reader's: every pair driven on one event
// loop reports its send completions into that loop's queues, and the
// loop's thread polls them all and hands each completion to its pair
// (LoopCompletions). The owner's pairs share theirs for their receives
// (notice_intake.h). Neither queues nor polling threads grow with the
// number of peers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backends/ibverbs/device.h"
#include "common/event_loop.h"

namespace rdmabuf::ibverbs {

// A completion channel; it outlives every queue that reports to it.
class CompletionChannel {
 public:
  // Its descriptor does not block.
  static Result<std::shared_ptr<CompletionChannel>> create(std::shared_ptr<const Device> device);
  CompletionChannel(std::shared_ptr<const Device> device, ibv_comp_channel* channel)
      : device_(std::move(device)), channel_(channel) {}
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;
  ibv_comp_channel* get() const { return channel_; }
  const Device& device() const { return *device_; }

 private:
  const std::shared_ptr<const Device> device_;
  ibv_comp_channel* const channel_;
};

// A completion queue for up to `capacity` queue pairs, each of which may
// owe it a known number of completions at once (a pair moved to error
// flushes all it holds); the queue has room for twice that, since a
// provider may leave a destroyed pair's completions in it until they are
// polled while the room is taken by the next pair. Its events go to one
// channel.
class SharedCq {
 public:
  // A queue of `cqe` entries reporting to `channel`, armed.
  static Result<std::shared_ptr<SharedCq>> create(std::shared_ptr<CompletionChannel> channel,
                                                  int cqe, uint32_t capacity);
  SharedCq(std::shared_ptr<CompletionChannel> channel, ibv_cq* cq, uint32_t capacity)
      : channel_(std::move(channel)), cq_(cq), capacity_(capacity) {}
  ~SharedCq();  // after every pair on it is gone
  SharedCq(const SharedCq&) = delete;
  SharedCq& operator=(const SharedCq&) = delete;

  ibv_cq* cq() const { return cq_; }
  // Takes room for one more pair; false when full, or failed.
  bool reserve();
  void release() { pairs_.fetch_sub(1, std::memory_order_acq_rel); }
  // Polling it failed (it overran, or the device did): no pair goes on it.
  void fail() { failed_.store(true, std::memory_order_relaxed); }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }

 private:
  const std::shared_ptr<CompletionChannel> channel_;
  ibv_cq* const cq_;
  const uint32_t capacity_;
  std::atomic<uint32_t> pairs_{0};
  std::atomic<bool> failed_{false};
};

// Room for one queue pair on a shared queue, given back when destroyed
// (after the pair: QueuePair holds it). Move-only.
class CqRoom {
 public:
  CqRoom() = default;
  explicit CqRoom(std::shared_ptr<SharedCq> cq) : cq_(std::move(cq)) {}
  CqRoom(CqRoom&& other) noexcept = default;
  CqRoom& operator=(CqRoom&& other) noexcept {
    if (this != &other) {
      if (cq_) cq_->release();
      cq_ = std::move(other.cq_);
    }
    return *this;
  }
  ~CqRoom() {
    if (cq_) cq_->release();
  }
  ibv_cq* cq() const { return cq_ ? cq_->cq() : nullptr; }
  explicit operator bool() const { return cq_ != nullptr; }

 private:
  std::shared_ptr<SharedCq> cq_;
};

// Shared completion queues on one channel, made as pairs need room: the
// first for `first_pairs` pairs, each further one for twice as many as the
// last, up to the device's limit on entries; each with room for twice what
// its pairs may owe at once (see SharedCq). So few pairs pin little memory,
// and many are polled in few queues. Not thread-safe: its owner's thread
// or lock (fd() and device() excepted: they never change).
class SharedCqs {
 public:
  // For pairs that may each owe `owed` completions at once.
  static Result<SharedCqs> create(std::shared_ptr<const Device> device, uint32_t owed,
                                  uint32_t first_pairs);

  // The channel's descriptor: readable once an armed queue has a completion.
  int fd() const { return channel_->get()->fd; }
  const Device& device() const { return channel_->device(); }
  // Queues made so far.
  size_t size() const { return queues_.size(); }
  // Room for one pair, on a new queue when every one is full or failed.
  Result<CqRoom> reserve();
  // Takes the channel's events, acknowledging each at once.
  void take_events() { device().lib().take_cq_events(channel_->get()); }
  // Arms every queue for its next completion (after take_events()).
  void arm();
  // Polls every queue until it is empty, handing each completion to
  // `take`. A queue whose poll fails (it overran, or the device failed) is
  // marked failed, and never polled again, and `failed` is told its
  // queue. How many completions were taken.
  template <typename Take, typename Failed>
  int poll(Take&& take, Failed&& failed);

 private:
  static constexpr int kPollBatch = 32;  // completions per ibv_poll_cq
  SharedCqs(std::shared_ptr<CompletionChannel> channel, int per_pair, int most_pairs,
            int first_pairs)
      : channel_(std::move(channel)),
        per_pair_(per_pair),
        most_pairs_(most_pairs),
        first_pairs_(first_pairs) {}
  void fail(SharedCq& queue);

  std::shared_ptr<CompletionChannel> channel_;
  int per_pair_;    // entries a pair takes in a queue
  int most_pairs_;  // on one queue, as the device allows
  int first_pairs_;
  std::vector<std::shared_ptr<SharedCq>> queues_;
};

template <typename Take, typename Failed>
int SharedCqs::poll(Take&& take, Failed&& failed) {
  int taken = 0;
  ibv_wc wc[kPollBatch];
  for (const auto& queue : queues_) {
    int n = 0;
    do {
      if (queue->failed()) break;
      n = ibv_poll_cq(queue->cq(), kPollBatch, wc);
      if (n < 0) {
        fail(*queue);
        failed(queue->cq());
        break;
      }
      for (int i = 0; i < n; ++i)
        take(wc[i]);
      taken += n;
    } while (n == kPollBatch);
  }
  return taken;
}

// Where a work request's id keeps its pair's generation
// (LoopCompletions::new_generation); the bits below count its requests.
constexpr int kGenerationShift = 40;

// What a queue pair's completions go to: its driver on the same loop.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // On the loop's thread, while attached. Takes the completion (keeps it
  // for its next run); must not poll.
  virtual void take_completion(const ibv_wc& wc) = 0;
  // The task to kick once completions were taken for it.
  virtual std::shared_ptr<LoopTask> sink_task() = 0;
  // On the loop's thread: polling the queue `cq` failed; a pair on it gets
  // no more completions.
  virtual void queue_failed(ibv_cq* cq) = 0;
};

// The completion queues of one event loop, polled by its thread: right
// after each run of a pair that has work in flight, in a busy loop for
// `busy_poll` after the last completion, and otherwise when the channel
// says a completion came (every queue is armed before the loop sleeps).
// The first queue has room for a few pairs, each further one for twice as
// many as the last (up to the device's limit), so that a loop with few
// pairs pins little memory and one with many polls few queues. A pair
// whose completions are found while the loop spins runs at once.
class LoopCompletions final : public LoopTask,
                              public std::enable_shared_from_this<LoopCompletions> {
 public:
  // `pair_depth`: the work requests each pair holds (their completions
  // must fit).
  static Result<std::shared_ptr<LoopCompletions>> create(std::shared_ptr<const Device> device,
                                                         EventLoop& loop, uint32_t pair_depth,
                                                         std::chrono::microseconds busy_poll);

  // The loop's thread only (as every call below). Room for one pair on a
  // queue of this loop's, making a new queue when every one is full.
  Result<CqRoom> reserve();

  // Completions of the pair numbered `qp_num` go to
  // `sink` from now until detach(), which must come before the pair is
  // destroyed; completions of a pair nobody is attached to are dropped.
  void attach(uint32_t qp_num, CompletionSink* sink);
  void detach(uint32_t qp_num);
  // Polls every queue now, handing each completion to its sink, and kicks
  // the sinks that got any other than `self` (which takes its own at once).
  // The number of completions taken.
  int poll(const CompletionSink* self) {
    const int taken = poll_queues(self);
    wake_sinks(/*run_now=*/false);
    return taken;
  }
  // A pair posted work: polling goes on, busy for the busy-poll window
  // from now, then armed, until it is done.
  void expect();
  // A number for a new pair, never the same as the last 2^24 pairs' of this
  // loop: its work requests carry it (kGenerationShift), so that a
  // completion of an earlier pair whose number the new one reuses is known.
  uint64_t new_generation() { return ++generations_ & 0xffffff; }

  // Any thread, for BackendInfo: queues made, and pairs attached now.
  int queues() const { return queue_count_.load(std::memory_order_relaxed); }
  int pairs() const { return pair_count_.load(std::memory_order_relaxed); }

  void on_run(EventLoop& loop) override;

 private:
  LoopCompletions(EventLoop& loop, SharedCqs cqs, std::chrono::microseconds busy_poll)
      : loop_(loop), busy_poll_(busy_poll), cqs_(std::move(cqs)) {}
  // Takes the completions of every queue to their sinks, noting in woken_
  // those other than `self` that got any.
  int poll_queues(const CompletionSink* self);
  // Runs (or kicks, to run later) the sinks in woken_.
  void wake_sinks(bool run_now);
  // Kicks this task unless a kick of it is queued.
  void kick_once(EventLoop& loop);

  EventLoop& loop_;
  const std::chrono::microseconds busy_poll_;
  std::atomic<int> queue_count_{0};
  std::atomic<int> pair_count_{0};

  // The loop's thread's own state.
  SharedCqs cqs_;
  bool watching_ = false;   // the channel's descriptor is watched
  bool scheduled_ = false;  // a kick of this task is queued
  Clock::time_point last_completion_{};
  std::unordered_map<uint32_t, CompletionSink*> sinks_;
  std::vector<CompletionSink*> woken_;  // scratch for poll()
  uint64_t generations_ = 0;
};

}  // namespace rdmabuf::ibverbs
