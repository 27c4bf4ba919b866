// An endpoint's handshake over its new TCP connection: both sides send a
// hello (kHello), then the connecting side offers the channels its frames
// may take instead of the connection (kChannelOffer) and the accepting side
// answers with the one it took (kChannelAnswer). The channels, in the order
// both prefer them: shared-memory rings between two managers on one host
// (when both have a viable same-host backend), an RDMA backend's
// SEND/RECV (when both have a viable RDMA backend), the TCP connection.
// Over RDMA the two then swap their channels' addresses (kChannelReady
// each way) and the accepting side reads through the channel once before
// it trusts it.
//
// The connecting side runs its half in one call (connect_endpoint). The
// accepting side runs each accepted connection's half as a state machine
// (AcceptingHandshake), one step per frame, so that the listener serves
// many handshakes at once and a slow peer holds up none of the others.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/socket.h"
#include "core/endpoint/endpoint_host.h"
#include "core/endpoint/frames.h"
#include "core/endpoint/shm_channel.h"

namespace rdmabuf::endpoint {

// How long an accepted connection may take over its handshake, so that a
// silent client cannot hold accept() for the caller's whole timeout.
constexpr auto kHandshakeLimit = std::chrono::seconds(5);

// The channel a handshake settled on, and why not a better one.
struct ChannelChoice {
  std::unique_ptr<ShmChannel> shm;       // shared-memory rings
  std::unique_ptr<MessageChannel> rdma;  // an RDMA backend's SEND/RECV
  std::string description;               // Endpoint::channel()
};

// This side's hello: its manager, and a fresh notice key.
Hello my_hello(EndpointHost& host);
Status send_hello(int fd, const Hello& mine, Deadline deadline, int stop_fd = -1);
Result<Hello> read_hello(int fd, Deadline deadline, int stop_fd = -1);

// The connecting side, after the hellos: offers the channels this manager
// may use and takes the one the peer chose (connecting an RDMA channel's
// queue pair when that is the one).
Result<ChannelChoice> offer_channels(int fd, EndpointHost& host, Deadline deadline);

// The accepting side: one accepted connection, from its first byte to the
// channel settled (or the connection dropped).
class AcceptingHandshake {
 public:
  enum class State {
    kHello,   // this side's hello sent; the peer's comes next
    kOffer,   // the peer's hello read; its channel offer comes next
    kReady,   // RDMA taken: the peer's kChannelReady comes next
    kProbe,   // this side's read through the RDMA channel is out: its answer decides
    kSettled  // the channel is settled: the endpoint can be made
  };

  // Sends this side's hello on `fd`, a connection accepted just now from
  // `peer` (its address, for warnings and Endpoint::peer()).
  static Result<AcceptingHandshake> start(Fd fd, std::string peer, EndpointHost& host, int stop_fd);

  // Every step of the handshake: what the connection's bytes (when
  // `readable`) or the clock (`now`) move it to. kCancelled when `stop_fd`
  // fired; any other error drops the connection (it vanished, spoke
  // something else, or did not finish within kHandshakeLimit).
  Status advance(bool readable, Deadline now);

  State state() const { return state_; }
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  // When advance() should run even with nothing to read: the handshake's
  // limit, and while probing, every kProbeLook (the read has no descriptor).
  Deadline wake_at(Deadline now) const;

  // Once kSettled: what the endpoint is made of.
  Fd take_fd() { return std::move(fd_); }
  ChannelChoice take_channel() { return std::move(*channel_); }
  const Hello& mine() const { return mine_; }
  const Hello& theirs() const { return theirs_; }

 private:
  AcceptingHandshake(Fd fd, std::string peer, EndpointHost& host, int stop_fd);

  Fd fd_;
  std::string peer_;
  EndpointHost* host_;
  int stop_fd_;
  Deadline limit_;  // kHandshakeLimit after it was accepted
  State state_ = State::kHello;
  Hello mine_;
  Hello theirs_;
  // From kReady on: the channel answered, not settled yet.
  std::optional<ChannelChoice> channel_;
  Deadline probe_limit_;  // kProbe: the read is given up then
};

}  // namespace rdmabuf::endpoint
