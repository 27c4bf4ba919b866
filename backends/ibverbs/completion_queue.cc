#include "backends/ibverbs/completion_queue.h"

#include <fcntl.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"

namespace rdmabuf::ibverbs {
namespace {

// The most entries one shared queue has, whatever the device allows beyond.
constexpr int kMaxCqe = 65536;
// Pairs the first queue of a loop has room for.
constexpr uint32_t kFirstPairs = 4;
// The longest the loop polls in one run while it spins, before it looks
// at its other tasks' descriptors.
constexpr auto kSpinSlice = std::chrono::microseconds(50);

}  // namespace

Result<std::shared_ptr<CompletionChannel>> CompletionChannel::create(
    std::shared_ptr<const Device> device) {
  const IbvLib& lib = device->lib();
  ibv_comp_channel* channel = lib.create_comp_channel(device->context());
  if (!channel)
    return ResourceExhausted("cannot create a completion channel: " + errno_text(errno));
  auto owned = std::make_shared<CompletionChannel>(std::move(device), channel);
  const int flags = ::fcntl(channel->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Internal("fcntl: " + errno_text(errno));
  }
  return owned;
}

CompletionChannel::~CompletionChannel() {
  device_->lib().destroy_comp_channel(channel_);
}

Result<std::shared_ptr<SharedCq>> SharedCq::create(std::shared_ptr<CompletionChannel> channel,
                                                   int cqe, uint32_t capacity) {
  const Device& device = channel->device();
  ibv_cq* cq = device.lib().create_cq(device.context(), cqe, nullptr, channel->get(), 0);
  if (!cq) return ResourceExhausted("cannot create a completion queue: " + errno_text(errno));
  auto shared = std::make_shared<SharedCq>(std::move(channel), cq, capacity);
  if (ibv_req_notify_cq(cq, 0) != 0) {
    return Internal("cannot arm a completion queue's events");
  }
  return shared;
}

SharedCq::~SharedCq() {
  // Every event got from the channel was acknowledged at once
  // (SharedCqs::take_events()), so this does not wait.
  channel_->device().lib().destroy_cq(cq_);
}

bool SharedCq::reserve() {
  if (failed()) return false;
  uint32_t pairs = pairs_.load(std::memory_order_relaxed);
  while (pairs < capacity_) {
    if (pairs_.compare_exchange_weak(pairs, pairs + 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

Result<SharedCqs> SharedCqs::create(std::shared_ptr<const Device> device, uint32_t owed,
                                    uint32_t first_pairs) {
  const int cqe = std::min(device->attr().max_cqe, kMaxCqe);
  // What a pair may owe, plus one (the queue's own spare, as queue_pair.cc
  // sizes private queues), twice over.
  const int per_pair = 2 * (static_cast<int>(owed) + 1);
  if (cqe < per_pair) {
    return ResourceExhausted("the device's completion queues hold " + std::to_string(cqe) +
                             " entries, fewer than one queue pair's " + std::to_string(per_pair));
  }
  RDMABUF_ASSIGN_OR_RETURN(auto channel, CompletionChannel::create(std::move(device)));
  return SharedCqs(std::move(channel), per_pair, cqe / per_pair, static_cast<int>(first_pairs));
}

Result<CqRoom> SharedCqs::reserve() {
  for (const auto& queue : queues_) {
    if (queue->reserve()) return CqRoom(queue);
  }
  const int pairs = std::min(most_pairs_, first_pairs_ << std::min<size_t>(queues_.size(), 20));
  RDMABUF_ASSIGN_OR_RETURN(
      auto queue, SharedCq::create(channel_, pairs * per_pair_, static_cast<uint32_t>(pairs)));
  queues_.push_back(queue);
  if (!queue->reserve()) return Internal("a new completion queue has no room");
  return CqRoom(std::move(queue));
}

void SharedCqs::arm() {
  for (const auto& queue : queues_) {
    if (queue->failed()) continue;
    if (ibv_req_notify_cq(queue->cq(), 0) != 0) {
      RDMABUF_LOG_ERROR("ibverbs: cannot arm a shared completion queue's events");
    }
  }
}

void SharedCqs::fail(SharedCq& queue) {
  RDMABUF_LOG_ERROR("ibverbs: ibv_poll_cq failed on a shared completion queue");
  queue.fail();
}

Result<std::shared_ptr<LoopCompletions>> LoopCompletions::create(
    std::shared_ptr<const Device> device, EventLoop& loop, uint32_t pair_depth,
    std::chrono::microseconds busy_poll) {
  // A pair owes at most its depth of completions.
  RDMABUF_ASSIGN_OR_RETURN(auto cqs, SharedCqs::create(std::move(device), pair_depth, kFirstPairs));
  std::shared_ptr<LoopCompletions> completions(
      new LoopCompletions(loop, std::move(cqs), busy_poll));
  completions->scheduled_ = true;  // its first run watches the channel
  loop.kick(completions);
  return completions;
}

Result<CqRoom> LoopCompletions::reserve() {
  const size_t made = cqs_.size();
  RDMABUF_ASSIGN_OR_RETURN(CqRoom room, cqs_.reserve());
  if (cqs_.size() != made) queue_count_.fetch_add(1, std::memory_order_relaxed);
  return room;
}

void LoopCompletions::attach(uint32_t qp_num, CompletionSink* sink) {
  if (sinks_.insert_or_assign(qp_num, sink).second) pair_count_.fetch_add(1);
}

void LoopCompletions::detach(uint32_t qp_num) {
  if (sinks_.erase(qp_num) > 0) pair_count_.fetch_sub(1);
}

int LoopCompletions::poll_queues(const CompletionSink* self) {
  const int taken = cqs_.poll(
      [&](const ibv_wc& wc) {
        auto it = sinks_.find(wc.qp_num);
        if (it == sinks_.end()) return;  // a pair destroyed without draining
        CompletionSink* sink = it->second;
        sink->take_completion(wc);
        if (sink != self && std::find(woken_.begin(), woken_.end(), sink) == woken_.end())
          woken_.push_back(sink);
      },
      [&](ibv_cq* failed) {
        // Its pairs get no more completions, so each resets (without a
        // drain) and goes again on a pair on another queue.
        for (const auto& [qp_num, sink] : sinks_)
          sink->queue_failed(failed);
      });
  if (taken > 0) last_completion_ = Clock::now();
  return taken;
}

void LoopCompletions::wake_sinks(bool run_now) {
  std::vector<CompletionSink*> woken;
  woken.swap(woken_);  // a sink's run may poll, and wake others
  for (CompletionSink* sink : woken) {
    if (run_now) {
      sink->sink_task()->on_run(loop_);
    } else {
      loop_.kick(sink->sink_task());
    }
  }
}

void LoopCompletions::expect() {
  last_completion_ = Clock::now();  // a busy window from now
  kick_once(loop_);
}

void LoopCompletions::on_run(EventLoop& loop) {
  // Run for the channel's descriptor, a queued kick stays queued.
  if (loop.ready_fd() != cqs_.fd()) scheduled_ = false;
  if (!watching_) {
    Status watched = loop.watch(shared_from_this(), cqs_.fd(), EPOLLIN);
    if (!watched.ok()) RDMABUF_LOG_ERROR("ibverbs: " + watched.message());
    watching_ = watched.ok();
  }
  // The events are taken at every run, so that the descriptor does not stay
  // readable (and run this again) while the loop spins; the queues are
  // armed again only before it sleeps.
  cqs_.take_events();
  // Busy: polled in a tight loop for a slice (yielding the CPU between
  // polls), until completions come or other tasks are kicked; the pairs
  // whose completions came run at once (this is the loop's thread, and no
  // pair is running).
  const Clock::time_point slice_end = Clock::now() + kSpinSlice;
  for (;;) {
    if (poll_queues(nullptr) > 0) {
      wake_sinks(/*run_now=*/true);
      break;
    }
    const Clock::time_point now = Clock::now();
    if (now - last_completion_ >= busy_poll_ || now >= slice_end || loop.has_kicks()) break;
    sched_yield();
  }
  if (Clock::now() - last_completion_ < busy_poll_) {  // busy: again after the loop's other tasks
    kick_once(loop);
    return;
  }
  // Quiet: armed before sleeping, then polled once more for what came
  // between the last poll and the arming (it raises no event).
  cqs_.take_events();
  cqs_.arm();
  if (poll_queues(nullptr) > 0) {
    wake_sinks(/*run_now=*/true);
    kick_once(loop);
  }
}

void LoopCompletions::kick_once(EventLoop& loop) {
  if (scheduled_) return;
  scheduled_ = true;
  loop.kick(shared_from_this());
}

}  // namespace rdmabuf::ibverbs
