#include "backends/memory/shared_state.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/host.h"
#include "common/shared_file.h"

namespace rdmabuf::memory {
namespace {

// This thread's holder word (pid << 32 | tid), cached; a fork makes the
// child recompute it (its only thread has a new pid and tid).
std::atomic<uint32_t> g_fork_epoch{1};

uint64_t this_holder() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { g_fork_epoch.fetch_add(1); });
    return true;
  }();
  (void)registered;
  thread_local uint32_t epoch = 0;
  thread_local uint64_t holder = 0;
  uint32_t now = g_fork_epoch.load(std::memory_order_relaxed);
  if (epoch != now) {
    holder = (static_cast<uint64_t>(getpid()) << 32) | static_cast<uint32_t>(syscall(SYS_gettid));
    epoch = now;
  }
  return holder;
}

// Where a thread starts probing for a free pin entry: its last one.
thread_local uint32_t t_pin_hint = 0;

void back_off(std::chrono::steady_clock::time_point since) {
  if (std::chrono::steady_clock::now() - since < std::chrono::microseconds(200)) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

Segment::~Segment() {
  if (base_) ::munmap(base_, segment_bytes());
}

Slot& Segment::slot(uint32_t index) const {
  auto* first = reinterpret_cast<Slot*>(static_cast<char*>(base_) + sizeof(SegmentHeader));
  return first[index];
}

PinEntry& Segment::pin(uint32_t index) const {
  auto* first = reinterpret_cast<PinEntry*>(static_cast<char*>(base_) + sizeof(SegmentHeader) +
                                            sizeof(Slot) * kSlots);
  return first[index];
}

Result<std::unique_ptr<Segment>> Segment::create(uint64_t manager_id) {
  // Sealed at its size: readers open it read-write (common/shared_file.h).
  RDMABUF_ASSIGN_OR_RETURN(
      Fd fd, create_sealed_memfd("rdmabuf-state", segment_bytes(), "the shared state"));
  void* base = ::mmap(nullptr, segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED)
    return ResourceExhausted("mapping the shared state: " + errno_text(errno));
  auto segment = std::make_unique<Segment>();
  segment->fd_ = std::move(fd);
  segment->base_ = base;
  SegmentHeader& h = segment->header();  // the memfd starts zero-filled
  h.manager_id = manager_id;
  h.slots = kSlots;
  h.pins = kPins;
  h.owner_pid = static_cast<uint32_t>(getpid());
  // Published last: a reader that sees the magic sees the fields above.
  std::atomic_ref<uint64_t>(h.magic).store(kSegmentMagic, std::memory_order_release);
  return segment;
}

Result<std::unique_ptr<Segment>> Segment::open(pid_t pid, int fd, uint64_t manager_id) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // A handle names the pid and fd, and any peer may forge one: never open
  // anything but a regular file (a memfd is one), and never block opening.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return NotFound(path + " is not an rdmabuf shared state (not a regular file)");
  }
  Fd file(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!file.valid()) {
    int err = errno;
    if (err == ENOENT) return NotFound("the owner process has no shared state at " + path);
    return PermissionDenied("cannot open the owner's shared state " + path + ": " +
                            errno_text(err) +
                            " (another user, or a ptrace policy that forbids access)");
  }
  if (!sealed_at_size(file.get(), segment_bytes())) {
    return NotFound(path + " is not an rdmabuf shared state (or not sealed at its size)");
  }
  void* base = ::mmap(nullptr, segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, file.get(), 0);
  if (base == MAP_FAILED) return ResourceExhausted("mapping " + path + ": " + errno_text(errno));
  auto segment = std::make_unique<Segment>();
  segment->fd_ = std::move(file);
  segment->base_ = base;
  const SegmentHeader& h = segment->header();
  if (h.magic != kSegmentMagic || h.manager_id != manager_id || h.slots != kSlots ||
      h.pins != kPins) {
    return NotFound(path + " belongs to another manager (the owner restarted?)");
  }
  return segment;
}

// --- owner ----------------------------------------------------------------

SlotTable::SlotTable(Segment& segment) : segment_(segment) {
  free_.reserve(kSlots);
  for (uint32_t i = kSlots; i > 0; --i)
    free_.push_back(i - 1);
}

Result<std::pair<uint32_t, uint64_t>> SlotTable::publish(const void* base, uint64_t size,
                                                         const Token& token, const GpuExport* gpu,
                                                         const FileExport* file) {
  uint32_t index;
  {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      return ResourceExhausted(std::to_string(kSlots) + " buffers are registered already");
    }
    index = free_.back();
    free_.pop_back();
  }
  Slot& s = segment_.slot(index);
  uint64_t generation = (s.state.load(std::memory_order_relaxed) >> 1) + 1;
  s.base = reinterpret_cast<uint64_t>(base);
  s.size = size;
  std::memcpy(s.token, token.data(), sizeof s.token);
  s.on_gpu = gpu ? 1 : 0;
  s.gpu = gpu ? *gpu : GpuExport{};
  s.in_file = file ? 1 : 0;
  s.file = file ? *file : FileExport{};
  s.state.store(generation << 1 | 1, std::memory_order_release);
  return std::make_pair(index, generation);
}

namespace {

// Cancels the copy of `holder`, stopped while pinning `e` for `target`
// (see the header comment): empties the iovecs it published, in its own
// memory, and marks the entry. True when the holder is still stopped on the
// same pin afterwards, so it cannot be inside a copy with the old ranges;
// false when it ran meanwhile (the caller waits for it, as for any running
// holder) or its memory could not be written.
bool cancel_stopped_copy(PinEntry& e, uint64_t holder, uint64_t target) {
  const uint32_t count = e.iov_count.load(std::memory_order_seq_cst);
  // Armed uncancellable since the caller looked (the holder ran, and pinned
  // again): waited for, as any such copy.
  if (count == kUncancellableCopy) return false;
  if (count != 0) {
    const auto pid = static_cast<pid_t>(holder >> 32);
    const size_t bytes = size_t{count} * sizeof(iovec);
    std::vector<char> zeros(bytes, 0);
    for (uint64_t array : {e.local_iov.load(std::memory_order_seq_cst),
                           e.remote_iov.load(std::memory_order_seq_cst)}) {
      iovec from{zeros.data(), bytes};
      iovec to{reinterpret_cast<void*>(array), bytes};
      if (::process_vm_writev(pid, &from, 1, &to, 1, 0) != static_cast<ssize_t>(bytes)) {
        return false;
      }
    }
  }
  e.cancelled.store(1, std::memory_order_seq_cst);
  return e.target.load(std::memory_order_seq_cst) == target &&
         e.holder.load(std::memory_order_seq_cst) == holder &&
         holder_state(holder) == HolderState::kStopped;
}

}  // namespace

void SlotTable::retract(uint32_t index) {
  Slot& s = segment_.slot(index);
  const uint64_t generation = s.state.load(std::memory_order_relaxed) >> 1;
  s.state.store(generation << 1, std::memory_order_seq_cst);  // no new copies
  segment_.header().retractions.fetch_add(1, std::memory_order_release);
  const uint64_t target = slot_target(index, generation);
  const uint32_t used =
      std::min(segment_.header().pins_used.load(std::memory_order_seq_cst), kPins);
  PinEntry* const pins = &segment_.pin(0);
  for (uint32_t i = 0; i < used; ++i) {
    PinEntry& e = pins[i];
    if (e.target.load(std::memory_order_seq_cst) != target) continue;  // the common case: cheap
    const auto since = std::chrono::steady_clock::now();
    // When the holder was first seen stopped; kNotStopped while it is seen
    // running. (Not a std::optional: GCC's TSan build warns it may be read
    // uninitialized.)
    constexpr auto kNotStopped = std::chrono::steady_clock::time_point::max();
    auto stopped_since = kNotStopped;
    while (e.target.load(std::memory_order_seq_cst) == target) {
      uint64_t holder = e.holder.load(std::memory_order_acquire);
      const HolderState state = holder == 0 ? HolderState::kRunning : holder_state(holder);
      if (state == HolderState::kGone) {
        // Died holding it: reap the entry so it can be claimed again.
        uint64_t expected = target;
        e.target.compare_exchange_strong(expected, 0);
        e.holder.compare_exchange_strong(holder, 0);
        break;
      }
      if (state == HolderState::kStopped &&
          e.iov_count.load(std::memory_order_seq_cst) != kUncancellableCopy) {
        const auto now = std::chrono::steady_clock::now();
        if (stopped_since == kNotStopped) stopped_since = now;
        if (now - stopped_since >= kStoppedReaderGrace && cancel_stopped_copy(e, holder, target)) {
          break;
        }
      } else {
        stopped_since = kNotStopped;
      }
      back_off(since);
    }
  }
  std::lock_guard lock(mu_);
  free_.push_back(index);
}

// --- reader ---------------------------------------------------------------

Status Pin::acquire(Segment& segment, uint32_t slot, uint64_t generation, bool uncancellable) {
  reset();
  const uint64_t me = this_holder();
  PinEntry* claimed = nullptr;
  for (uint32_t i = 0; i < kPins && !claimed; ++i) {
    uint32_t index = (t_pin_hint + i) % kPins;
    PinEntry& e = segment.pin(index);
    uint64_t expected = 0;
    if (e.holder.load(std::memory_order_relaxed) == 0 &&
        e.holder.compare_exchange_strong(expected, me, std::memory_order_acq_rel)) {
      t_pin_hint = index;
      claimed = &e;
    }
  }
  // Every entry is taken: take over one whose holder died. Claiming it with
  // a compare-exchange of the dead holder makes it ours in one step, so no
  // live claimer's target is ever overwritten.
  for (uint32_t i = 0; i < kPins && !claimed; ++i) {
    PinEntry& e = segment.pin(i);
    uint64_t holder = e.holder.load(std::memory_order_acquire);
    if (holder != 0 && holder_state(holder) == HolderState::kGone &&
        e.holder.compare_exchange_strong(holder, me, std::memory_order_acq_rel)) {
      claimed = &e;
    }
  }
  if (!claimed) {
    return ResourceExhausted("all " + std::to_string(kPins) +
                             " copy slots of the owner are in use");
  }
  // Raised before the target is stored: an owner that retracts the slot
  // after that store scans this entry.
  const auto used = static_cast<uint32_t>(claimed - &segment.pin(0)) + 1;
  std::atomic<uint32_t>& pins_used = segment.header().pins_used;
  uint32_t seen = pins_used.load(std::memory_order_seq_cst);
  while (seen < used && !pins_used.compare_exchange_weak(seen, used, std::memory_order_seq_cst)) {
  }
  // An entry taken over from a dead holder may carry its copy's leftovers.
  // Ordered before the target by its seq_cst store: an owner that sees the
  // target sees these.
  claimed->iov_count.store(uncancellable ? kUncancellableCopy : 0, std::memory_order_relaxed);
  claimed->cancelled.store(0, std::memory_order_relaxed);
  claimed->target.store(slot_target(slot, generation), std::memory_order_seq_cst);
  entry_ = claimed;
  segment_ = &segment;
  slot_ = slot;
  generation_ = generation;
  if (segment.slot(slot).state.load(std::memory_order_seq_cst) != (generation << 1 | 1)) {
    reset();
    return NotFound("the owner released this buffer");
  }
  return Status::Ok();
}

Status Pin::arm(const iovec* local, const iovec* remote, size_t count) {
  entry_->local_iov.store(reinterpret_cast<uint64_t>(local), std::memory_order_relaxed);
  entry_->remote_iov.store(reinterpret_cast<uint64_t>(remote), std::memory_order_relaxed);
  entry_->iov_count.store(static_cast<uint32_t>(count), std::memory_order_seq_cst);
  if (segment_->slot(slot_).state.load(std::memory_order_seq_cst) != (generation_ << 1 | 1)) {
    reset();
    return NotFound("the owner released this buffer");
  }
  return Status::Ok();
}

Status Pin::arm_uncancellable() {
  entry_->iov_count.store(kUncancellableCopy, std::memory_order_seq_cst);
  if (segment_->slot(slot_).state.load(std::memory_order_seq_cst) != (generation_ << 1 | 1)) {
    reset();
    return NotFound("the owner released this buffer");
  }
  return Status::Ok();
}

void Pin::reset() {
  if (!entry_) return;
  entry_->iov_count.store(0, std::memory_order_relaxed);
  entry_->cancelled.store(0, std::memory_order_relaxed);
  entry_->target.store(0, std::memory_order_release);
  entry_->holder.store(0, std::memory_order_release);
  entry_ = nullptr;
  segment_ = nullptr;
}

HolderState holder_state(uint64_t holder) {
  const auto pid = static_cast<pid_t>(holder >> 32);
  const auto tid = static_cast<pid_t>(holder & 0xffffffffu);
  if (syscall(SYS_tgkill, pid, tid, 0) != 0 && errno == ESRCH) return HolderState::kGone;
  // Unreadable (gone since, or hidden from us): counted as running, so
  // waited for.
  const std::string text =
      read_small_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
  const size_t close = text.rfind(')');  // the name may contain spaces and parentheses
  if (close == std::string::npos || close + 2 >= text.size()) return HolderState::kRunning;
  switch (text[close + 2]) {
    case 'T':
    case 't':
      return HolderState::kStopped;
    case 'Z':
    case 'X':
      return HolderState::kGone;
    default:
      return HolderState::kRunning;
  }
}

}  // namespace rdmabuf::memory
