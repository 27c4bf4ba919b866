#include "backends/ibverbs/ibverbs_backend.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/ibverbs/completion_queue.h"
#include "backends/ibverbs/connection.h"
#include "backends/ibverbs/device.h"
#include "backends/ibverbs/gpu_registration.h"
#include "backends/ibverbs/handle_context.h"
#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/message_channel.h"
#include "backends/ibverbs/notice_intake.h"
#include "backends/ibverbs/remote_access.h"
#include "backends/ibverbs/responder.h"
#include "common/event_loop.h"
#include "common/hello.h"
#include "common/io_pool.h"
#include "common/log.h"
#include "common/op_extents.h"
#include "common/op_text.h"
#include "common/strings.h"

namespace rdmabuf::ibverbs {
namespace {

// Connections are pruned (idle ones forgotten) when this many are known.
constexpr size_t kPruneAt = 64;

// The context of the handle an op names. FailedPrecondition when the owner
// does not offer ibverbs.
Result<HandleContext> decode(const BackendContext* ctx) {
  if (!ctx) return FailedPrecondition("the owner does not offer it");
  return decode_context(ctx->data);
}

class IbverbsBackend final : public Backend {
 public:
  IbverbsBackend(const BackendEnv& env, std::shared_ptr<Device> device, Fd stop_fd)
      : env_(env),
        device_(std::move(device)),
        gpu_registrations_(*device_, device_->has_windows()),
        registrations_(*device_, &gpu_registrations_),
        stop_fd_(std::move(stop_fd)),
        access_(*device_, &gpu_registrations_) {}
  ~IbverbsBackend() override { shutdown(); }

  std::string_view name() const override { return "ibverbs"; }
  TransportLevel level() const override { return TransportLevel::kNic; }

  BackendInfo info() const override {
    BackendInfo info{"ibverbs", TransportLevel::kNic, true, "", {}};
    info.details.emplace_back("using", device_->describe());
    for (const std::string& line : list_devices(device_->lib())) {
      info.details.emplace_back("device", line);
    }
    info.details.emplace_back("max message", format_bytes(env_.config.ib_max_message));
    info.details.emplace_back("access control",
                              access_.windows()
                                  ? "memory windows, each bound to one reader's queue pair"
                                  : "registration keys, granted per handle (the device has no "
                                    "type-2 memory windows)");
    info.details.emplace_back("owner-side queue pairs", std::to_string(responders_.live.load()));
    info.details.emplace_back("handshakes served", std::to_string(responders_.handshakes.load()));
    info.details.emplace_back("notices taken", std::to_string(responders_.notices.load()));
    info.details.emplace_back("notices refused", std::to_string(responders_.refused.load()));
    // Of the memory that reads land in and writes come from (not GPU memory).
    info.details.emplace_back("local registrations made", std::to_string(registrations_.made()));
    info.details.emplace_back("local registrations reused",
                              std::to_string(registrations_.reused()));
    // Reads' and writes' work requests made, and how many of them gather
    // (or scatter into) more than one local piece; at most this many each.
    info.details.emplace_back("work requests", std::to_string(work_requests_.load()));
    info.details.emplace_back("work requests with local pieces",
                              std::to_string(gathering_work_requests_.load()));
    info.details.emplace_back("local pieces per work request",
                              std::to_string(gather_limit(*device_)));
    // The reader's queue pairs, on its I/O threads and their completion
    // queues (shared by every pair on one thread).
    int pairs = 0, queues = 0, threads = 0;
    {
      std::lock_guard lock(connections_mu_);
      for (const auto& [loop, completions] : completions_) {
        pairs += completions->pairs();
        queues += completions->queues();
      }
      threads = env_.loops->threads();
    }
    info.details.emplace_back("reader queue pairs", std::to_string(pairs));
    info.details.emplace_back("reader completion queues", std::to_string(queues));
    info.details.emplace_back("reader I/O threads", std::to_string(threads));
    return info;
  }

  Result<std::unique_ptr<MessageChannel>> open_message_channel() override {
    return ibverbs::open_message_channel(device_);
  }

  // --- owner side ---------------------------------------------------------

  Result<BackendContext> register_memory(uint64_t id, const LocalMemory& memory,
                                         const Token&) override {
    RDMABUF_RETURN_IF_ERROR(access_.add(id, memory));
    HandleContext c{device_->name(), reinterpret_cast<uintptr_t>(memory.data())};
    return BackendContext{"ibverbs", encode_context(c)};
  }

  // Every key granted for the buffer stops working on return: the NIC
  // refuses later accesses.
  void unregister_memory(uint64_t id) override { access_.remove(id); }

  // --- reader side --------------------------------------------------------

  Status can_reach(const RemoteBuffer& remote) const override {
    RDMABUF_ASSIGN_OR_RETURN(HandleContext c, decode(remote.context("ibverbs")));
    std::lock_guard lock(connections_mu_);
    auto it = connections_.find(key_of(remote, c));
    // A recent handshake failure sends ops elsewhere (tcp) until its backoff ends.
    return it == connections_.end() ? Status::Ok() : it->second->health();
  }

  // A NIC's atomics are atomic only with that NIC's (IBV_ATOMIC_HCA), not
  // with the CPU atomics the other transports apply to the same words.
  Status can_apply_atomics(const RemoteBuffer&) const override {
    return FailedPrecondition("a NIC's atomics are not atomic with the CPU's");
  }

  // GPU memory the NIC can register is read and written by the NIC itself.
  Status takes_local_memory(const LocalMemory& local, const RemoteBuffer&) const override {
    if (!local.on_gpu()) return Status::Ok();
    auto region = const_cast<GpuRegistrations&>(gpu_registrations_).acquire(local);
    return region.ok() ? Status::Ok() : region.status().with_context("ibverbs");
  }

  // Whether `length` bytes at `remote` join the last chunk of `batch` (one
  // of this op's, from index `first` on) as another local piece: they follow
  // it in remote memory, and it has room for them and for a gather entry.
  static bool joins_last(const std::vector<Chunk>& batch, size_t first, uint64_t remote,
                         uint64_t length, uint64_t max, uint32_t gather) {
    if (batch.size() == first || gather < 2) return false;
    const Chunk& last = batch.back();
    const size_t pieces = last.pieces.empty() ? 1 : last.pieces.size();
    return last.remote_addr + last.length == remote && last.length + length <= max &&
           pieces < gather;
  }

  void submit(const std::shared_ptr<TransferState>& transfer,
              std::span<const uint32_t> indices) override {
    const uint64_t max = env_.config.ib_max_message;
    std::map<Connection*, std::vector<Chunk>> batches;
    std::vector<std::shared_ptr<Connection>> used;
    // Ops no pair can be set up for here (no event loop, no completion
    // queue: threads, descriptors or the device's queues ran out), though
    // their handles are sound: handed on to the next backend the owner
    // offers.
    std::vector<uint32_t> handed;
    Status unset;
    for (uint32_t i : indices) {
      const Op& op = transfer->op(i);
      auto c = decode(op.remote.context("ibverbs"));
      if (!c.ok()) {
        transfer->fail_op(i, c.status().with_context(describe_op(op)));
        continue;
      }
      auto connection = connection_for(op.remote, *c);
      const StatusCode why = connection.status().code();
      if (!connection.ok() && why != StatusCode::kCancelled &&
          why != StatusCode::kInvalidArgument && env_.router) {
        handed.push_back(i);
        unset = connection.status();
        continue;
      }
      if (!connection.ok()) {
        transfer->fail_op(i, connection.status().with_context(describe_op(op)));
        continue;
      }
      std::vector<Chunk>& batch = batches[connection->get()];
      if (batch.empty()) used.push_back(*connection);
      // One work request per piece of at most `max` bytes of each extent
      // (a plain op is one; a scattered op, one per range): a work request
      // reaches one contiguous remote range. A scattered op's ranges that
      // follow one another in remote memory share one, a gather entry each.
      const size_t first = batch.size();
      const uint32_t gather = gather_limit(*device_);
      for_each_extent(op, 0, op.bytes(), [&](const Extent& e) {
        std::byte* local = op.local.data() + e.local_offset;
        const uint64_t remote = c->addr + op.remote.offset() + e.remote_offset;
        if (joins_last(batch, first, remote, e.length, max, gather)) {
          Chunk& last = batch.back();
          const auto length = static_cast<uint32_t>(e.length);
          std::byte* end = last.pieces.empty() ? last.local + last.length
                                               : last.pieces.back().at + last.pieces.back().length;
          if (end == local) {  // adjacent here too: the same piece, longer
            if (!last.pieces.empty()) last.pieces.back().length += length;
          } else {
            if (last.pieces.empty()) {  // now a work request with pieces
              last.pieces.push_back({last.local, last.length});
              gathering_work_requests_.fetch_add(1, std::memory_order_relaxed);
            }
            last.pieces.push_back({local, length});
          }
          last.length += length;
          return;
        }
        for (uint64_t done = 0; done < e.length; done += max) {
          Chunk chunk;
          chunk.transfer = transfer;
          chunk.op = i;
          chunk.kind = op.kind;
          chunk.local = local + done;
          chunk.remote_addr = remote + done;
          chunk.length = static_cast<uint32_t>(std::min(max, e.length - done));
          batch.push_back(std::move(chunk));
        }
      });
      const uint64_t parts = batch.size() - first;
      work_requests_.fetch_add(parts, std::memory_order_relaxed);
      const bool notice = transfer->notice(i) != nullptr && op.kind == OpKind::kWriteFromLocal;
      const uint64_t all_parts = parts + (notice ? 1 : 0);
      if (all_parts > 1) transfer->expect_parts(i, static_cast<uint32_t>(all_parts));
      if (notice) {  // behind the bytes, on the same queue pair
        Chunk chunk;
        chunk.transfer = transfer;
        chunk.op = i;
        chunk.kind = op.kind;
        chunk.length = static_cast<uint32_t>(kNoticeBytes);
        chunk.notice = true;
        batch.push_back(std::move(chunk));
      }
    }
    for (auto& [connection, chunks] : batches)
      connection->enqueue(chunks);
    if (!handed.empty()) env_.router->reroute(transfer, handed, "ibverbs", unset);
  }

  // --- the owner's side of queue pairs ------------------------------------

  bool claims_channel(uint8_t channel) const override {
    return channel == static_cast<uint8_t>(Channel::kIbverbs);
  }

  // The owner's side of a reader's queue pair (backends/ibverbs/responder.h),
  // on the manager's I/O threads.
  std::unique_ptr<IoSession> open_session(int fd, uint64_t reader_id) override {
    auto intake = notice_intake();
    if (!intake.ok()) {
      RDMABUF_LOG_WARN("ibverbs: cannot serve a queue pair: " + intake.status().message());
      return nullptr;  // the listener closes the connection
    }
    ResponderContext context;
    context.device = device_.get();
    context.resolver = env_.resolver;
    context.access = &access_;
    context.intake = std::move(intake).value();
    context.reader_id = reader_id;
    context.stopping = &stopping_;
    context.counts = &responders_;
    return open_responder(Fd(fd), std::move(context));
  }

  void shutdown() override {
    stopping_.store(true);
    signal_eventfd(stop_fd_.get());
    std::vector<std::shared_ptr<Connection>> connections;
    {
      std::lock_guard lock(connections_mu_);
      for (auto& [key, connection] : connections_)
        connections.push_back(connection);
    }
    // Outside the lock: a stop completes ops, whose callbacks may submit
    // more (which fail at once). Then the loops run the connections' last
    // runs (each drains and destroys its pair).
    for (auto& connection : connections)
      connection->stop();
    env_.loops->drain();
    std::shared_ptr<NoticeIntake> intake;
    {
      std::lock_guard lock(intake_mu_);
      intake = intake_;
    }
    if (intake) intake->stop();  // the pairs themselves go with the listener's sessions
  }

 private:
  // A queue pair per (owner manager, owner address, owner device); this
  // backend uses one local device.
  using ConnectionKey = std::tuple<uint64_t, std::string, std::string>;

  // The owner's notice intake, started with the first reader's pair.
  Result<std::shared_ptr<NoticeIntake>> notice_intake() {
    std::lock_guard lock(intake_mu_);
    if (!intake_) {
      RDMABUF_ASSIGN_OR_RETURN(intake_, NoticeIntake::create(device_, env_.notices, &responders_));
    }
    return intake_;
  }

  static ConnectionKey key_of(const RemoteBuffer& remote, const HandleContext& c) {
    return {remote.owner().manager_id, remote.owner().address, c.device};
  }

  Result<std::shared_ptr<Connection>> connection_for(const RemoteBuffer& remote,
                                                     const HandleContext& c) {
    std::lock_guard lock(connections_mu_);
    if (stopping_.load()) return Cancelled("the manager is shutting down");
    ConnectionKey key = key_of(remote, c);
    auto it = connections_.find(key);
    if (it != connections_.end()) return it->second;
    if (connections_.size() >= kPruneAt) {
      for (auto p = connections_.begin(); p != connections_.end();) {
        bool unused = p->second.use_count() == 1 && p->second->idle();
        p = unused ? connections_.erase(p) : std::next(p);
      }
    }
    RDMABUF_ASSIGN_OR_RETURN(HostPort address, parse_host_port(remote.owner().address));
    RDMABUF_ASSIGN_OR_RETURN(EventLoops * loops, env_.loops->get());
    EventLoop& loop = loops->next();
    auto found = completions_.find(&loop);
    if (found == completions_.end()) {
      RDMABUF_ASSIGN_OR_RETURN(
          auto made, LoopCompletions::create(device_, loop, kPairDepth, env_.config.busy_poll));
      found = completions_.emplace(&loop, std::move(made)).first;
    }
    const std::shared_ptr<LoopCompletions>& completions = found->second;
    ConnectionContext context;
    context.device = device_.get();
    context.registrations = &registrations_;
    context.owner_address = std::move(address);
    context.owner_id = remote.owner().manager_id;
    context.owner_device = c.device;
    context.self_id = env_.self.manager_id;
    context.stopping = &stopping_;
    context.stop_fd = stop_fd_.get();
    context.router = env_.router;
    context.handshakers = &handshakers_;
    auto connection = std::make_shared<Connection>(std::move(context), loop, completions);
    connections_.emplace(std::move(key), connection);
    return connection;
  }

  BackendEnv env_;
  std::shared_ptr<Device> device_;  // shared with the message channels, which may outlive this
  // GPU memory's registrations, one per driver allocation; for both sides.
  GpuRegistrations gpu_registrations_;
  LocalRegistrations registrations_;
  Fd stop_fd_;
  std::atomic<bool> stopping_{false};
  // Owner side: what the queue pairs held for readers count, and their
  // notices' intake (made once, under intake_mu_).
  ResponderCounts responders_;
  std::mutex intake_mu_;
  std::shared_ptr<NoticeIntake> intake_;
  // Reader side: work requests made for reads and writes (info()).
  std::atomic<uint64_t> work_requests_{0};
  std::atomic<uint64_t> gathering_work_requests_{0};

  // Owner side: the buffers' registrations and the access granted to them.
  // Declared after device_: destroyed before it.
  RemoteAccess access_;

  mutable std::mutex connections_mu_;
  // Guarded by connections_mu_.
  std::map<ConnectionKey, std::shared_ptr<Connection>> connections_;
  std::map<EventLoop*, std::shared_ptr<LoopCompletions>> completions_;  // one per loop
  // The reader's handshakes (Connection::shake_hands). Declared last:
  // stopped first, once shutdown() has waited for the handshakes.
  WorkerPool handshakers_{"rdmabuf-connect", kMostHandshakes, std::chrono::seconds(2)};
};

}  // namespace

Result<std::unique_ptr<Backend>> make_ibverbs_backend(const BackendEnv& env) {
  RDMABUF_ASSIGN_OR_RETURN(const IbvLib* lib, IbvLib::get());
  RDMABUF_ASSIGN_OR_RETURN(auto device,
                           Device::open(*lib, env.config.ib_device, env.config.ib_gid_index));
  RDMABUF_ASSIGN_OR_RETURN(Fd stop_fd, make_eventfd());
  return std::unique_ptr<Backend>(new IbverbsBackend(env, std::move(device), std::move(stop_fd)));
}

}  // namespace rdmabuf::ibverbs
