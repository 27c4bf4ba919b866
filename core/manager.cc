// Manager: the registry of minted buffers, the listener, the backends, and
// the choice of a backend for every op.
#include "rdmabuf/manager.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include "common/buffer_access.h"
#include "common/event_loop.h"
#include "common/hello.h"
#include "common/host.h"
#include "common/io_pool.h"
#include "common/log.h"
#include "common/op_text.h"
#include "common/scratch.h"
#include "common/strings.h"
#include "common/wire.h"
#include "core/backend_table.h"
#include "core/deadline_watcher.h"
#include "core/endpoint/endpoint_host.h"
#include "core/endpoint/endpoint_impl.h"
#include "core/endpoint/listener.h"
#include "core/listener.h"
#include "core/notifications.h"
#include "core/op_validation.h"
#include "core/registry.h"
#include "core/staging.h"

namespace rdmabuf {
namespace {

// How long an inbound connection may take to say hello.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
constexpr int kListenBacklog = 1024;

bool is_wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

}  // namespace

class ManagerImpl final : public OpRouter, public NoticeSink, public endpoint::EndpointHost {
 public:
  static Result<std::unique_ptr<ManagerImpl>> create(const Config& config);
  ~ManagerImpl() override {
    shutdown();
    // Before any member goes: a shutdown() from a loop's own thread left
    // that loop to end by itself (its last runs may start server turns),
    // and the workers' turns use the members below.
    loops_.stop();
    endpoint_workers_.stop();
  }

  const Config& config() const override { return config_; }
  const PeerIdentity& identity() const override { return identity_; }
  std::vector<BackendInfo> backends() const override;
  Result<std::unique_ptr<MessageChannel>> open_message_channel() override;
  Result<RemoteBuffer> register_buffer(LocalMemory memory) override;
  Status release(const RemoteBuffer& handle) override;
  // Buffer `id` out of the registry and every backend, then its memory
  // dropped (release() and shutdown()). kNotFound when not registered.
  Status release_everywhere(uint64_t id);
  // A buffer counts until its release has returned (every backend let go).
  size_t registered_count() const { return registry_.size() + releasing_.load(); }
  Transfer submit(std::vector<Op> ops, std::chrono::milliseconds timeout,
                  std::function<void()> on_done) override {
    return Transfer(start(std::move(ops), timeout, std::move(on_done), nullptr));
  }
  Status write_noticed(const RemoteBuffer& dst, const LocalMemory& src, const WriteNotice& notice,
                       std::chrono::milliseconds timeout, bool& notice_sent) override;
  Result<EventLoop*> endpoint_loop() override {
    RDMABUF_ASSIGN_OR_RETURN(EventLoops * loops, loops_.get());
    return &loops->next();
  }
  WorkerPool& endpoint_workers() override { return endpoint_workers_; }
  NotificationQueue& notifications() override { return notifications_; }
  NoticeRoutes& notice_routes() override { return notice_routes_; }
  LendBudget& lend_budget() override { return lend_budget_; }
  // Starts `ops` as submit() does; each write carries `notice` (when not
  // null) to the backend that runs it.
  std::shared_ptr<TransferState> start(std::vector<Op> ops, std::chrono::milliseconds timeout,
                                       std::function<void()> on_done, const WriteNotice* notice);
  void shutdown();
  Status deliver(uint64_t writer, const NoticeRecord& notice) override;
  void reroute(const std::shared_ptr<TransferState>& transfer, std::span<const uint32_t> ops,
               std::string_view from, const Status& why) override;

  // Manager::transport_for.
  Result<std::string> transport_for(const RemoteBuffer& remote) {
    RDMABUF_ASSIGN_OR_RETURN(Route route, choose_route(Op::read(remote, LocalMemory())));
    return std::string(slots_[route.slot].factory->name);
  }

 private:
  struct Slot {
    const BackendFactory* factory;
    std::unique_ptr<Backend> backend;  // null when not viable or not enabled
    std::string reason;                // why null
  };
  struct Route {
    size_t slot = 0;
    std::string note;  // why not the best transport the owner offers
    // Only same-host transports were passed over, for an owner on another
    // host: the note is expected there, and logged at info, not as a warning.
    bool routine = false;
  };

  explicit ManagerImpl(const Config& config) : config_(config) {}
  // What serves an inbound connection, given its hello (see Listener).
  std::unique_ptr<IoSession> route_inbound(Fd& fd, const Result<Hello>& hello);
  // The best backend for `op` among slots [first_slot, end); `refused`
  // (with `refused_by`) is a refusal by a better one, found after the op
  // was handed to it.
  Result<Route> choose_route(const Op& op, size_t first_slot = 0, std::string_view refused_by = {},
                             const Status& refused = {});
  // Op `i` of `transfer` goes to slot `slot`: into `per_slot`, or through
  // the stager when the backend cannot take its (GPU) local memory.
  void assign(const std::shared_ptr<TransferState>& transfer, uint32_t i, size_t slot,
              const std::string& note, std::vector<std::vector<uint32_t>>& per_slot);
  // Hands each slot's ops (indices into `transfer`) to its backend.
  void dispatch(const std::shared_ptr<TransferState>& transfer,
                const std::vector<std::vector<uint32_t>>& per_slot);
  void log_note_once(const RemoteBuffer& remote, std::string_view backend, const Route& route);

  Config config_;
  PeerIdentity identity_;
  Registry registry_;
  std::atomic<size_t> releasing_{0};  // release() calls under way (registered_count)
  // The event loops the backends drive their outbound connections on, and
  // the endpoints' servers wait on; outlives the backends (declared before
  // slots_).
  SharedLoops loops_{io_threads_for(config_.io_threads), config_.busy_poll};
  std::vector<Slot> slots_;  // priority order, best first
  std::unique_ptr<Listener> listener_;
  DeadlineWatcher deadlines_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> shut_down_{false};
  std::mutex shutdown_mu_;
  std::mutex notes_mu_;
  std::set<std::string> logged_notes_;
  // Ops on GPU memory that a backend takes only as host memory.
  Stager stager_{[this](std::vector<Op> ops, std::chrono::milliseconds timeout,
                        std::function<void()> on_done) {
    return start(std::move(ops), timeout, std::move(on_done), nullptr);
  }};

 public:
  // Shared by this manager's endpoints. The workers their servers' turns
  // run on: as many as turns under way, up to kMostEndpointWorkers (more
  // wait); one idle for 2 s ends.
  static constexpr int kMostEndpointWorkers = 64;
  WorkerPool endpoint_workers_{"rdmabuf-serve", kMostEndpointWorkers, std::chrono::seconds(2)};
  NotificationQueue notifications_;
  NoticeRoutes notice_routes_;
  LendBudget lend_budget_{config_.lend_limit};
};

Result<std::unique_ptr<ManagerImpl>> ManagerImpl::create(const Config& config) {
  RDMABUF_RETURN_IF_ERROR(config.validate());
  std::string known;
  for (const BackendFactory& f : backend_factories())
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  for (const std::string& name : config.backends) {
    bool found = false;
    for (const BackendFactory& f : backend_factories())
      found |= name == f.name;
    if (!found) {
      return InvalidArgument("unknown backend '" + name + "' in config backends (known: " + known +
                             ")");
    }
  }
  set_log_level(config.log_level);

  std::unique_ptr<ManagerImpl> m(new ManagerImpl(config));
  RDMABUF_ASSIGN_OR_RETURN(HostPort where, parse_host_port(config.listen_address));
  RDMABUF_ASSIGN_OR_RETURN(Fd listen_fd, listen_tcp(where, kListenBacklog));
  RDMABUF_ASSIGN_OR_RETURN(HostPort bound, local_address(listen_fd.get()));
  std::string host = config.advertise_host;
  if (host.empty() && !is_wildcard(where.host)) host = where.host;
  if (host.empty()) {
    auto ip = first_non_loopback_ipv4();
    if (ip.ok()) {
      host = *ip;
    } else {
      RDMABUF_LOG_WARN("listening on " + where.to_string() +
                       " but this host has no other IPv4 address to advertise; handles will "
                       "name 127.0.0.1 (set RDMABUF_ADVERTISE_HOST)");
      host = "127.0.0.1";
    }
  }
  m->identity_.manager_id = secure_random_u64() | 1;  // never 0, which means "any"
  m->identity_.address = HostPort{host, bound.port}.to_string();
  m->identity_.host_id = this_host_id();
  m->identity_.pid = static_cast<uint32_t>(getpid());

  BackendEnv env{config, m->identity_, &m->registry_, m.get(), m.get(), &m->loops_};
  for (const BackendFactory& f : backend_factories()) {
    Slot slot{&f, nullptr, ""};
    bool enabled = config.backends.empty();
    for (const std::string& name : config.backends)
      enabled |= name == f.name;
    if (!enabled) {
      slot.reason = "not enabled (config backends / RDMABUF_BACKENDS)";
    } else {
      auto backend = f.create(env);
      if (backend.ok()) {
        slot.backend = std::move(backend).value();
      } else {
        slot.reason = backend.status().message();
        RDMABUF_LOG_INFO(std::string(f.name) + " backend not viable: " + slot.reason);
      }
    }
    m->slots_.push_back(std::move(slot));
  }

  RDMABUF_ASSIGN_OR_RETURN(Fd stop_fd, make_eventfd());
  RDMABUF_ASSIGN_OR_RETURN(auto pool,
                           IoPool::create(io_threads_for(config.io_threads), config.busy_poll));
  ManagerImpl* raw = m.get();
  m->listener_ = std::make_unique<Listener>(
      std::move(listen_fd), std::move(stop_fd), config.max_connections, std::move(pool),
      [raw](Fd& fd, const Result<Hello>& hello) { return raw->route_inbound(fd, hello); });
  m->listener_->start();
  RDMABUF_LOG_INFO("manager " + m->identity_.to_string() + " started");
  return m;
}

std::unique_ptr<IoSession> ManagerImpl::route_inbound(Fd& fd, const Result<Hello>& hello) {
  const Deadline deadline = Clock::now() + kHelloTimeout;
  const uint64_t self = identity_.manager_id;
  if (!hello.ok()) {
    RDMABUF_LOG_DEBUG("dropping an inbound connection: " + hello.status().message());
    send_hello_reply(fd.get(), self, hello.status(), deadline).ignore();
    return {};
  }
  if (hello->expected_id != 0 && hello->expected_id != self) {
    Status gone = NotFound("the buffer's owner (manager " + hex_id(hello->expected_id) +
                           ") is gone; " + identity_.to_string() + " listens there now");
    send_hello_reply(fd.get(), self, gone, deadline).ignore();
    return {};
  }
  for (Slot& slot : slots_) {
    if (slot.backend && slot.backend->claims_channel(static_cast<uint8_t>(hello->channel))) {
      if (!send_hello_reply(fd.get(), self, Status::Ok(), deadline).ok()) return {};
      auto session = slot.backend->open_session(fd.get(), hello->caller_id);
      if (session) (void)fd.release();  // the session's now
      return session;
    }
  }
  send_hello_reply(fd.get(), self,
                   Unimplemented("channel " + std::to_string(static_cast<int>(hello->channel)) +
                                 " is not served by this manager"),
                   deadline)
      .ignore();
  return {};
}

std::vector<BackendInfo> ManagerImpl::backends() const {
  std::vector<BackendInfo> out;
  for (const Slot& slot : slots_) {
    if (slot.backend) {
      out.push_back(slot.backend->info());
    } else {
      out.push_back(BackendInfo{slot.factory->name, slot.factory->level, false, slot.reason, {}});
    }
  }
  return out;
}

Result<std::unique_ptr<MessageChannel>> ManagerImpl::open_message_channel() {
  std::string why;
  for (const Slot& slot : slots_) {
    if (slot.factory->level != TransportLevel::kNic) continue;  // only NICs carry messages
    Status refused = FailedPrecondition(slot.reason);
    if (slot.backend) {
      auto opened = slot.backend->open_message_channel();
      if (opened.ok()) return opened;
      refused = opened.status();
    }
    why += (why.empty() ? "" : "; ") + std::string(slot.factory->name) + ": " + refused.message();
  }
  if (why.empty()) why = "no RDMA backend was built";
  return FailedPrecondition(why);
}

Result<RemoteBuffer> ManagerImpl::register_buffer(LocalMemory memory) {
  if (shut_down_.load()) return FailedPrecondition("the manager is shut down");
  if (memory.size() == 0) return InvalidArgument("cannot register empty memory");
  if (memory.data() == nullptr) return InvalidArgument("cannot register memory at address null");
  const uint64_t id = next_id_.fetch_add(1);
  detail::RemoteBufferFields fields;
  fields.id = id;
  fields.region_size = memory.size();
  secure_random(fields.token.data(), fields.token.size());
  fields.owner = identity_;
  std::vector<Backend*> registered;
  for (Slot& slot : slots_) {
    if (!slot.backend) continue;
    auto ctx = slot.backend->register_memory(id, memory, fields.token);
    if (ctx.ok()) {
      fields.contexts.push_back(std::move(ctx).value());
      registered.push_back(slot.backend.get());
    } else {
      RDMABUF_LOG_WARN("buffer " + std::to_string(id) + " is not offered over " +
                       std::string(slot.backend->name()) + ": " + ctx.status().message());
    }
  }
  auto undo = [&] {
    for (Backend* b : registered)
      b->unregister_memory(id);
  };
  if (fields.contexts.empty()) {
    undo();
    return FailedPrecondition("no backend could register " + format_bytes(memory.size()));
  }
  Token token = fields.token;
  auto handle = detail::RemoteBufferAccess::make(std::move(fields));
  if (!handle.ok()) {
    undo();
    return handle.status();
  }
  registry_.add(id, token, std::move(memory));
  return handle;
}

Status ManagerImpl::release(const RemoteBuffer& handle) {
  if (!handle.valid()) return InvalidArgument("release of an empty handle");
  if (shut_down_.load()) {
    return FailedPrecondition("the manager is shut down (it released every buffer then)");
  }
  if (handle.owner().manager_id != identity_.manager_id) {
    return InvalidArgument("cannot release " + handle.describe() + ": it was not minted by " +
                           identity_.to_string());
  }
  releasing_.fetch_add(1);  // counted from before the registry lets go
  Status released = release_everywhere(handle.id());
  releasing_.fetch_sub(1);
  return released;
}

Status ManagerImpl::release_everywhere(uint64_t id) {
  // The registry first (software accesses end), then every backend (a NIC's
  // key, a same-host reader's slot), and only then the memory itself: its
  // keepalive may be the last reference, and the memory freed with it.
  Result<LocalMemory> memory = registry_.release(id);
  if (!memory.ok()) return memory.status();
  for (Slot& slot : slots_) {
    if (slot.backend) slot.backend->unregister_memory(id);
  }
  return Status::Ok();  // `memory` goes last
}

Result<ManagerImpl::Route> ManagerImpl::choose_route(const Op& op, size_t first_slot,
                                                     std::string_view refused_by,
                                                     const Status& refused) {
  const RemoteBuffer& remote = op.remote;
  std::string note;
  // The first refusal that is news about the owner (gone, unreachable), not
  // about this configuration: when nothing can carry the op, that is why.
  Status owner_refusal;
  auto add_note = [&note](std::string_view name, const std::string& why) {
    if (!note.empty()) note += "; ";
    note.append(name).append(": ").append(why);
  };
  auto consider_refusal = [&owner_refusal](const Status& reach) {
    const StatusCode code = reach.code();
    if (owner_refusal.ok() && (code == StatusCode::kUnavailable || code == StatusCode::kNotFound ||
                               code == StatusCode::kDeadlineExceeded)) {
      owner_refusal = reach;
    }
  };
  if (!refused.ok()) {
    add_note(refused_by, refused.message());
    consider_refusal(refused);
  }
  for (size_t s = first_slot; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    const std::string_view name = slot.factory->name;
    if (!remote.context(name)) continue;  // the owner does not offer it
    if (!slot.backend) {
      add_note(name, slot.reason);
      continue;
    }
    if (op.is_atomic()) {
      Status atomics = slot.backend->can_apply_atomics(remote);
      if (!atomics.ok()) {
        add_note(name, atomics.message());
        consider_refusal(atomics);  // the owner gone, say
        continue;
      }
    }
    Status reach = slot.backend->can_reach(remote);
    if (!reach.ok()) {
      add_note(name, reach.message());
      consider_refusal(reach);
      continue;
    }
    // An atomic takes tcp where nothing else can apply it (docs/atomics.md).
    if (slot.factory->level == TransportLevel::kTcp && !config_.allow_tcp_fallback &&
        !op.is_atomic()) {
      return FailedPrecondition(describe_op(op) +
                                ": it would have to use TCP, and TCP fallback is disabled "
                                "(allow_tcp_fallback / RDMABUF_ALLOW_TCP_FALLBACK=0)" +
                                (note.empty() ? "" : " [" + note + "]"));
    }
    bool routine = refused.ok() && remote.owner().host_id != identity_.host_id;
    for (size_t passed = first_slot; routine && passed < s; ++passed) {
      routine = !remote.context(slots_[passed].factory->name) ||
                slots_[passed].factory->level == TransportLevel::kMemory;
    }
    return Route{s, note, routine};
  }
  if (!owner_refusal.ok()) {
    // E.g. a queue pair to an owner that restarted: NotFound, as over a
    // transport that reached it, not "change the configuration".
    return Status(owner_refusal.code(), describe_op(op) + ": " + note);
  }
  std::string offered;
  for (const BackendContext& ctx : remote.contexts()) {
    offered += (offered.empty() ? "" : ", ") + ctx.backend;
  }
  return FailedPrecondition(describe_op(op) + ": no transport in common; the owner offers {" +
                            offered + "}" + (note.empty() ? "" : " [" + note + "]"));
}

void ManagerImpl::log_note_once(const RemoteBuffer& remote, std::string_view backend,
                                const Route& route) {
  std::string key = hex_id(remote.owner().manager_id) + "|" + route.note;
  {
    std::lock_guard lock(notes_mu_);
    if (!logged_notes_.insert(key).second) return;
  }
  const std::string text = "transfers to " + remote.owner().to_string() + " use " +
                           std::string(backend) +
                           ", not a better transport the owner offers: " + route.note;
  if (route.routine) {
    RDMABUF_LOG_INFO(text);
  } else {
    RDMABUF_LOG_WARN(text);
  }
}

std::shared_ptr<TransferState> ManagerImpl::start(std::vector<Op> ops,
                                                  std::chrono::milliseconds timeout,
                                                  std::function<void()> on_done,
                                                  const WriteNotice* notice) {
  // The state fixes its deadline `timeout` from now, saturating: a huge
  // timeout means no deadline, not an overflow.
  auto state = std::make_shared<TransferState>(std::move(ops), timeout, config_.busy_poll);
  for (size_t i = 0; notice && i < state->op_count(); ++i) {
    // A notice names one range of bytes: a scattered write carries none.
    const Op& op = state->op(i);
    if (op.kind == OpKind::kWriteFromLocal && !op.ranges) state->set_notice(i, *notice);
  }
  if (on_done) {
    // Watch the deadline, and stop watching once finished. The watcher
    // holds the transfer weakly: dropping every Transfer handle still
    // cancels it (and so runs on_done).
    const bool timed = state->deadline() != Deadline::max();
    TransferState* raw = state.get();
    state->set_on_finish([this, raw, timed, on_done = std::move(on_done)] {
      if (timed) deadlines_.forget(raw);
      on_done();
    });
    if (timed && !state->finished()) deadlines_.watch(state);
  }
  if (shut_down_.load()) {
    for (size_t i = 0; i < state->op_count(); ++i) {
      state->fail_op(i, FailedPrecondition("the manager is shut down"));
    }
    return state;
  }
  // Usually every op goes to one backend; keep that path allocation-free.
  Scratch<std::vector<std::vector<uint32_t>>, struct StartLists> lists;
  std::vector<std::vector<uint32_t>>& per_slot = lists.get();
  per_slot.resize(slots_.size());
  for (auto& list : per_slot)
    list.clear();
  const std::vector<BackendContext>* routed_handle = nullptr;
  bool routed_atomic = false;
  Route route;
  for (size_t i = 0; i < state->op_count(); ++i) {
    const Op& op = state->op(i);
    Status valid = validate_op(op, config_.chunk_size);
    if (!valid.ok()) {
      state->fail_op(i, valid);
      continue;
    }
    if (op.bytes() == 0) {  // nothing to move: done, without a round trip
      state->complete_part(i, Status::Ok());
      continue;
    }
    // The route depends only on the handle and on whether the op is an
    // atomic, and the ops of a batch mostly share one handle (slices of
    // it): choose once per run of them.
    if (&op.remote.contexts() != routed_handle || op.is_atomic() != routed_atomic) {
      auto chosen = choose_route(op);
      if (!chosen.ok()) {
        state->fail_op(i, chosen.status());
        routed_handle = nullptr;
        continue;
      }
      route = std::move(chosen).value();
      routed_handle = &op.remote.contexts();
      routed_atomic = op.is_atomic();
      // Atomics take the owner's manager by design: no warning for that.
      if (!route.note.empty() && !op.is_atomic())
        log_note_once(op.remote, slots_[route.slot].factory->name, route);
    }
    assign(state, static_cast<uint32_t>(i), route.slot, route.note, per_slot);
  }
  dispatch(state, per_slot);
  return state;
}

void ManagerImpl::assign(const std::shared_ptr<TransferState>& transfer, uint32_t i, size_t slot,
                         const std::string& note, std::vector<std::vector<uint32_t>>& per_slot) {
  const Op& op = transfer->op(i);
  const std::string_view name = slots_[slot].factory->name;
  if (op.local.on_gpu()) {
    Status takes = slots_[slot].backend->takes_local_memory(op.local, op.remote);
    if (!takes.ok()) {
      transfer->set_route(
          i, name,
          note + (note.empty() ? "" : "; ") + "staged through host memory: " + takes.message());
      stager_.stage(transfer, i);
      return;
    }
  }
  transfer->set_route(i, name, note);
  per_slot[slot].push_back(i);
}

Status ManagerImpl::deliver(uint64_t writer, const NoticeRecord& notice) {
  // The writer proves it holds a handle to the buffer (its token), and the
  // range must lie within it; the endpoint then checks that the writer is
  // its peer.
  auto pinned = registry_.pin(notice.buffer_id, notice.token, nullptr);
  if (!pinned.ok()) return pinned.status();
  if (notice.length == 0 || !range_fits(notice.offset, notice.length, pinned->size())) {
    return InvalidArgument("a notice names bytes " + std::to_string(notice.offset) + "+" +
                           std::to_string(notice.length) + " of buffer " +
                           std::to_string(notice.buffer_id) + " (" +
                           std::to_string(pinned->size()) + " B)");
  }
  pinned->reset();
  // Straight into the queue (or to the handler, on this thread), with no
  // hop through the endpoint's server: the NIC has already ordered it
  // behind the bytes.
  RDMABUF_ASSIGN_OR_RETURN(Notification n, notice_routes_.notification_for(writer, notice));
  return notifications_.try_push(n);
}

void ManagerImpl::reroute(const std::shared_ptr<TransferState>& transfer,
                          std::span<const uint32_t> ops, std::string_view from, const Status& why) {
  size_t from_slot = 0;
  while (from_slot < slots_.size() && slots_[from_slot].factory->name != from)
    ++from_slot;
  std::vector<std::vector<uint32_t>> per_slot(slots_.size());
  for (uint32_t i : ops) {
    const Op& op = transfer->op(i);
    auto chosen = shut_down_.load() ? Result<Route>(Cancelled("the manager is shutting down"))
                                    : choose_route(op, from_slot + 1, from, why);
    if (!chosen.ok()) {
      transfer->fail_op(i, chosen.status());
      continue;
    }
    // Atomics take the transport that can apply them by design: no warning.
    if (!op.is_atomic()) log_note_once(op.remote, slots_[chosen->slot].factory->name, *chosen);
    transfer->expect_parts(i, 1);  // the new backend may cut it differently
    assign(transfer, i, chosen->slot, chosen->note, per_slot);
  }
  dispatch(transfer, per_slot);
}

void ManagerImpl::dispatch(const std::shared_ptr<TransferState>& transfer,
                           const std::vector<std::vector<uint32_t>>& per_slot) {
  // Slowest transport first: a backend that copies inside submit (memory)
  // must not hold up ops that wait on a network.
  for (size_t s = slots_.size(); s-- > 0;) {
    if (!per_slot[s].empty()) slots_[s].backend->submit(transfer, per_slot[s]);
  }
}

void ManagerImpl::shutdown() {
  std::lock_guard lock(shutdown_mu_);
  if (shut_down_.exchange(true)) return;
  stager_.stop_starting();
  // (No listener: create() failed before it made one.)
  if (listener_) listener_->stop_accepting();
  for (Slot& slot : slots_) {
    if (slot.backend) slot.backend->shutdown();
  }
  loops_.stop();       // every backend's tasks on them have had their final runs
  stager_.shutdown();  // its pieces have all finished with the backends
  if (listener_) listener_->join_connections();
  deadlines_.stop();
  notifications_.close();
  for (uint64_t id : registry_.ids())
    release_everywhere(id).ignore();
  RDMABUF_LOG_INFO("manager " + identity_.to_string() + " shut down");
}

// --- Manager ------------------------------------------------------------------

Manager::Manager(std::unique_ptr<ManagerImpl> impl) : impl_(std::move(impl)) {}
Manager::~Manager() = default;

Result<std::unique_ptr<Manager>> Manager::create(const Config& config) {
  RDMABUF_ASSIGN_OR_RETURN(auto impl, ManagerImpl::create(config));
  return std::unique_ptr<Manager>(new Manager(std::move(impl)));
}

Result<std::unique_ptr<Manager>> Manager::create() {
  RDMABUF_ASSIGN_OR_RETURN(Config config, Config::from_env());
  return create(config);
}

const Config& Manager::config() const {
  return impl_->config();
}
const PeerIdentity& Manager::identity() const {
  return impl_->identity();
}
const std::string& Manager::address() const {
  return impl_->identity().address;
}
std::vector<BackendInfo> Manager::backends() const {
  return impl_->backends();
}

Result<RemoteBuffer> Manager::register_buffer(LocalMemory memory) {
  return impl_->register_buffer(std::move(memory));
}

Status Manager::release(const RemoteBuffer& handle) {
  return impl_->release(handle);
}
size_t Manager::registered_count() const {
  return impl_->registered_count();
}

Result<std::string> Manager::transport_for(const RemoteBuffer& remote) {
  return impl_->transport_for(remote);
}

Transfer Manager::submit(std::vector<Op> ops, std::chrono::milliseconds timeout) {
  return impl_->submit(std::move(ops), timeout, nullptr);
}

Transfer Manager::submit(std::vector<Op> ops, std::chrono::milliseconds timeout,
                         std::function<void()> on_done) {
  return impl_->submit(std::move(ops), timeout, std::move(on_done));
}

Status Manager::read_into(const RemoteBuffer& src, const LocalMemory& dst,
                          std::optional<std::chrono::milliseconds> timeout) {
  std::vector<Op> ops;
  ops.push_back(Op::read(src, dst));
  return submit(std::move(ops), timeout.value_or(config().default_timeout)).wait();
}

Status Manager::write_from(const RemoteBuffer& dst, const LocalMemory& src,
                           std::optional<std::chrono::milliseconds> timeout) {
  std::vector<Op> ops;
  ops.push_back(Op::write(dst, src));
  return submit(std::move(ops), timeout.value_or(config().default_timeout)).wait();
}

void Manager::shutdown() {
  impl_->shutdown();
}

Result<Notification> Manager::next_notification(std::chrono::milliseconds timeout) {
  return impl_->notifications_.pop(timeout, impl_->config().busy_poll, &impl_->notice_routes_);
}

void Manager::set_notification_handler(std::function<void(const Notification&)> handler) {
  impl_->notifications_.set_handler(std::move(handler));
}

Status ManagerImpl::write_noticed(const RemoteBuffer& dst, const LocalMemory& src,
                                  const WriteNotice& notice, std::chrono::milliseconds timeout,
                                  bool& notice_sent) {
  std::vector<Op> ops;
  ops.push_back(Op::write(dst, src));
  auto state = start(std::move(ops), timeout, nullptr, &notice);
  Status done = Transfer(state).wait();
  notice_sent = state->notice_sent(0);
  return done;
}

Result<std::unique_ptr<EndpointListener>> Manager::listen(const std::string& address) {
  RDMABUF_ASSIGN_OR_RETURN(auto state, endpoint::listen_for_endpoints(*impl_, address));
  return std::unique_ptr<EndpointListener>(new EndpointListener(std::move(state)));
}

Result<std::unique_ptr<Endpoint>> Manager::connect(const std::string& address,
                                                   std::chrono::milliseconds timeout) {
  RDMABUF_ASSIGN_OR_RETURN(auto impl, endpoint::connect_endpoint(*impl_, address, timeout));
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

const char* version() {
  return RDMABUF_VERSION_STRING;
}

}  // namespace rdmabuf
