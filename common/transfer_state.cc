// TransferState (the completion and cancellation protocol shared by the
// manager, the backends and Transfer) and the Transfer handle over it.
#include <sched.h>

#include <string>

#include "common/futex.h"
#include "common/io_pool.h"
#include "common/op_text.h"
#include "rdmabuf/backend.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

namespace {
// The transfer whose on_finish runs on this thread, if any.
thread_local const TransferState* t_running_on_finish = nullptr;
}  // namespace

struct TransferState::OpState {
  std::atomic<uint32_t> parts_left{1};
  std::atomic<bool> part_reported{false};
  // 0: no error recorded; 1: an error is being written; 2: `status` is final.
  std::atomic<uint8_t> status_state{0};
  Status status;
  std::string_view backend;  // a backend's name: a string literal
  std::string note;
  bool has_notice = false;  // set before any backend sees the op
  WriteNotice notice;
  std::atomic<bool> notice_sent{false};
};

TransferState::TransferState(std::vector<Op> ops, std::chrono::milliseconds timeout,
                             std::chrono::microseconds busy_poll)
    : ops_(std::move(ops)),
      op_count_(ops_.size()),
      states_(new OpState[ops_.size()]),
      deadline_(deadline_after(timeout)),
      busy_poll_(busy_poll),
      timeout_(timeout),
      ops_left_(ops_.size()) {
  if (op_count_ == 0) finished_.store(1);
}

TransferState::~TransferState() = default;

void TransferState::expect_parts(size_t index, uint32_t parts) {
  states_[index].parts_left.store(parts, std::memory_order_relaxed);
}

void TransferState::record_error(size_t index, const Status& status) {
  OpState& s = states_[index];
  uint8_t expected = 0;
  if (s.status_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    s.status = status;
    s.status_state.store(2, std::memory_order_release);
  }
}

void TransferState::complete_part(size_t index, const Status& status) {
  states_[index].part_reported.store(true, std::memory_order_relaxed);
  if (!status.ok()) record_error(index, status);
  if (states_[index].parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_op();
}

void TransferState::fail_op(size_t index, const Status& status) {
  record_error(index, status);
  states_[index].parts_left.store(0, std::memory_order_release);
  finish_op();
}

bool TransferState::no_part_reported(size_t index) const {
  const OpState& s = states_[index];
  return !s.part_reported.load(std::memory_order_relaxed) &&
         s.status_state.load(std::memory_order_acquire) == 0;
}

void TransferState::set_notice(size_t index, const WriteNotice& notice) {
  states_[index].has_notice = true;
  states_[index].notice = notice;
}

const WriteNotice* TransferState::notice(size_t index) const {
  return states_[index].has_notice ? &states_[index].notice : nullptr;
}

void TransferState::mark_notice_sent(size_t index) {
  states_[index].notice_sent.store(true, std::memory_order_relaxed);
}

bool TransferState::notice_sent(size_t index) const {
  // Read after the op finished: the finish's acquire orders it.
  return states_[index].notice_sent.load(std::memory_order_relaxed);
}

void TransferState::finish_op() {
  if (ops_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) publish();
}

void TransferState::publish() {
  if (finished_.exchange(1, std::memory_order_seq_cst) == 0) {
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(finished_);
    // Only this thread gets here, once: the exchange above decided it.
    if (on_finish_) {
      auto on_finish = std::move(on_finish_);
      on_finish_ = nullptr;
      const TransferState* outer = t_running_on_finish;
      t_running_on_finish = this;
      on_finish();
      t_running_on_finish = outer;
      on_finish_state_.store(2, std::memory_order_release);
    }
  }
}

void TransferState::set_on_finish(std::function<void()> on_finish) {
  if (finished()) {
    if (on_finish) on_finish();
    return;
  }
  on_finish_ = std::move(on_finish);
  // Pending from now on: once finished() is true, a waiter in
  // await_on_finish() waits until the publishing thread has run it.
  if (on_finish_) on_finish_state_.store(1, std::memory_order_release);
}

void TransferState::set_route(size_t index, std::string_view backend, const std::string& note) {
  states_[index].backend = backend;
  if (!note.empty()) states_[index].note = note;
}

bool TransferState::wait_until(Deadline until) {
  if (finished()) return true;  // an op copied inside submit(): no clock read
  BusyPoll poll(busy_poll_);
  while (!finished()) {
    if (Clock::now() >= until) return finished();
    if (poll.spin()) continue;
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (!finished_.load(std::memory_order_seq_cst)) futex_wait_until(finished_, 0, until);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
  return true;
}

void TransferState::cancel(StatusCode code, std::string_view why) {
  if (finished()) return;
  // Claim the status of every unfinished op first: once the cancelled bit is
  // set, backends report parts of this transfer with statuses of their own
  // ("cancelled before it was sent"), and those must not win.
  for (size_t i = 0; i < op_count_; ++i) {
    if (states_[i].parts_left.load(std::memory_order_acquire) > 0) {
      record_error(i, Status(code, describe_op(ops_[i]) + ": " + std::string(why)));
    }
  }
  guard_.fetch_or(kCancelledBit, std::memory_order_acq_rel);
  // Backends touch local memory only inside a begin/end_touch bracket, and
  // each bracket is one non-blocking syscall or memcpy, so this is short.
  while (guard_.load(std::memory_order_acquire) & ~kCancelledBit) {
    sched_yield();
  }
  for (size_t i = 0; i < op_count_; ++i) {
    // Another thread may be writing this op's error; let it finish so that
    // readers woken by publish() see a complete status.
    while (states_[i].status_state.load(std::memory_order_acquire) == 1) {
      sched_yield();
    }
  }
  publish();
}

void TransferState::await_on_finish() const {
  if (t_running_on_finish == this) return;  // called from inside it
  // on_finish is short by contract; yield until it has returned.
  while (on_finish_state_.load(std::memory_order_acquire) == 1)
    sched_yield();
}

bool TransferState::enforce_deadline() {
  if (finished()) return true;
  if (Clock::now() < deadline_) return false;
  cancel(StatusCode::kDeadlineExceeded,
         "did not finish within the timeout of " + std::to_string(timeout_.count()) + " ms");
  return true;
}

Status TransferState::op_status(size_t index) const {
  if (!finished()) return FailedPrecondition("transfer still in flight");
  const OpState& s = states_[index];
  if (s.status_state.load(std::memory_order_acquire) == 2) return s.status;
  return Status::Ok();
}

Status TransferState::status() const {
  if (!finished()) return FailedPrecondition("transfer still in flight");
  for (size_t i = 0; i < op_count_; ++i) {
    Status s = op_status(i);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

std::string_view TransferState::op_backend(size_t index) const {
  return states_[index].backend;
}
std::string TransferState::op_note(size_t index) const {
  return states_[index].note;
}

// --- Transfer ---------------------------------------------------------------

Transfer::Transfer(std::shared_ptr<TransferState> state) : state_(std::move(state)) {}
Transfer::Transfer(Transfer&&) noexcept = default;

Transfer& Transfer::operator=(Transfer&& other) noexcept {
  if (this != &other) {
    if (state_) {
      state_->cancel(StatusCode::kCancelled, "transfer replaced before it finished");
      state_->await_on_finish();
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

Transfer::~Transfer() {
  if (!state_) return;
  state_->cancel(StatusCode::kCancelled, "transfer destroyed before it finished");
  state_->await_on_finish();
}

Status Transfer::wait() {
  if (!state_) return Status::Ok();
  state_->wait_until(state_->deadline());
  state_->enforce_deadline();
  state_->await_on_finish();
  return state_->status();
}

bool Transfer::wait_until(Deadline until) {
  if (!state_) return true;
  until = std::min(state_->deadline(), until);
  if (state_->wait_until(until)) return true;
  return state_->enforce_deadline();
}

bool Transfer::done() const {
  return !state_ || state_->enforce_deadline();
}

void Transfer::cancel() {
  if (!state_) return;
  state_->cancel(StatusCode::kCancelled, "cancelled by the caller");
  state_->await_on_finish();
}

Status Transfer::status() const {
  return state_ ? state_->status() : Status::Ok();
}
size_t Transfer::op_count() const {
  return state_ ? state_->op_count() : 0;
}

Status Transfer::op_status(size_t index) const {
  if (!state_ || index >= state_->op_count()) {
    return InvalidArgument("op index " + std::to_string(index) + " out of range");
  }
  return state_->op_status(index);
}

std::string_view Transfer::op_backend(size_t index) const {
  if (!state_ || index >= state_->op_count()) return {};
  return state_->op_backend(index);
}

std::string Transfer::op_note(size_t index) const {
  if (!state_ || index >= state_->op_count()) return {};
  return state_->op_note(index);
}

// --- Backend defaults ---------------------------------------------------------

std::unique_ptr<IoSession> Backend::open_session(int /*fd*/, uint64_t /*peer_manager_id*/) {
  return nullptr;
}

Status Backend::takes_local_memory(const LocalMemory& local, const RemoteBuffer& /*remote*/) const {
  if (!local.on_gpu()) return Status::Ok();
  return FailedPrecondition(std::string(name()) + " moves host memory only");
}

Status Backend::can_apply_atomics(const RemoteBuffer& /*remote*/) const {
  return FailedPrecondition("it does not carry atomics");
}

Result<std::unique_ptr<MessageChannel>> Backend::open_message_channel() {
  return FailedPrecondition("the " + std::string(name()) + " backend carries no messages");
}

const char* transport_level_name(TransportLevel level) {
  switch (level) {
    case TransportLevel::kTcp:
      return "tcp";
    case TransportLevel::kNic:
      return "nic";
    case TransportLevel::kMemory:
      return "memory";
  }
  return "?";
}

}  // namespace rdmabuf
