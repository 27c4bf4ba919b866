#include "core/endpoint/shm_channel.h"

#include <fcntl.h>
#include <sched.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "common/copy.h"
#include "common/host.h"
#include "common/membarrier.h"
#include "common/shared_file.h"

namespace rdmabuf {
namespace {

// "REPCHN2": rings of records (REPCHN1's were bare bytes and a tail; a
// peer of that version and this one each refuse the other's file).
constexpr uint64_t kChannelMagic = 0x324e4843504552ULL;
// The magic's "REPCHN", which every version's shares.
constexpr uint64_t kMagicFamilyMask = 0xffffffffffffULL;

}  // namespace

struct ShmChannel::Layout {
  uint64_t magic;  // published last by the creator
  uint64_t nonce;
  uint64_t ring_bytes;
  RingControl rings[2];
  WaiterCpu waiter_cpus[2];  // [r]: ring r's reader's
};

namespace {

constexpr size_t kDataOffset = 4096;  // the layout's page; the rings follow
constexpr size_t kFileBytes = kDataOffset + 2 * ShmChannel::ring_bytes();

template <typename T>
std::atomic_ref<T> shared(T& field) {
  return std::atomic_ref<T>(field);
}

// Registers this process for MEMBARRIER_CMD_GLOBAL_EXPEDITED (see
// request_doorbell() in the header): whether it is. Once per process: a
// child of fork() asks again, which costs nothing if it kept its parent's
// registration and matters if it did not.
bool register_for_asymmetric_fences() {
  static std::atomic<pid_t> registered{0};
  const pid_t self = ::getpid();
  if (registered.load(std::memory_order_acquire) == self) return true;
  if (!register_membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED,
                           MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)) {
    return false;
  }
  registered.store(self, std::memory_order_release);
  return true;
}

// CLDEMOTE (x86): a hint that moves the cache line holding `at` out of this
// core's caches into the cache all cores share, where the reader's load
// finds it sooner than in this core's (no snoop of another core). Encoded
// among the reserved no-ops, so a CPU without it ignores it; it is issued
// only where CPUID says the CPU has it (cpu_demotes()) all the same.
inline void demote_line(const void* at) {
#if defined(__x86_64__) && defined(__LP64__)
  // `cldemote (%rax)` spelled as bytes (0F 1C /0), for assemblers older
  // than the mnemonic.
  asm volatile(".byte 0x0f, 0x1c, 0x00" : : "a"(at) : "memory");
#else
  (void)at;
#endif
}

// Whether this CPU has CLDEMOTE: CPUID leaf 7, ECX bit 25.
bool cpu_demotes() {
#if defined(__x86_64__) && defined(__LP64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ((ecx >> 25) & 1) != 0;
#else
  return false;
#endif
}

}  // namespace

ShmChannel::ShmChannel(Fd fd, void* base, uint64_t nonce, int writes_ring)
    : fd_(std::move(fd)),
      base_(base),
      nonce_(nonce),
      out_control_(&layout().rings[writes_ring]),
      out_data_(static_cast<uint8_t*>(base) + kDataOffset +
                static_cast<size_t>(writes_ring) * kRingBytes),
      in_control_(&layout().rings[1 - writes_ring]),
      own_cpu_(&layout().waiter_cpus[1 - writes_ring]),
      peer_cpu_(&layout().waiter_cpus[writes_ring]),
      in_data_(static_cast<uint8_t*>(base) + kDataOffset +
               static_cast<size_t>(1 - writes_ring) * kRingBytes),
      asymmetric_fences_(register_for_asymmetric_fences()),
      demotes_(cpu_demotes()) {}

void ShmChannel::announce_reader_fences() {
  if (asymmetric_fences_) shared(in_control_->reader_fences).store(1, std::memory_order_release);
}

bool ShmChannel::peer_waits_on_this_cpu() {
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return false;
  const uint32_t said = static_cast<uint32_t>(cpu) + 1;
  if (shared(own_cpu_->cpu_plus_one).load(std::memory_order_relaxed) != said) {
    shared(own_cpu_->cpu_plus_one).store(said, std::memory_order_relaxed);
  }
  return shared(peer_cpu_->cpu_plus_one).load(std::memory_order_relaxed) == said;
}

Status ShmChannel::corrupted() {
  return ProtocolError("the peer corrupted the endpoint's shared ring");
}

ShmChannel::~ShmChannel() {
  if (base_) ::munmap(base_, kFileBytes);
}

ShmChannel::Layout& ShmChannel::layout() const {
  return *static_cast<Layout*>(base_);
}

Result<std::unique_ptr<ShmChannel>> ShmChannel::create() {
  static_assert(sizeof(Layout) <= kDataOffset);
  // Where docs/wire-format.md says the waiter CPUs lie.
  static_assert(offsetof(Layout, waiter_cpus) == 320 && sizeof(WaiterCpu) == 64);
  // Sealed at its size: both sides hold it read-write (common/shared_file.h).
  RDMABUF_ASSIGN_OR_RETURN(
      Fd fd, create_sealed_memfd("rdmabuf-endpoint", kFileBytes, "the endpoint's shared rings"));
  void* base = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return ResourceExhausted("mapping the endpoint's shared rings: " + errno_text(errno));
  }
  const uint64_t nonce = secure_random_u64();
  std::unique_ptr<ShmChannel> channel(new ShmChannel(std::move(fd), base, nonce, 0));
  Layout& l = channel->layout();  // the memfd starts zero-filled: empty rings
  l.nonce = nonce;
  l.ring_bytes = kRingBytes;
  // Both readers start asleep, as far as the writers know: the first bytes
  // each way ring.
  l.rings[0].doorbell = 1;
  l.rings[1].doorbell = 1;
  channel->announce_reader_fences();
  shared(l.magic).store(kChannelMagic, std::memory_order_release);
  return channel;
}

ShmChannel::Offer ShmChannel::offer() const {
  Offer o;
  o.pid = static_cast<uint32_t>(getpid());
  o.fd = static_cast<uint32_t>(fd_.get());
  o.pid_namespace = pid_namespace_id();
  o.nonce = nonce_;
  o.host_id = this_host_id();
  return o;
}

Result<std::unique_ptr<ShmChannel>> ShmChannel::open(const Offer& offer) {
  if (offer.host_id != this_host_id()) return FailedPrecondition("the peer is on another host");
  if (offer.pid_namespace != pid_namespace_id() || offer.pid_namespace == 0) {
    return FailedPrecondition("the peer is in another PID namespace (another container?)");
  }
  const std::string path = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
  // O_NONBLOCK: a hostile offer may name a device whose open would block.
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    return FailedPrecondition("cannot open the peer's shared rings " + path + ": " +
                              errno_text(errno) +
                              " (another user, or a ptrace policy that forbids access)");
  }
  if (!sealed_at_size(fd.get(), kFileBytes)) {
    return FailedPrecondition(
        path + " is not an endpoint's shared rings of this version (or not sealed at its size)");
  }
  void* base = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return FailedPrecondition("mapping the peer's shared rings: " + errno_text(errno));
  }
  std::unique_ptr<ShmChannel> channel(new ShmChannel(std::move(fd), base, offer.nonce, 1));
  Layout& l = channel->layout();
  const uint64_t magic = shared(l.magic).load(std::memory_order_acquire);
  if (magic != kChannelMagic && (magic & kMagicFamilyMask) == (kChannelMagic & kMagicFamilyMask)) {
    return FailedPrecondition(path + " is an endpoint's shared rings of another version");
  }
  if (magic != kChannelMagic || l.nonce != offer.nonce || l.ring_bytes != kRingBytes) {
    return FailedPrecondition(path + " is not the shared rings the peer offered");
  }
  channel->announce_reader_fences();
  return channel;
}

Result<bool> ShmChannel::write_whole(std::span<const uint8_t> first,
                                     std::span<const std::span<const uint8_t>> pieces) {
  size_t size = first.size();
  for (const auto& piece : pieces)
    size += piece.size();
  if (size > most_whole_write()) {
    return InvalidArgument("frames of " + std::to_string(size) + " bytes do not fit the ring");
  }
  if (size == 0) return true;
  const size_t record = record_aligned(sizeof(uint64_t) + size);
  const size_t at = out_tail_ & (kRingBytes - 1);
  // Past the ring's end: a wrap mark here, the record at the next lap's start.
  const size_t skipped = at + record > kRingBytes ? kRingBytes - at : 0;
  // The word after the record, zeroed, is the next record's header.
  RDMABUF_ASSIGN_OR_RETURN(const size_t room, room_for(skipped + record + sizeof(uint64_t)));
  if (room < skipped + record + sizeof(uint64_t)) return false;
  const uint64_t start = out_tail_ + skipped;
  size_t offset = (start & (kRingBytes - 1)) + sizeof(uint64_t);
  copy_in(first, offset);
  offset += first.size();
  for (const auto& piece : pieces) {
    copy_in(piece, offset);
    offset += piece.size();
  }
  out_tail_ = start + record;
  zero_word(out_tail_);
  const uint64_t header = kRecordMark << 32 | size;
  if (skipped == 0) {
    publish(start, header, record);
  } else {
    // The record first, then the mark that leads the reader to it.
    shared(outgoing_word(start)).store(header, std::memory_order_release);
    publish(start - skipped, kWrapMark << 32, 0);
  }
  return true;
}

// The helpers of the writes are inline always: a frame is two or three
// pieces, and the writes are on every message's path.
[[gnu::always_inline]] inline Result<size_t> ShmChannel::room_for(size_t wanted) {
  if (kRingBytes - (out_tail_ - out_head_) < wanted) {  // look at the reader's progress
    const uint64_t head = shared(out_control_->head).load(std::memory_order_acquire);
    if (out_tail_ - head > kRingBytes) return corrupted();
    out_head_ = head;
  }
  return kRingBytes - (out_tail_ - out_head_);
}

[[gnu::always_inline]] inline void ShmChannel::copy_in(std::span<const uint8_t> piece, size_t at) {
  copy_short(out_data_ + at, piece.data(), piece.size());  // touches nothing for none
}

[[gnu::always_inline]] inline void ShmChannel::zero_word(uint64_t at) {
  shared(outgoing_word(at)).store(0, std::memory_order_relaxed);
}

[[gnu::always_inline]] inline void ShmChannel::publish(uint64_t at, uint64_t word,
                                                       size_t record_bytes) {
  uint64_t& header = outgoing_word(at);
  // A reader that asked for a doorbell before this store is seen by
  // doorbell_requested()'s load; one that asks after sees the record.
  // Either this store is seq_cst, or the reader's membarrier fences this
  // thread (the header says why); then only the compiler must keep the
  // order.
  if (writes_without_fence()) {
    shared(header).store(word, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    shared(header).store(word, std::memory_order_seq_cst);
  }
  // Small records only: the hint costs the writer about 5 ns a line, and a
  // reader busy copying larger ones out gained nothing from it.
  if (demotes_ && record_bytes <= kDemoteMost) {
    for (size_t line = 0; line < record_bytes; line += kLineBytes)
      demote_line(reinterpret_cast<uint8_t*>(&header) + line);
  }
}

Result<std::span<const uint8_t>> ShmChannel::follow_wrap(uint64_t at, uint64_t word) {
  if (word >> 32 != kWrapMark || (word & 0xffffffff) != 0 || (at & (kRingBytes - 1)) == 0) {
    return corrupted();
  }
  const uint64_t lap = at + (kRingBytes - (at & (kRingBytes - 1)));
  // The writer stores the record before the mark that leads to it.
  const uint64_t first = incoming_word(lap, std::memory_order_acquire);
  if (!is_record(lap, first)) return corrupted();
  start_record(lap, first);
  return std::span<const uint8_t>(in_data_ + sizeof(uint64_t), in_record_end_ - in_head_);
}

Result<size_t> ShmChannel::read_some(uint8_t* out, size_t size) {
  size_t n = 0;
  while (n < size) {
    Result<std::span<const uint8_t>> bytes = peek();
    // An error after bytes were copied waits for the next call.
    if (!bytes.ok()) return n > 0 ? Result<size_t>(n) : bytes.status();
    if (bytes->empty()) break;
    const size_t piece = std::min(bytes->size(), size - n);
    std::memcpy(out + n, bytes->data(), piece);
    n += piece;
    consume(piece);
  }
  return n;
}

bool ShmChannel::request_doorbell() {
  RingControl& ring = *in_control_;
  shared(ring.doorbell).store(1, std::memory_order_seq_cst);
  // The fence for the writer, which may have skipped its own. Should it
  // ever fail, the reader must not sleep: false, as if bytes had come.
  if (asymmetric_fences_ && membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) return false;
  return in_head_ == in_record_end_ && next_record_word(std::memory_order_seq_cst) == 0;
}

bool ShmChannel::doorbell_requested() {
  RingControl& ring = *out_control_;
  return shared(ring.doorbell).load(std::memory_order_seq_cst) != 0 &&
         shared(ring.doorbell).exchange(0, std::memory_order_seq_cst) != 0;
}

}  // namespace rdmabuf
