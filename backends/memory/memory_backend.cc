#include "backends/memory/memory_backend.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "backends/memory/file_mappings.h"
#include "backends/memory/gpu_copy.h"
#include "backends/memory/handle_context.h"
#include "backends/memory/shared_state.h"
#include "common/atomic_word.h"
#include "common/copy.h"
#include "common/file_backing.h"
#include "common/host.h"
#include "common/log.h"
#include "common/op_extents.h"
#include "common/op_text.h"
#include "common/scratch.h"
#include "common/strings.h"

namespace rdmabuf::memory {
namespace {

// Ops up to this size are batched, many to one syscall (process_vm_* take
// up to IOV_MAX ranges per call).
constexpr uint64_t kSmallOp = 64 << 10;
constexpr size_t kMaxBatch = 1024;
constexpr uint64_t kMaxBatchBytes = 4 << 20;
// Large ops are cut into pieces copied in parallel by the caller and the
// helper threads; a piece is also how long release() may wait for a copy.
constexpr uint64_t kMinPiece = 256 << 10;
constexpr uint64_t kMaxPiece = 16 << 20;
constexpr size_t kMaxHelpers = 7;
// Owners seen are pruned (exited ones forgotten) when this many are known.
constexpr size_t kPruneViewsAt = 64;

int read_ptrace_scope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (in >> scope) return scope;
  return -1;  // no Yama: classic ptrace rules (same user, dumpable)
}

uint64_t next_serial() {
  static std::atomic<uint64_t> serial{0};
  return serial.fetch_add(1) + 1;
}

// One owner, as seen by this reader: whether it can be reached and, if so,
// its process and mapped shared state.
struct OwnerView {
  Status usable;
  pid_t pid = 0;
  Fd pidfd;
  std::unique_ptr<Segment> segment;
  std::unique_ptr<GpuMappings> gpu;     // its buffers in GPU memory, as mapped here
  std::unique_ptr<FileMappings> files;  // its buffers in shared files, as mapped here
  std::atomic<bool> exited{false};
  // When the pidfd was last asked (CLOCK_MONOTONIC_COARSE, ns), for
  // recently_alive().
  std::atomic<int64_t> checked_at{0};

  // False once the owner process has exited (checked with its pidfd, so a
  // reused pid can never be mistaken for the owner).
  bool alive() {
    if (exited.load(std::memory_order_relaxed)) return false;
    pollfd p{pidfd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) exited.store(true);
    return !exited.load(std::memory_order_relaxed);
  }

  // alive(), asking the pidfd at most once per tick of the coarse clock: a
  // copy through a mapping of the owner's file makes no system call that
  // would notice the owner exited, and a poll() per op would cost more than
  // the copy. False for an op that starts a tick or more after the owner
  // exited; one that starts sooner may copy as if just before.
  bool recently_alive() {
    if (exited.load(std::memory_order_relaxed)) return false;
    // The coarse clock (a read of the kernel's tick, no fence) advances
    // once a tick (1 to 10 ms): the pidfd is asked once a tick at most.
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    const int64_t now = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
    if (now == checked_at.load(std::memory_order_relaxed)) return true;
    checked_at.store(now, std::memory_order_relaxed);
    return alive();
  }
};

// The indices of a job's ops: the first in place (most jobs have one op,
// and then no allocation), all of them in a vector once there are more.
class OpIndices {
 public:
  OpIndices() = default;
  OpIndices(std::initializer_list<uint32_t> indices) {
    for (uint32_t i : indices)
      push_back(i);
  }
  void push_back(uint32_t i) {
    if (count_ == 0) {
      one_ = i;
    } else {
      if (count_ == 1) many_.push_back(one_);
      many_.push_back(i);
    }
    ++count_;
  }
  size_t size() const { return count_; }
  const uint32_t* begin() const { return count_ <= 1 ? &one_ : many_.data(); }
  const uint32_t* end() const { return begin() + count_; }

 private:
  size_t count_ = 0;
  uint32_t one_ = 0;
  std::vector<uint32_t> many_;
};

// A unit of copying: a batch of small ops, or one piece of a large op.
struct Job {
  std::shared_ptr<TransferState> transfer;
  std::shared_ptr<OwnerView> view;
  OpKind kind = OpKind::kReadIntoLocal;
  uint32_t slot = 0;
  uint64_t generation = 0;
  OpIndices ops;              // a batch; or the single op of a piece
  uint64_t piece_offset = 0;  // within the op, for a piece
  uint64_t piece_length = 0;  // 0: whole ops (a batch)
};

class MemoryBackend final : public Backend {
 public:
  MemoryBackend(const BackendEnv& env, std::unique_ptr<Segment> segment, int ptrace_scope)
      : env_(env),
        segment_(std::move(segment)),
        slots_(*segment_),
        host_id_(this_host_id()),
        pid_namespace_(pid_namespace_id()),
        ptrace_scope_(ptrace_scope) {
    unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    helpers_wanted_ = std::min<size_t>(cpus - 1, kMaxHelpers);
  }
  ~MemoryBackend() override { shutdown(); }

  std::string_view name() const override { return "memory"; }
  TransportLevel level() const override { return TransportLevel::kMemory; }

  BackendInfo info() const override {
    BackendInfo info{"memory", TransportLevel::kMemory, true, "", {}};
    info.details.emplace_back("pid namespace", std::to_string(pid_namespace_));
    info.details.emplace_back(
        "ptrace_scope", ptrace_scope_ < 0 ? std::string("no Yama") : std::to_string(ptrace_scope_));
    info.details.emplace_back("copy threads", std::to_string(helpers_wanted_ + 1));
    info.details.emplace_back("owner files mapped", std::to_string(mapping_counters_.made.load()));
    info.details.emplace_back("owner file mappings reused",
                              std::to_string(mapping_counters_.reused.load()));
    return info;
  }

  // --- owner side ---------------------------------------------------------

  Result<BackendContext> register_memory(uint64_t id, const LocalMemory& memory,
                                         const Token& token) override {
    GpuExport gpu;
    if (memory.on_gpu()) {
      RDMABUF_ASSIGN_OR_RETURN(gpu, export_gpu_memory(memory));
    }
    // Host memory in a shared file is published with the file, which stays
    // open here while the buffer is registered (LocalMemory::allocate's
    // memory keeps its own descriptor open: registered, it is kept alive).
    std::optional<FileBacking> backing;
    FileExport file;
    if (!memory.on_gpu()) backing = find_file_backing(memory.data(), memory.size());
    if (backing) {
      file.offset = backing->offset;
      file.device = backing->device;
      file.inode = backing->inode;
      file.fd = static_cast<uint32_t>(backing->number);
      file.sealed = backing->sealed ? 1 : 0;
    }
    RDMABUF_ASSIGN_OR_RETURN(auto published, slots_.publish(memory.data(), memory.size(), token,
                                                            memory.on_gpu() ? &gpu : nullptr,
                                                            backing ? &file : nullptr));
    {
      std::lock_guard lock(owned_mu_);
      owned_[id] = Owned{published.first, backing ? std::move(backing->fd) : Fd()};
    }
    HandleContext c;
    c.pid = static_cast<uint32_t>(getpid());
    c.pid_namespace = pid_namespace_;
    c.state_fd = static_cast<uint32_t>(segment_->fd());
    c.slot = published.first;
    c.generation = published.second;
    c.base = reinterpret_cast<uint64_t>(memory.data());
    c.segment_address = reinterpret_cast<uint64_t>(segment_->address());
    return BackendContext{"memory", encode_context(c)};
  }

  void unregister_memory(uint64_t id) override {
    Owned owned;
    {
      std::lock_guard lock(owned_mu_);
      auto it = owned_.find(id);
      if (it == owned_.end()) return;
      owned = std::move(it->second);
      owned_.erase(it);
    }
    slots_.retract(owned.slot);  // returns once no reader copies from it
    // owned.file closes here: no reader opens it once the slot is retracted.
  }

  // --- reader side --------------------------------------------------------

  Status can_reach(const RemoteBuffer& remote) const override {
    const BackendContext* ctx = remote.context("memory");
    if (!ctx) return FailedPrecondition("the owner does not offer it");
    auto c = decode_context(ctx->data);
    if (!c.ok()) return c.status();
    auto view = const_cast<MemoryBackend*>(this)->view_for(remote.owner(), *c);
    if (!view->usable.ok()) return view->usable;
    // Cheap (no syscall): every copy checks the owner's pidfd itself.
    if (view->exited.load(std::memory_order_relaxed)) {
      return Unavailable("the owner process has exited");
    }
    return Status::Ok();
  }

  // Atomics are applied by this process's CPU to the owner's buffer mapped
  // from its shared file: the same memory the owner's manager applies other
  // peers' atomics to, so they are atomic with each other. Other memory
  // (process_vm_writev cannot be atomic) goes to the owner's manager.
  Status can_apply_atomics(const RemoteBuffer& remote) const override {
    const BackendContext* ctx = remote.context("memory");
    if (!ctx) return FailedPrecondition("the owner does not offer it");
    RDMABUF_ASSIGN_OR_RETURN(HandleContext c, decode_context(ctx->data));
    auto view = const_cast<MemoryBackend*>(this)->view_for(remote.owner(), c);
    if (!view->usable.ok()) return view->usable;
    // A hint, as remote_on_gpu's: apply_atomics checks again under its pin.
    const Slot& slot = view->segment->slot(c.slot);
    if (slot.on_gpu) return FailedPrecondition("the owner's buffer is in GPU memory");
    if (!slot.in_file) {
      return FailedPrecondition(
          "atomics need the owner's buffer mapped here, and it is not in a shared file");
    }
    return Status::Ok();
  }

  Status takes_local_memory(const LocalMemory& local, const RemoteBuffer& remote) const override {
    if (!local.on_gpu() || remote_on_gpu(remote)) return Status::Ok();
    return FailedPrecondition(
        "memory: the owner's buffer is in host memory, which cross-memory attach cannot copy "
        "to a GPU");
  }

  void submit(const std::shared_ptr<TransferState>& transfer,
              std::span<const uint32_t> indices) override {
    Scratch<std::vector<Job>, struct SubmitJobs> scratch;
    std::vector<Job>& jobs = scratch.get();
    jobs.clear();
    size_t batch = SIZE_MAX;  // index of the batch being filled, if any
    uint64_t batch_bytes = 0;
    uint64_t total_bytes = 0;
    // Ops of one batch mostly share a handle (slices of it): decode its
    // context and find its owner once per handle, not once per op.
    const std::vector<BackendContext>* last_handle = nullptr;
    Result<HandleContext> c = HandleContext{};  // decoded at the first op: last_handle is null
    std::shared_ptr<OwnerView> view;
    for (uint32_t i : indices) {
      const Op& op = transfer->op(i);
      if (&op.remote.contexts() != last_handle) {
        last_handle = &op.remote.contexts();
        c = decode_context(op.remote.context("memory")->data);
        if (c.ok()) view = view_for(op.remote.owner(), *c);
      }
      if (!c.ok()) {
        transfer->fail_op(i, c.status().with_context(describe_op(op)));
        continue;
      }
      const uint64_t bytes = op.bytes();
      total_bytes += bytes;
      if (view->usable.ok() && view->segment->slot(c->slot).on_gpu) {
        // One copy by the GPU, whatever its size (a hint: copy() checks
        // the slot again under its pin).
        batch = SIZE_MAX;
        jobs.push_back(Job{transfer, view, op.kind, c->slot, c->generation, {i}, 0, 0});
        continue;
      }
      if (bytes <= kSmallOp) {
        bool fits = batch != SIZE_MAX && jobs[batch].view == view && jobs[batch].kind == op.kind &&
                    jobs[batch].slot == c->slot && jobs[batch].generation == c->generation &&
                    jobs[batch].ops.size() < kMaxBatch && batch_bytes + bytes <= kMaxBatchBytes;
        if (!fits) {
          jobs.push_back(Job{transfer, view, op.kind, c->slot, c->generation, {}, 0, 0});
          batch = jobs.size() - 1;
          batch_bytes = 0;
        }
        jobs[batch].ops.push_back(i);
        batch_bytes += bytes;
        continue;
      }
      batch = SIZE_MAX;  // keep ops in order around a large one
      const uint64_t piece =
          std::clamp<uint64_t>(bytes / (helpers_wanted_ + 1), kMinPiece, kMaxPiece);
      const uint64_t pieces = (bytes + piece - 1) / piece;
      if (pieces > 1) transfer->expect_parts(i, static_cast<uint32_t>(pieces));
      for (uint64_t p = 0; p < pieces; ++p) {
        uint64_t offset = p * piece;
        jobs.push_back(Job{transfer,
                           view,
                           op.kind,
                           c->slot,
                           c->generation,
                           {i},
                           offset,
                           std::min(piece, bytes - offset)});
      }
    }
    if (jobs.size() > 1 && total_bytes >= 2 * kMinPiece && helpers_wanted_ > 0) {
      run_in_parallel(std::move(jobs));
    } else {
      // The first job starts as the transfer does, before its deadline.
      for (size_t j = 0; j < jobs.size(); ++j)
        run(jobs[j], /*check_deadline=*/j > 0);
      jobs.clear();  // keeps the capacity, not the transfer
    }
  }

  void shutdown() override {
    std::vector<std::thread> helpers;
    {
      std::lock_guard lock(queue_mu_);
      stopping_ = true;
      helpers.swap(helpers_);
    }
    queue_cv_.notify_all();
    for (auto& t : helpers)
      t.join();
  }

 private:
  std::shared_ptr<OwnerView> view_for(const PeerIdentity& owner, const HandleContext& c) {
    // A thread's ops mostly go to one owner: the last one this thread asked
    // for is looked up without the lock (routing and copying an op ask twice).
    struct LastView {
      uint64_t backend = 0;
      uint64_t manager_id = 0;
      uint32_t pid = 0;
      std::weak_ptr<OwnerView> view;
    };
    thread_local LastView last;
    if (last.backend == serial_ && last.manager_id == owner.manager_id && last.pid == c.pid) {
      if (auto view = last.view.lock()) return view;
    }
    auto view = find_or_examine(owner, c);
    last = LastView{serial_, owner.manager_id, c.pid, view};
    return view;
  }

  std::shared_ptr<OwnerView> find_or_examine(const PeerIdentity& owner, const HandleContext& c) {
    const std::pair<uint64_t, uint32_t> key{owner.manager_id, c.pid};
    {
      std::shared_lock lock(views_mu_);
      auto it = views_.find(key);
      if (it != views_.end()) return it->second;
    }
    auto view = std::make_shared<OwnerView>();
    view->usable = examine(owner, c, *view);
    if (!view->usable.ok()) {
      RDMABUF_LOG_INFO("memory: cannot reach " + owner.to_string() + ": " + view->usable.message());
    }
    std::unique_lock lock(views_mu_);
    // Owners that exited since: their buffers' pages are freed only once no
    // process maps them.
    for (auto& [known, other] : views_) {
      if (other->usable.ok() && !other->alive()) other->files->clear();
    }
    if (views_.size() >= kPruneViewsAt) {
      // Forget owners that have exited (or could never be reached).
      for (auto it = views_.begin(); it != views_.end();) {
        bool stale =
            it->second.use_count() == 1 && (!it->second->usable.ok() || !it->second->alive());
        it = stale ? views_.erase(it) : std::next(it);
      }
    }
    return views_.emplace(key, std::move(view)).first->second;
  }

  // Whether cross-memory attach to this owner works from here, and why not.
  Status examine(const PeerIdentity& owner, const HandleContext& c, OwnerView& view) {
    if (owner.host_id != host_id_) return FailedPrecondition("the peer is on another host");
    if (c.pid_namespace != pid_namespace_ || pid_namespace_ == 0) {
      return FailedPrecondition("the peer is in another PID namespace (another container?)");
    }
    view.pid = static_cast<pid_t>(c.pid);
    // The pidfd first: if the pid is reused later, the pidfd still refers to
    // the owner (and says it exited); the segment check below proves that
    // the pidfd's process is the owner.
    view.pidfd = Fd(static_cast<int>(syscall(SYS_pidfd_open, view.pid, 0)));
    if (!view.pidfd.valid()) {
      return errno == ESRCH ? Unavailable("the owner process has exited")
                            : FailedPrecondition("pidfd_open: " + errno_text(errno));
    }
    auto segment = Segment::open(view.pid, static_cast<int>(c.state_fd), owner.manager_id);
    if (!segment.ok()) return segment.status();
    view.segment = std::move(segment).value();
    // Probe the kernel's permission with a copy of the owner's segment
    // header from its own address space.
    uint64_t magic = 0;
    iovec local{&magic, sizeof magic};
    iovec remote{reinterpret_cast<void*>(c.segment_address), sizeof magic};
    if (::process_vm_readv(view.pid, &local, 1, &remote, 1, 0) != sizeof magic) {
      return FailedPrecondition("process_vm_readv is not permitted: " + errno_text(errno) +
                                " (kernel.yama.ptrace_scope, another user, or a non-dumpable "
                                "owner)");
    }
    if (magic != kSegmentMagic) {
      return FailedPrecondition("the owner's shared state is not where its handle says");
    }
    if (!view.alive()) return Unavailable("the owner process has exited");
    view.gpu = std::make_unique<GpuMappings>(view.pid, view.pid == ::getpid());
    view.files = std::make_unique<FileMappings>(view.pid, mapping_counters_);
    return Status::Ok();
  }

  // Copies what `job` names and completes its parts. `check_deadline`:
  // whether the transfer may have run out of time before this job starts
  // (false for its first job, run inside submit(): no clock read).
  void run(Job& job, bool check_deadline = true) {
    TransferState& t = *job.transfer;
    auto complete_all = [&](const Status& st) {
      for (uint32_t i : job.ops)
        t.complete_part(i, st.ok() ? st : with_op(t, i, st));
    };
    if ((check_deadline ? t.enforce_deadline() : t.finished()) || !job.view->usable.ok()) {
      complete_all(job.view->usable.ok() ? Cancelled("cancelled") : job.view->usable);
      return;
    }
    if (!t.begin_touch()) {  // cancelled: never touch its memory
      complete_all(Cancelled("cancelled"));
      return;
    }
    if (is_atomic_kind(job.kind)) {
      std::vector<Status> each;
      bool hand_on = false;
      Status st = apply_atomics(job, each, &hand_on);
      t.end_touch();
      if (hand_on) {  // none applied: the owner's manager applies them
        env_.router->reroute(
            job.transfer, std::span<const uint32_t>(job.ops.begin(), job.ops.size()), "memory", st);
      } else if (!st.ok()) {
        complete_all(st);
      } else {
        for (size_t k = 0; k < each.size(); ++k) {
          const uint32_t i = job.ops.begin()[k];
          t.complete_part(i, each[k].ok() ? each[k] : with_op(t, i, each[k]));
        }
      }
      return;
    }
    Status st = copy(job);
    t.end_touch();
    if (!st.ok() && job.ops.size() > 1) {
      // One op of the batch may be the culprit (a bad range on one side):
      // copy each on its own so that each reports its own status.
      for (uint32_t i : job.ops) {
        Job single{job.transfer, job.view, job.kind, job.slot, job.generation, {i}, 0, 0};
        run(single);
      }
      return;
    }
    complete_all(st);
  }

  // Calls fn(op, extent) for every extent `job` copies, in order: each of
  // its ops' whole sequence (a batch), or its piece of one op.
  template <class Fn>
  static void for_each_job_extent(const Job& job, Fn&& fn) {
    for (uint32_t i : job.ops) {
      const Op& op = job.transfer->op(i);
      const uint64_t offset = job.piece_length ? job.piece_offset : 0;
      const uint64_t length = job.piece_length ? job.piece_length : op.bytes();
      for_each_extent(op, offset, length, [&](const Extent& e) { fn(op, e); });
    }
  }

  static Status with_op(const TransferState& t, uint32_t i, const Status& st) {
    return Status(st.code(), describe_op(t.op(i)) + ": " + st.message());
  }

  // What the owner's slot says against what a handle claims: its buffer's
  // size and token (constant time). The op's range lies within the
  // handle's claimed size (RemoteBuffer::slice), so within the buffer once
  // the sizes match.
  static Status check_against_slot(const Slot& slot, const RemoteBuffer& remote) {
    if (slot.size != remote.region_size()) {
      return InvalidArgument("the handle's buffer size does not match the owner's");
    }
    uint8_t diff = 0;
    for (size_t b = 0; b < sizeof slot.token; ++b) {
      diff |= static_cast<uint8_t>(slot.token[b] ^ remote.token()[b]);
    }
    if (diff != 0) return PermissionDenied("the owner refused the handle's token");
    return Status::Ok();
  }

  // The copy itself, under a pin on the buffer's slot.
  Status copy(Job& job) {
    OwnerView& view = *job.view;
    // Mappings of buffers the owner has released close at the next op
    // towards it (a released buffer's own op included).
    view.gpu->sweep(*view.segment);
    view.files->sweep(*view.segment);
    const Slot& slot = view.segment->slot(job.slot);
    // Copies of mapped and GPU memory are armed uncancellable as they pin
    // (the slot's kind read before the pin is a hint: checked again below).
    const bool uncancellable = slot.in_file != 0 || slot.on_gpu != 0;
    Pin pin;
    RDMABUF_RETURN_IF_ERROR(pin.acquire(*view.segment, job.slot, job.generation, uncancellable));
    // Every op against the owner's record, stable while pinned: ops share a
    // job by slot and generation, which a forged handle shares with the
    // genuine one, so each op's own size and token are checked.
    for (uint32_t i : job.ops) {
      RDMABUF_RETURN_IF_ERROR(check_against_slot(slot, job.transfer->op(i).remote));
    }
    if (slot.in_file) {
      if (!view.recently_alive()) {
        view.files->clear();
        return Unavailable("the owner process has exited");
      }
      // Where the file cannot be mapped here (a file mode, a seal, no room
      // for another mapping): through the kernel, as other memory.
      auto at = view.files->address_of(slot, job.slot, job.generation);
      if (at.ok()) return copy_mapped(job, *at, pin);
    }
    if (!view.alive()) return Unavailable("the owner process has exited");
    if (slot.on_gpu) return copy_gpu(job, slot, pin);
    for (uint32_t i : job.ops) {
      if (job.transfer->op(i).local.on_gpu()) {  // the manager stages these
        return Internal("memory: GPU local memory for a buffer in host memory");
      }
    }

    std::vector<iovec> local, remote;
    local.reserve(job.ops.size());
    remote.reserve(job.ops.size());
    for_each_job_extent(job, [&](const Op& op, const Extent& e) {
      char* l = reinterpret_cast<char*>(op.local.data()) + e.local_offset;
      char* r = reinterpret_cast<char*>(slot.base + op.remote.offset() + e.remote_offset);
      // Ranges adjacent on both sides (slices of one tensor, say) become
      // one: the kernel pins and copies per range, so 1024 adjacent 4 KiB
      // ops cost as much as one 4 MiB op rather than a thousand syscalls' worth.
      if (!local.empty() && static_cast<char*>(local.back().iov_base) + local.back().iov_len == l &&
          static_cast<char*>(remote.back().iov_base) + remote.back().iov_len == r) {
        local.back().iov_len += e.length;
        remote.back().iov_len += e.length;
        return;
      }
      local.push_back({l, e.length});
      remote.push_back({r, e.length});
    });
    uint64_t expected = 0;  // counted before the owner may see (and empty) the ranges
    for (const iovec& v : local)
      expected += v.iov_len;
    RDMABUF_RETURN_IF_ERROR(pin.arm(local.data(), remote.data(), local.size()));
    return transfer_all(view.pid, job.kind, local, remote, expected, pin);
  }

  // Applies the atomics of `job` with this CPU's atomic instructions on the
  // owner's buffer, mapped here from its shared file, under a pin. Each op's
  // status goes to `each`, in order. Non-OK when none was applied (every op
  // fails with it); with `*hand_on` set when the buffer cannot be mapped
  // here after all, for the owner's manager to apply them instead.
  Status apply_atomics(Job& job, std::vector<Status>& each, bool* hand_on) {
    OwnerView& view = *job.view;
    view.files->sweep(*view.segment);
    const Slot& slot = view.segment->slot(job.slot);
    Pin pin;
    RDMABUF_RETURN_IF_ERROR(pin.acquire(*view.segment, job.slot, job.generation,
                                        /*uncancellable=*/slot.in_file != 0));
    if (slot.on_gpu) return InvalidArgument("atomics on GPU memory are not supported");
    if (!slot.in_file) {
      *hand_on = true;
      return FailedPrecondition("the owner's buffer is not in a shared file");
    }
    if (!view.recently_alive()) {
      view.files->clear();
      return Unavailable("the owner process has exited");
    }
    auto at = view.files->address_of(slot, job.slot, job.generation);
    if (!at.ok()) {
      *hand_on = true;
      return at.status();
    }
    if (!pin.armed_uncancellable()) RDMABUF_RETURN_IF_ERROR(pin.arm_uncancellable());
    for (uint32_t i : job.ops) {
      const Op& op = job.transfer->op(i);
      // Each op's own size and token (a forged handle shares the slot).
      Status genuine = check_against_slot(slot, op.remote);
      if (!genuine.ok()) {
        each.push_back(genuine);
        continue;
      }
      std::byte* word = at->base + op.remote.offset();
      if (!atomic_word_aligned(word)) {
        each.push_back(InvalidArgument("the word is not 8-byte aligned in its owner's memory"));
        continue;
      }
      const uint64_t previous = apply_atomic(word, op.kind, op.operand, op.compare);
      std::memcpy(op.local.data(), &previous, sizeof previous);
      each.push_back(Status::Ok());
    }
    return Status::Ok();
  }

  // The copy of a buffer in GPU memory, by the CUDA driver, under `pin`.
  Status copy_gpu(Job& job, const Slot& slot, Pin& pin) {
    OwnerView& view = *job.view;
    if (!pin.armed_uncancellable()) RDMABUF_RETURN_IF_ERROR(pin.arm_uncancellable());
    // `at` keeps the mapping open until the copy has returned.
    RDMABUF_ASSIGN_OR_RETURN(auto at, view.gpu->address_of(slot, job.slot, job.generation));
    std::vector<GpuRange> ranges;
    ranges.reserve(job.ops.size());
    for_each_job_extent(job, [&](const Op& op, const Extent& e) {
      ranges.push_back(GpuRange{op.local.data() + e.local_offset,
                                at.base + op.remote.offset() + e.remote_offset, e.length});
    });
    return copy_gpu_ranges(job.kind, ranges, at.device);
  }

  // The copy of a buffer in a shared file, through this process's mapping
  // of it (`at`), under `pin`: loads and stores, no system call.
  // `at` keeps the mapping until the copy has returned.
  Status copy_mapped(Job& job, const FileMappings::Address& at, Pin& pin) {
    if (!pin.armed_uncancellable()) RDMABUF_RETURN_IF_ERROR(pin.arm_uncancellable());
    for_each_job_extent(job, [&](const Op& op, const Extent& e) {
      std::byte* local = op.local.data() + e.local_offset;
      std::byte* remote = at.base + op.remote.offset() + e.remote_offset;
      // Inline up to 32 bytes (an 8 B op is a load and a store), memcpy
      // beyond, whose choice of method by size glibc tunes to the CPU.
      if (job.kind == OpKind::kReadIntoLocal) {
        copy_short(local, remote, e.length);
      } else {
        copy_short(remote, local, e.length);
      }
    });
    return Status::Ok();
  }

  // Whether the owner's buffer is in GPU memory, as its slot says now (a
  // hint: the copy checks again under its pin). False when it cannot tell.
  bool remote_on_gpu(const RemoteBuffer& remote) const {
    const BackendContext* ctx = remote.context("memory");
    if (!ctx) return false;
    auto c = decode_context(ctx->data);
    if (!c.ok()) return false;
    auto view = const_cast<MemoryBackend*>(this)->view_for(remote.owner(), *c);
    return view->usable.ok() && view->segment->slot(c->slot).on_gpu != 0;
  }

  // process_vm_readv/writev until everything moved or an error. The iovecs
  // are armed on `pin`: a releasing owner may empty them while this thread
  // is stopped (shared_state.h), so their contents are never trusted to
  // stay as built: the bytes moved are counted against `expected`, what the
  // ranges held before they were armed, and a shortfall fails the copy.
  static Status transfer_all(pid_t pid, OpKind kind, std::vector<iovec>& local,
                             std::vector<iovec>& remote, uint64_t expected, const Pin& pin) {
    uint64_t done = 0;
    size_t at = 0;  // first range not fully moved; local and remote pair up
    while (at < local.size()) {
      // The kernel takes at most IOV_MAX ranges per call.
      const auto count = static_cast<unsigned long>(std::min<size_t>(local.size() - at, IOV_MAX));
      ssize_t n = kind == OpKind::kReadIntoLocal
                      ? ::process_vm_readv(pid, &local[at], count, &remote[at], count, 0)
                      : ::process_vm_writev(pid, &local[at], count, &remote[at], count, 0);
      if (n < 0) {
        int err = errno;
        if (err == EINTR) continue;
        if (err == ESRCH) return Unavailable("the owner process has exited");
        if (err == EFAULT) {
          return Internal(
              "memory not mapped on one side of the copy (local memory freed, or "
              "the owner freed its buffer without releasing it)");
        }
        return Unavailable(
            std::string(kind == OpKind::kReadIntoLocal ? "process_vm_readv" : "process_vm_writev") +
            ": " + errno_text(err));
      }
      if (n == 0) break;
      done += static_cast<uint64_t>(n);
      size_t moved = static_cast<size_t>(n);
      while (moved > 0 && at < local.size()) {
        size_t take = std::min(moved, local[at].iov_len);
        local[at].iov_base = static_cast<char*>(local[at].iov_base) + take;
        local[at].iov_len -= take;
        remote[at].iov_base = static_cast<char*>(remote[at].iov_base) + take;
        remote[at].iov_len -= take;
        moved -= take;
        if (local[at].iov_len == 0) ++at;
      }
      while (at < local.size() && local[at].iov_len == 0)
        ++at;
    }
    if (done == expected) return Status::Ok();
    if (pin.cancelled()) {
      return NotFound(
          "the owner released this buffer while this thread was stopped inside the copy; the "
          "copy was cancelled");
    }
    return Internal("cross-memory copy made no progress");
  }

  // The caller copies alongside the helper threads until no job is left;
  // the helpers finish the jobs they took after the caller returns.
  void run_in_parallel(std::vector<Job> jobs) {
    {
      std::lock_guard lock(queue_mu_);
      if (stopping_) {
        for (Job& job : jobs) {
          for (uint32_t i : job.ops)
            job.transfer->complete_part(i, Cancelled("shutting down"));
        }
        return;
      }
      while (helpers_.size() < helpers_wanted_)
        helpers_.emplace_back([this] { help(); });
      for (Job& job : jobs)
        queue_.push_back(std::move(job));
    }
    queue_cv_.notify_all();
    while (true) {
      Job job;
      {
        std::lock_guard lock(queue_mu_);
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      run(job);
    }
  }

  void help() {
    std::unique_lock lock(queue_mu_);
    while (true) {
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      run(job);
      lock.lock();
    }
  }

  BackendEnv env_;
  // Tells this backend from any other in this process, before or after it.
  const uint64_t serial_ = next_serial();
  std::unique_ptr<Segment> segment_;
  SlotTable slots_;
  const std::string host_id_;
  const uint64_t pid_namespace_;
  const int ptrace_scope_;
  size_t helpers_wanted_ = 0;

  // A registered buffer: its slot, and its shared file if it lies in one.
  struct Owned {
    uint32_t slot = 0;
    Fd file;
  };
  std::mutex owned_mu_;
  std::unordered_map<uint64_t, Owned> owned_;  // buffer id -> its slot. Guarded by owned_mu_.

  MappingCounters mapping_counters_;  // before views_: their mappings count here
  std::shared_mutex views_mu_;
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<OwnerView>> views_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Job> queue_;
  std::vector<std::thread> helpers_;
  bool stopping_ = false;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_memory_backend(const BackendEnv& env) {
  const int scope = read_ptrace_scope();
  if (scope >= 3) {
    return FailedPrecondition("kernel.yama.ptrace_scope=3 forbids cross-memory attach");
  }
  if (scope == 2 && geteuid() != 0) {
    return FailedPrecondition("kernel.yama.ptrace_scope=2 allows cross-memory attach to root only");
  }
  if (scope == 1) {
    // Yama lets only ancestors attach by default; readers are rarely ours.
    // Any process of this user may then read and write this process's
    // memory, which the same user could do through ptrace anyway.
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0) {
      return FailedPrecondition("kernel.yama.ptrace_scope=1 and PR_SET_PTRACER failed: " +
                                errno_text(errno));
    }
  }
  if (pid_namespace_id() == 0) {
    return FailedPrecondition("cannot tell this process's PID namespace (/proc not mounted?)");
  }
  RDMABUF_ASSIGN_OR_RETURN(auto segment, Segment::create(env.self.manager_id));
  return std::unique_ptr<Backend>(new MemoryBackend(env, std::move(segment), scope));
}

}  // namespace rdmabuf::memory
