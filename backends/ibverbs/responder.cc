#include "backends/ibverbs/responder.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/log.h"
#include "common/strings.h"

namespace rdmabuf::ibverbs {
namespace {

// How long a reader may take to ask for a queue pair, and to take an answer.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
constexpr auto kSendTimeout = std::chrono::seconds(10);
// The owner's side of a pair posts only window binds: a shallow send queue
// is enough.
constexpr uint32_t kResponderDepth = 16;

class Responder final : public IoSession {
 public:
  Responder(Fd fd, ResponderContext context)
      : context_(std::move(context)),
        fd_(std::move(fd)),
        request_deadline_(Clock::now() + kHandshakeTimeout) {}

  ~Responder() override {
    if (!qp_) return;
    context_.intake->remove(*qp_);
    context_.access->revoke_all(grants_);
    context_.counts->live--;
    // The pair goes here: the reader's next work request on it fails.
  }

  int fd() const override { return fd_.get(); }

  Wait on_ready() override {
    for (;;) {
      if (context_.stopping->load(std::memory_order_acquire)) return Wait::kClose;
      if (!flush()) return Wait::kClose;
      if (sent_ < out_.size()) return Wait::kWritable;
      if (state_ == State::kRefused) return Wait::kClose;  // the refusal is out
      const size_t need = state_ == State::kRequest ? kConnectBytes : kQueryBytes;
      const ssize_t n = ::recv(fd_.get(), in_ + have_, need - have_, MSG_DONTWAIT);
      if (n == 0) return Wait::kClose;  // the reader is done with the pair
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Wait::kReadable;
        return Wait::kClose;
      }
      have_ += static_cast<size_t>(n);
      if (have_ < need) continue;
      have_ = 0;
      const bool taken = state_ == State::kRequest ? take_request() : answer_query();
      if (!taken) return Wait::kClose;
    }
  }

  Deadline deadline() const override {
    if (sent_ < out_.size()) return send_deadline_;
    return state_ == State::kRequest ? request_deadline_ : Deadline::max();
  }

  Wait on_timeout() override {
    RDMABUF_LOG_DEBUG("ibverbs: dropping the handshake connection of manager " +
                      hex_id(context_.reader_id) + ": it sent or took nothing in time");
    return Wait::kClose;
  }

 private:
  enum class State { kRequest, kServing, kRefused };

  // Sends what is queued; false when the connection failed.
  bool flush() {
    while (sent_ < out_.size()) {
      const ssize_t n =
          ::send(fd_.get(), out_.data() + sent_, out_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    out_.clear();
    sent_ = 0;
    return true;
  }

  void queue(std::vector<uint8_t> bytes) {
    if (out_.empty()) send_deadline_ = Clock::now() + kSendTimeout;
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }

  // The reader's request (in_): answered with this side's end of the pair,
  // or why not. False when it is malformed (dropped without an answer).
  bool take_request() {
    auto request = parse_connect(std::span<const uint8_t, kConnectBytes>(in_, kConnectBytes));
    if (!request.ok()) {
      RDMABUF_LOG_DEBUG("ibverbs: dropping a handshake: " + request.status().message());
      return false;
    }
    Status refused = check_claim(request->claim);
    if (!refused.ok()) {
      RDMABUF_LOG_DEBUG("ibverbs: refused a queue pair to manager " + hex_id(context_.reader_id) +
                        ": " + refused.message());
    } else if (request->device != context_.device->name()) {
      refused = FailedPrecondition("this owner has no RDMA device '" + request->device +
                                   "' (it uses " + context_.device->name() + ")");
    } else {
      refused = create_pair(request->endpoint);
    }
    queue(encode_accepted(refused, qp_ && refused.ok() ? qp_->local() : Endpoint{}));
    if (!refused.ok()) {
      state_ = State::kRefused;
      return true;
    }
    context_.counts->handshakes++;
    state_ = State::kServing;
    return true;
  }

  // The pair, with every notice receive posted in the intake, connected to
  // the reader's `remote`.
  Status create_pair(const Endpoint& remote) {
    RDMABUF_ASSIGN_OR_RETURN(CqRoom room, context_.intake->reserve());
    QueuePair::Shape shape;
    shape.send_depth = kResponderDepth;
    shape.receive_depth = kNoticeReceives;
    RDMABUF_ASSIGN_OR_RETURN(auto qp, QueuePair::create(*context_.device, shape, std::move(room),
                                                        QueuePair::Shared::kReceives));
    RDMABUF_RETURN_IF_ERROR(context_.intake->add(*qp, context_.reader_id));
    qp_ = std::move(qp);
    context_.counts->live++;
    return qp_->connect(remote);
  }

  // Whether the owner has the buffer a handle claims: its id, token and
  // size (OK, or why not).
  Status check_claim(const HandleClaim& claim) {
    auto pinned = context_.resolver->pin(claim.id, claim.token, nullptr);
    if (!pinned.ok()) return pinned.status();
    if (pinned->size() != claim.region_size) {
      return InvalidArgument("the handle's buffer size does not match the owner's");
    }
    return Status::Ok();
  }

  // One request for access to a buffer (in_). Granted to a genuine handle
  // on a pair that works: the key that opens the buffer to this pair.
  bool answer_query() {
    auto query = parse_query(std::span<const uint8_t, kQueryBytes>(in_, kQueryBytes));
    if (!query.ok()) return false;
    BufferAnswer answer{query->id, StatusCode::kOk, 0};
    Status checked = check_claim(*query);
    if (checked.ok()) {
      auto key = context_.access->grant(query->id, *qp_, grants_);
      if (key.ok()) {
        answer.rkey = *key;
      } else {
        checked = key.status();
      }
    }
    answer.code = checked.code();
    queue(encode_answer(answer));
    return true;
  }

  const ResponderContext context_;
  Fd fd_;
  const Deadline request_deadline_;
  State state_ = State::kRequest;
  // The request or query being read, and how much of it has come.
  uint8_t in_[std::max(kConnectBytes, kQueryBytes)] = {};
  size_t have_ = 0;
  // Answers not yet sent, from sent_ on; due out by send_deadline_.
  std::vector<uint8_t> out_;
  size_t sent_ = 0;
  Deadline send_deadline_ = Deadline::max();
  std::unique_ptr<QueuePair> qp_;
  // The access this pair was granted: revoked before the pair goes.
  Grants grants_;
};

}  // namespace

std::unique_ptr<IoSession> open_responder(Fd fd, ResponderContext context) {
  return std::make_unique<Responder>(std::move(fd), std::move(context));
}

}  // namespace rdmabuf::ibverbs
