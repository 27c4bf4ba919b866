#include "backends/tcp/tcp_backend.h"

#include <sys/socket.h>

#include <map>
#include <mutex>
#include <utility>

#include "backends/tcp/client.h"
#include "backends/tcp/server.h"
#include "common/event_loop.h"
#include "common/hello.h"
#include "common/io_pool.h"
#include "common/op_text.h"
#include "common/strings.h"

namespace rdmabuf::tcp {
namespace {

// Peers are pruned (idle ones forgotten) when this many are known.
constexpr size_t kPrunePeersAt = 64;

class TcpBackend final : public Backend {
 public:
  TcpBackend(const BackendEnv& env, Fd stop_fd) : env_(env), stop_fd_(std::move(stop_fd)) {}
  ~TcpBackend() override { shutdown(); }

  std::string_view name() const override { return "tcp"; }
  TransportLevel level() const override { return TransportLevel::kTcp; }

  BackendInfo info() const override {
    BackendInfo info{"tcp", TransportLevel::kTcp, true, "", {}};
    info.details.emplace_back("streams per peer", std::to_string(env_.config.tcp_streams));
    info.details.emplace_back("chunk size", format_bytes(env_.config.chunk_size));
    return info;
  }

  Result<BackendContext> register_memory(uint64_t, const LocalMemory&, const Token&) override {
    // Readers dial the owner's listener (in the handle); nothing else to say.
    return BackendContext{"tcp", {}};
  }
  void unregister_memory(uint64_t) override {}

  Status can_reach(const RemoteBuffer&) const override { return Status::Ok(); }
  // The owner's ServerConnection applies them.
  Status can_apply_atomics(const RemoteBuffer&) const override { return Status::Ok(); }

  void submit(const std::shared_ptr<TransferState>& transfer,
              std::span<const uint32_t> indices) override {
    // Group by owner; almost always there is one.
    std::shared_ptr<Peer> last;
    const PeerIdentity* last_owner = nullptr;
    std::vector<uint32_t> run;
    auto flush = [&] {
      if (!run.empty()) last->submit(transfer, run, env_.config.chunk_size);
      run.clear();
    };
    for (uint32_t i : indices) {
      const RemoteBuffer& remote = transfer->op(i).remote;
      const PeerIdentity& owner = remote.owner();
      if (!last || owner.manager_id != last_owner->manager_id ||
          owner.address != last_owner->address) {
        flush();
        auto peer = peer_for(remote);
        if (!peer.ok()) {
          transfer->fail_op(i, peer.status().with_context(describe_op(transfer->op(i))));
          last = nullptr;
          continue;
        }
        last = std::move(peer).value();
        last_owner = &owner;
      }
      run.push_back(i);
    }
    flush();
  }

  bool claims_channel(uint8_t channel) const override {
    return channel == static_cast<uint8_t>(Channel::kTcpData);
  }

  std::unique_ptr<IoSession> open_session(int fd, uint64_t) override {
    ServerSettings settings{env_.resolver, env_.config.busy_poll, env_.config.io_stall_timeout,
                            &stopping_, stop_fd_.get()};
    return std::make_unique<ServerConnection>(Fd(fd), settings);
  }

  void shutdown() override {
    stopping_.store(true);
    signal_eventfd(stop_fd_.get());
    std::vector<std::shared_ptr<Peer>> peers;
    {
      std::lock_guard lock(peers_mu_);
      for (auto& [id, peer] : peers_)
        peers.push_back(peer);
    }
    // Outside the lock: stopping completes transfers, whose callbacks may
    // call back into submit(). Then the loops run the streams' stops.
    for (auto& peer : peers)
      peer->stop();
    env_.loops->drain();
  }

 private:
  Result<std::shared_ptr<Peer>> peer_for(const RemoteBuffer& remote) {
    std::lock_guard lock(peers_mu_);
    if (stopping_.load()) return Cancelled("the manager is shutting down");
    // Keyed by id and address both: a forged handle that pairs a genuine
    // owner's id with another address gets a peer of its own, and cannot
    // redirect the genuine handles (and their tokens) to that address.
    PeerKey key{remote.owner().manager_id, remote.owner().address};
    auto it = peers_.find(key);
    if (it != peers_.end()) return it->second;
    if (peers_.size() >= kPrunePeersAt) prune_idle_peers();
    RDMABUF_ASSIGN_OR_RETURN(HostPort address, parse_host_port(remote.owner().address));
    PeerContext context;
    context.address = std::move(address);
    context.owner_id = remote.owner().manager_id;
    context.self_id = env_.self.manager_id;
    context.stall_timeout = env_.config.io_stall_timeout;
    context.stopping = &stopping_;
    RDMABUF_ASSIGN_OR_RETURN(EventLoops * loops, env_.loops->get());
    auto peer = std::make_shared<Peer>(std::move(context), env_.config.tcp_streams, *loops);
    peers_.emplace(std::move(key), peer);
    return peer;
  }

  // Forgets peers with no connection and no work, so that a reader that
  // meets many short-lived owners does not keep state for each for ever.
  void prune_idle_peers() {
    for (auto it = peers_.begin(); it != peers_.end();) {
      // use_count 1: no submit holds it (they take it under peers_mu_).
      bool unused = it->second.use_count() == 1 && it->second->idle();
      it = unused ? peers_.erase(it) : std::next(it);
    }
  }

  BackendEnv env_;
  Fd stop_fd_;
  std::atomic<bool> stopping_{false};
  std::mutex peers_mu_;
  using PeerKey = std::pair<uint64_t, std::string>;
  std::map<PeerKey, std::shared_ptr<Peer>> peers_;  // guarded by peers_mu_
};

}  // namespace

Result<std::unique_ptr<Backend>> make_tcp_backend(const BackendEnv& env) {
  RDMABUF_ASSIGN_OR_RETURN(Fd stop_fd, make_eventfd());
  return std::unique_ptr<Backend>(new TcpBackend(env, std::move(stop_fd)));
}

}  // namespace rdmabuf::tcp
