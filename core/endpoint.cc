// Endpoints (rdmabuf/endpoint.h): two-sided messages over a control
// connection, the bytes moved by one-sided writes into memory the receiver
// posted.
//
// The control connection carries frames: u32 payload length, u8 type, the
// payload (little-endian). After the greeting each side may send:
//   kPosted    u64 seq, u64 capacity, u16 n, n bytes of a RemoteBuffer:
//              the receiver posted a receive (a credit for one message).
//   kSent      u64 seq, u64 size: the message is in the buffer of `seq`.
//   kTooLarge  u64 seq, u64 size: the message does not fit `seq`; both fail.
//   kWithdrawn u64 seq: the receiver gave up on `seq` (its buffer is
//              released already); the sender answers kSent if the message
//              landed before that, or kNotTaken.
//   kNotTaken  u64 seq: nothing was written into `seq`.
// Each kPosted gets exactly one answer: kSent, kTooLarge or kNotTaken.
#include <poll.h>
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "common/wire.h"
#include "rdmabuf/endpoint.h"
#include "rdmabuf/manager.h"

namespace rdmabuf {
namespace {

constexpr uint32_t kMagic = 0x50454252;  // "RBEP"
constexpr uint16_t kVersion = 1;
constexpr uint32_t kMaxPayload = 4096;  // a handle is far smaller
constexpr size_t kHeaderSize = 5;
// How long a withdrawn receive waits for the sender's answer before the
// endpoint is closed (then nobody can tell whether the message landed).
constexpr auto kWithdrawGrace = std::chrono::seconds(5);
// A peer that does not read its control frames for this long is dropped.
constexpr auto kFrameWriteLimit = std::chrono::seconds(10);

enum class Frame : uint8_t {
  kHello = 1,
  kPosted = 2,
  kSent = 3,
  kTooLarge = 4,
  kWithdrawn = 5,
  kNotTaken = 6,
};

std::vector<uint8_t> frame(Frame type, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint32_t>(static_cast<uint32_t>(payload.size()));
  w.put<uint8_t>(static_cast<uint8_t>(type));
  w.bytes(payload.data(), payload.size());
  return out;
}

std::vector<uint8_t> seq_and(uint64_t seq, uint64_t value) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint64_t>(seq);
  w.put<uint64_t>(value);
  return out;
}

std::vector<uint8_t> hello_payload() {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint32_t>(kMagic);
  w.put<uint16_t>(kVersion);
  return out;
}

// Reads one frame before `deadline`.
Status read_frame(int fd, Deadline deadline, int stop_fd, Frame& type,
                  std::vector<uint8_t>& payload) {
  uint8_t header[kHeaderSize];
  RDMABUF_RETURN_IF_ERROR(recv_exact(fd, header, sizeof header, deadline, stop_fd));
  WireReader r(header);
  uint32_t size = r.get<uint32_t>();
  type = static_cast<Frame>(r.get<uint8_t>());
  if (size > kMaxPayload) {
    return ProtocolError("endpoint frame of " + std::to_string(size) + " bytes (at most " +
                         std::to_string(kMaxPayload) + ")");
  }
  payload.resize(size);
  return recv_exact(fd, payload.data(), size, deadline, stop_fd);
}

// Both sides send a hello and check the other's.
Status greet(int fd, Deadline deadline) {
  auto hello = frame(Frame::kHello, hello_payload());
  RDMABUF_RETURN_IF_ERROR(send_exact(fd, hello.data(), hello.size(), deadline));
  Frame type{};
  std::vector<uint8_t> payload;
  RDMABUF_RETURN_IF_ERROR(read_frame(fd, deadline, -1, type, payload));
  WireReader r(payload);
  uint32_t magic = r.get<uint32_t>();
  uint16_t version = r.get<uint16_t>();
  if (type != Frame::kHello || !r.ok() || r.remaining() != 0 || magic != kMagic) {
    return ProtocolError("the peer is not an rdmabuf endpoint");
  }
  if (version != kVersion) {
    return ProtocolError("endpoint protocol version " + std::to_string(version) +
                         " (this side speaks " + std::to_string(kVersion) + ")");
  }
  return Status::Ok();
}

Deadline deadline_after(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

}  // namespace

class EndpointImpl {
 public:
  EndpointImpl(Manager& manager, Fd fd, std::string peer, Fd stop)
      : manager_(manager), fd_(std::move(fd)), stop_(std::move(stop)), peer_(std::move(peer)) {
    reader_ = std::thread([this] { read_loop(); });
  }

  ~EndpointImpl() { close(Cancelled("the endpoint was closed")); }

  const std::string& peer() const { return peer_; }

  void close(const Status& why) {
    {
      std::lock_guard lock(mu_);
      if (broken_.ok()) broken_ = why;
    }
    signal_eventfd(stop_.get());
    ::shutdown(fd_.get(), SHUT_RDWR);  // the peer sees the end at once
    cv_.notify_all();
    std::lock_guard join(join_mu_);
    if (reader_.joinable()) reader_.join();
  }

  Status send(const LocalMemory& message, std::chrono::milliseconds timeout) {
    const Deadline deadline = deadline_after(timeout);
    while (true) {
      Credit credit;
      {
        std::unique_lock lock(mu_);
        if (!cv_.wait_until(lock, deadline, [&] { return !credits_.empty() || !broken_.ok(); })) {
          return DeadlineExceeded("the peer posted no receive in time");
        }
        if (!broken_.ok()) return broken_;
        credit = std::move(credits_.front());
        credits_.pop_front();
        in_send_[credit.seq] = false;  // taken, not withdrawn
      }
      if (message.size() > credit.capacity) {
        finish_send(credit.seq);
        RDMABUF_RETURN_IF_ERROR(write_frame(Frame::kTooLarge, seq_and(credit.seq, message.size())));
        return InvalidArgument("a message of " + std::to_string(message.size()) +
                               " bytes does not fit the receive the peer posted (" +
                               std::to_string(credit.capacity) + " bytes)");
      }
      Status wrote = Status::Ok();
      if (message.size() > 0) {
        auto target = credit.buffer.slice(0, message.size());
        wrote = target.ok() ? manager_.write_from(
                                  *target, message,
                                  std::max(std::chrono::milliseconds(1), remaining(deadline)))
                            : target.status();
      }
      const bool withdrawn = finish_send(credit.seq);
      if (wrote.ok()) {
        return write_frame(Frame::kSent, seq_and(credit.seq, message.size()));
      }
      // Nothing was delivered into `seq`: say so, so the receiver's answer
      // count stays right.
      RDMABUF_RETURN_IF_ERROR(write_frame(Frame::kNotTaken, seq_and(credit.seq, 0)));
      // A receive withdrawn meanwhile refuses the write (NotFound: its buffer
      // is released, perhaps before its withdrawal reached us): the message
      // goes to the next receive.
      if ((withdrawn || wrote.code() == StatusCode::kNotFound) && Clock::now() < deadline) {
        continue;
      }
      return wrote.with_context("writing the message into the peer's receive");
    }
  }

  Result<uint64_t> receive(const LocalMemory& into, std::chrono::milliseconds timeout) {
    const Deadline deadline = deadline_after(timeout);
    {
      std::lock_guard lock(mu_);
      if (!broken_.ok()) return broken_;
    }
    // An empty receive still needs a buffer to post: a byte of its own.
    LocalMemory target = into;
    if (into.size() == 0) {
      RDMABUF_ASSIGN_OR_RETURN(target, LocalMemory::allocate(1));
    }
    RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer handle, manager_.register_buffer(target));
    uint64_t seq;
    {
      std::lock_guard lock(mu_);
      seq = next_seq_++;
      waiting_[seq] = Answer{};
    }
    std::vector<uint8_t> payload = seq_and(seq, into.size());
    std::vector<uint8_t> bytes = handle.to_bytes();
    WireWriter w(payload);
    w.put<uint16_t>(static_cast<uint16_t>(bytes.size()));
    w.bytes(bytes.data(), bytes.size());
    Status posted = write_frame(Frame::kPosted, payload);

    Answer answer;
    {
      std::unique_lock lock(mu_);
      auto answered = [&] { return waiting_[seq].arrived || !broken_.ok(); };
      if (posted.ok() && !cv_.wait_until(lock, deadline, answered)) {
        lock.unlock();
        // Withdraw: no byte may land once we return. Release first (it waits
        // for a write in flight), then ask the sender what became of it.
        manager_.release(handle).ignore();
        Status withdrawn = write_frame(Frame::kWithdrawn, seq_and(seq, 0));
        lock.lock();
        if (withdrawn.ok() && !cv_.wait_until(lock, Clock::now() + kWithdrawGrace, answered)) {
          lock.unlock();
          close(DeadlineExceeded("the peer did not answer a withdrawn receive"));
          lock.lock();
        }
      }
      answer = waiting_[seq];
      waiting_.erase(seq);
      if (!answer.arrived) {
        answer.status = !posted.ok() ? posted : broken_;
        if (answer.status.ok()) answer.status = DeadlineExceeded("no message came in time");
      }
    }
    manager_.release(handle).ignore();  // NotFound when withdrawn above
    if (!answer.status.ok()) return answer.status;
    return answer.size;
  }

 private:
  struct Credit {
    uint64_t seq = 0;
    uint64_t capacity = 0;
    RemoteBuffer buffer;
  };
  // What the sender said about one of our receives.
  struct Answer {
    bool arrived = false;
    Status status;  // kSent: OK; kTooLarge: InvalidArgument; kNotTaken: DeadlineExceeded
    uint64_t size = 0;
  };

  static std::chrono::milliseconds remaining(Deadline deadline) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  }

  // Ends the use of a taken credit; true when the receiver withdrew it.
  bool finish_send(uint64_t seq) {
    std::lock_guard lock(mu_);
    auto it = in_send_.find(seq);
    bool withdrawn = it != in_send_.end() && it->second;
    in_send_.erase(it);
    return withdrawn;
  }

  Status write_frame(Frame type, const std::vector<uint8_t>& payload) {
    auto bytes = frame(type, payload);
    std::lock_guard lock(write_mu_);
    Status st = send_exact(fd_.get(), bytes.data(), bytes.size(), Clock::now() + kFrameWriteLimit,
                           stop_.get());
    if (!st.ok()) {
      std::lock_guard state(mu_);
      if (!broken_.ok()) return broken_;
      // A frame cut short leaves the stream unusable: close it for both.
      broken_ = Unavailable("the endpoint broke while sending: " + st.message());
      signal_eventfd(stop_.get());
      ::shutdown(fd_.get(), SHUT_RDWR);
      cv_.notify_all();
      return broken_;
    }
    return st;
  }

  void read_loop() {
    while (true) {
      Frame type{};
      std::vector<uint8_t> payload;
      Status st = read_frame(fd_.get(), Deadline::max(), stop_.get(), type, payload);
      if (st.ok()) st = dispatch(type, payload);
      if (!st.ok()) {
        if (st.code() != StatusCode::kProtocolError && st.code() != StatusCode::kCancelled) {
          st = Unavailable("the peer closed the endpoint (" + st.message() + ")");
        }
        {
          std::lock_guard lock(mu_);
          if (broken_.ok()) broken_ = st;
        }
        if (st.code() == StatusCode::kProtocolError) ::shutdown(fd_.get(), SHUT_RDWR);
        cv_.notify_all();
        return;
      }
    }
  }

  Status dispatch(Frame type, std::span<const uint8_t> payload) {
    WireReader r(payload);
    const uint64_t seq = r.get<uint64_t>();
    switch (type) {
      case Frame::kPosted: {
        const uint64_t capacity = r.get<uint64_t>();
        auto handle = r.view(r.get<uint16_t>());
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint credit");
        auto buffer = RemoteBuffer::from_bytes(handle);
        if (!buffer.ok()) {
          return ProtocolError("endpoint credit with a bad handle: " + buffer.status().message());
        }
        if (buffer->size() < capacity)
          return ProtocolError("endpoint credit larger than its buffer");
        std::lock_guard lock(mu_);
        credits_.push_back(Credit{seq, capacity, std::move(buffer).value()});
        break;
      }
      case Frame::kSent:
      case Frame::kTooLarge:
      case Frame::kNotTaken: {
        const uint64_t size = r.get<uint64_t>();
        if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed endpoint answer");
        std::lock_guard lock(mu_);
        auto it = waiting_.find(seq);
        if (it == waiting_.end() || it->second.arrived) {
          return ProtocolError("endpoint answer for receive " + std::to_string(seq) +
                               ", which is not waiting");
        }
        Answer& a = it->second;
        a.arrived = true;
        a.size = size;
        if (type == Frame::kSent) {
          a.status = Status::Ok();
        } else if (type == Frame::kTooLarge) {
          a.status = InvalidArgument("the peer's message of " + std::to_string(size) +
                                     " bytes does not fit this receive");
        } else {
          a.status = DeadlineExceeded("no message came in time");
        }
        break;
      }
      case Frame::kWithdrawn: {
        if (!r.ok() || r.remaining() != 8) return ProtocolError("malformed endpoint withdrawal");
        std::unique_lock lock(mu_);
        auto taken = in_send_.find(seq);
        if (taken != in_send_.end()) {
          taken->second = true;  // the send in progress answers when done
          break;
        }
        for (auto it = credits_.begin(); it != credits_.end(); ++it) {
          if (it->seq != seq) continue;
          credits_.erase(it);
          lock.unlock();
          return write_frame(Frame::kNotTaken, seq_and(seq, 0));
        }
        break;  // answered already (kSent or kTooLarge crossed the withdrawal)
      }
      default:
        return ProtocolError("unknown endpoint frame type " +
                             std::to_string(static_cast<int>(type)));
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Manager& manager_;
  Fd fd_;
  Fd stop_;  // readable once closing
  const std::string peer_;

  std::mutex mu_;
  std::condition_variable cv_;
  Status broken_;                       // OK while usable
  std::deque<Credit> credits_;          // the peer's receives, not yet taken
  std::map<uint64_t, bool> in_send_;    // taken credits: withdrawn meanwhile?
  std::map<uint64_t, Answer> waiting_;  // our posted receives
  uint64_t next_seq_ = 0;

  std::mutex write_mu_;  // one frame at a time on the socket
  std::mutex join_mu_;
  std::thread reader_;
};

// --- Endpoint -------------------------------------------------------------------

Endpoint::Endpoint(std::unique_ptr<EndpointImpl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() = default;

Status Endpoint::send(const LocalMemory& message, std::chrono::milliseconds timeout) {
  return impl_->send(message, timeout);
}

Result<uint64_t> Endpoint::receive(const LocalMemory& into, std::chrono::milliseconds timeout) {
  return impl_->receive(into, timeout);
}

std::string Endpoint::peer() const {
  return impl_->peer();
}

void Endpoint::close() {
  impl_->close(Cancelled("the endpoint was closed"));
}

// --- EndpointListener -------------------------------------------------------------

struct EndpointListener::State {
  Manager& manager;
  Fd fd;
  HostPort address;
};

EndpointListener::EndpointListener(std::unique_ptr<State> state) : state_(std::move(state)) {}
EndpointListener::~EndpointListener() = default;

std::string EndpointListener::address() const {
  return state_->address.to_string();
}

Result<std::unique_ptr<Endpoint>> EndpointListener::accept(std::chrono::milliseconds timeout) {
  const Deadline deadline = deadline_after(timeout);
  while (true) {
    RDMABUF_RETURN_IF_ERROR(wait_fd(state_->fd.get(), POLLIN, deadline));
    Fd fd(::accept4(state_->fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return Unavailable("accept: " + errno_text(errno));
    }
    RDMABUF_RETURN_IF_ERROR(greet(fd.get(), deadline));
    auto peer = peer_address(fd.get());
    RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
    return std::unique_ptr<Endpoint>(new Endpoint(std::make_unique<EndpointImpl>(
        state_->manager, std::move(fd), peer.ok() ? peer->to_string() : "?", std::move(stop))));
  }
}

// --- Manager's side -----------------------------------------------------------------

Result<std::unique_ptr<EndpointListener>> Manager::listen(const std::string& address) {
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(address));
  RDMABUF_ASSIGN_OR_RETURN(Fd fd, listen_tcp(where, 64));
  RDMABUF_ASSIGN_OR_RETURN(HostPort bound, local_address(fd.get()));
  return std::unique_ptr<EndpointListener>(
      new EndpointListener(std::make_unique<EndpointListener::State>(
          EndpointListener::State{*this, std::move(fd), std::move(bound)})));
}

Result<std::unique_ptr<Endpoint>> Manager::connect(const std::string& address,
                                                   std::chrono::milliseconds timeout) {
  const Deadline deadline = deadline_after(timeout);
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(address));
  RDMABUF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(where, deadline));
  RDMABUF_RETURN_IF_ERROR(greet(fd.get(), deadline));
  RDMABUF_ASSIGN_OR_RETURN(Fd stop, make_eventfd());
  return std::unique_ptr<Endpoint>(new Endpoint(
      std::make_unique<EndpointImpl>(*this, std::move(fd), where.to_string(), std::move(stop))));
}

}  // namespace rdmabuf
