#include "backends/ibverbs/message_channel.h"

#include <endian.h>
#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <span>
#include <thread>

#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/copy.h"
#include "common/socket.h"
#include "common/wire.h"

namespace rdmabuf::ibverbs {
namespace {

// Receives each side keeps posted, and SENDs a writer has in flight at
// most: 528 KiB each way.
constexpr uint32_t kSlots = 32;
// The bytes a writer fills one SEND with (write_unit()).
constexpr uint32_t kUnitBytes = 16 * 1024;
// The most bytes of one SEND, and of one posted receive: a unit and the
// slack MessageChannel promises, so that up to 512 bytes of credits held
// back (22 without handles) in front of a unit's worth of message parts
// cost no SEND of their own. Both sides must agree (address()): the wire
// value docs/wire-format.md gives.
constexpr uint32_t kSlotBytes = kUnitBytes + MessageChannel::kWriteUnitSlack;
static_assert(kSlotBytes == 16896, "docs/wire-format.md: the RDMA channel's receives");
// The work request id of the credit read (SENDs carry their number).
constexpr uint64_t kCreditRead = ~uint64_t{0};
// One SEND in this many asks for a completion: the send queue completes in
// order, so its completion says the ones before it are done too, and the
// others cost the NIC no completion to write nor the writer one to take.
// A writer short of send slots waits for a signalled SEND among those in
// flight, or, when none is (fewer than kSignalEvery in flight), for the
// credit read write_whole() posts before it gives up, which completes
// after them.
constexpr uint64_t kSignalEvery = 8;
static_assert(kSlots % kSignalEvery == 0 && kSignalEvery <= kSlots / 2);
// SENDs up to this size go inline (IBV_SEND_INLINE): in the work request
// itself, so the NIC need not read them from memory. Asked of the device,
// which may grant more or less. A write of up to the smaller of the two is
// gathered on the stack and goes inline (post_inline_send); a send slot's
// bytes go inline up to the device's grant.
constexpr uint32_t kInlineBytes = 256;
// Receives read out are posted again, with one ibv_post_recv for them all,
// when the reader next finds nothing to read (off the path from a message
// to its answer, where posting eight, about 900 instructions, held up one
// message in eight), or once this many wait while
// messages keep coming; until then the peer has up to kRepostBatch - 1
// fewer to send into. So that a writer of capacity() bytes is never stuck
// behind receives read out but not posted again, capacity() leaves them
// out.
constexpr uint32_t kRepostBatch = 8;
static_assert(kRepostBatch <= kSlots / 2);
// Completions taken at once.
constexpr int kPollBatch = 16;

class VerbsChannel final : public MessageChannel {
 public:
  static Result<std::unique_ptr<MessageChannel>> create(std::shared_ptr<const Device> device) {
    std::unique_ptr<VerbsChannel> channel(new VerbsChannel(std::move(device)));
    RDMABUF_RETURN_IF_ERROR(channel->set_up());
    return std::unique_ptr<MessageChannel>(std::move(channel));
  }

  ~VerbsChannel() override {
    qp_.reset();  // first: it posts into the memory below (and takes the events left)
    if (events_) lib_.destroy_comp_channel(events_);
    slots_mr_.reset();
    posted_mr_.reset();
    if (pd_) lib_.dealloc_pd(pd_);
    if (memory_ != MAP_FAILED) ::munmap(memory_, kMemoryBytes);
  }

  // address(): the queue pair's endpoint, the posted-receives word's
  // address and key, and the receives' shape.
  std::vector<uint8_t> address() const override {
    std::vector<uint8_t> out;
    WireWriter w(out);
    put_endpoint(w, qp_->local());
    w.put<uint64_t>(reinterpret_cast<uintptr_t>(posted_word()));
    w.put<uint32_t>(posted_mr_->rkey());
    w.put<uint32_t>(kSlots);
    w.put<uint32_t>(kSlotBytes);
    return out;
  }

  Status connect(std::span<const uint8_t> peer) override {
    WireReader r(peer);
    RDMABUF_ASSIGN_OR_RETURN(Endpoint endpoint, get_endpoint(r));
    peer_posted_addr_ = r.get<uint64_t>();
    peer_posted_rkey_ = r.get<uint32_t>();
    const uint32_t slots = r.get<uint32_t>();
    const uint32_t slot_bytes = r.get<uint32_t>();
    if (!r.ok() || r.remaining() != 0) return ProtocolError("malformed ibverbs channel address");
    // Well formed, but another version's channel: the frames take TCP.
    if (slots != kSlots || slot_bytes != kSlotBytes) {
      return FailedPrecondition("the peer's ibverbs channel posts " + std::to_string(slots) +
                                " receives of " + std::to_string(slot_bytes) +
                                " bytes (this side " + std::to_string(kSlots) + " of " +
                                std::to_string(kSlotBytes) + ")");
    }
    return qp_->connect(endpoint);
  }

  std::string describe() const override { return "ibverbs (" + device_->name() + ", SEND/RECV)"; }

  // The probe is a credit read (the peer's posted-receives word).
  Status start_probe() override { return read_credits(); }
  Result<bool> probe_answered() override {
    Status taken = take_send_completions();
    if (!taken.ok()) return Unavailable("cannot reach the peer's queue pair: " + taken.message());
    return !credit_read_pending_;
  }

  // --- the writer ------------------------------------------------------------

  Result<bool> write_whole(std::span<const uint8_t> first,
                           std::span<const std::span<const uint8_t>> pieces) override {
    size_t total = first.size();
    for (const auto& piece : pieces)
      total += piece.size();
    if (total == 0) return true;
    if (total > capacity()) {
      return InvalidArgument("a write of " + std::to_string(total) +
                             " bytes into an ibverbs channel (at most " +
                             std::to_string(capacity()) + ")");
    }
    const uint64_t sends = (total + kSlotBytes - 1) / kSlotBytes;
    if (!has_room(sends)) {
      hear_credits();
      RDMABUF_RETURN_IF_ERROR(take_send_completions());
      if (!has_room(sends)) {
        RDMABUF_RETURN_IF_ERROR(read_credits());
        return false;
      }
    }
    RDMABUF_RETURN_IF_ERROR(post_sends(first, pieces, total));
    // Fewer than half the peer's receives left, even by the count its last
    // SEND carried: ask for its count now, so that it is back before they
    // run out.
    if (peer_receives_ - sends_posted_ < kSlots / 2) {
      hear_credits();
      if (peer_receives_ - sends_posted_ < kSlots / 2) RDMABUF_RETURN_IF_ERROR(read_credits());
    }
    return true;
  }

  size_t capacity() const override { return size_t{kSlots - kRepostBatch + 1} * kSlotBytes; }
  size_t write_unit() const override { return kUnitBytes; }

  void drain(std::chrono::milliseconds limit) override {
    const Deadline deadline = Clock::now() + limit;
    // The SENDs after the last signalled one complete unseen: a credit
    // read posted behind them completes after them (taken as done by
    // take_send_completions).
    bool marked = false;
    while (sends_done_ < sends_posted_ && send_failure_.ok() && Clock::now() < deadline) {
      if (!take_send_completions().ok()) return;
      if (!marked && !credit_read_pending_) {
        if (!read_credits().ok()) return;
        marked = true;
      }
      if (sends_done_ < sends_posted_) std::this_thread::yield();
    }
  }

  // --- the reader ------------------------------------------------------------

  bool has_incoming() override {
    if (receives_done_ > receives_used_) return true;
    take_receive_completions();
    return receives_done_ > receives_used_ || !receive_failure_.ok();
  }

  Result<std::span<const uint8_t>> peek() override {
    while (true) {
      if (receives_done_ == receives_used_) {
        take_receive_completions();
        if (receives_done_ == receives_used_) {
          RDMABUF_RETURN_IF_ERROR(receive_failure_);
          return std::span<const uint8_t>();
        }
      }
      const uint32_t slot = receives_used_ % kSlots;
      if (offset_ < lengths_[slot]) {
        return std::span<const uint8_t>(receive_slot(slot) + offset_, lengths_[slot] - offset_);
      }
      if (!read_out()) return receive_failure_;  // read out (or empty)
    }
  }

  void consume(size_t size) override {
    if (size == 0 || receives_done_ == receives_used_) return;  // nothing was peeked
    const uint32_t slot = receives_used_ % kSlots;
    offset_ = std::min<size_t>(offset_ + size, lengths_[slot]);
    if (offset_ == lengths_[slot]) read_out();
  }

  Result<size_t> read_some(uint8_t* out, size_t size) override {
    size_t copied = 0;
    while (copied < size) {
      RDMABUF_ASSIGN_OR_RETURN(std::span<const uint8_t> in, peek());
      if (in.empty()) break;
      const size_t n = std::min(in.size(), size - copied);
      std::memcpy(out + copied, in.data(), n);
      consume(n);
      copied += n;
    }
    return copied;
  }

  bool arm_wakeup() override {
    if (ibv_req_notify_cq(qp_->recv_cq(), 0) != 0) {
      // No wakeup would come: a failure, which the reader's next look says.
      if (receive_failure_.ok()) {
        receive_failure_ = Unavailable("cannot arm the receive queue's completion events");
      }
      return false;
    }
    return !has_incoming();
  }

  int wakeup_fd() const override { return events_->fd; }

  bool take_wakeups() override { return lib_.take_cq_events(events_) > 0; }

 private:
  // The send slots, then the receive slots, then the word a credit read
  // lands in (all registered for local access), on pages of their own; the
  // posted-receives word, which the peer reads, on the last page,
  // registered on its own for remote reads of those 8 bytes alone.
  static constexpr size_t kSlotsBytes = size_t{2} * kSlots * kSlotBytes;
  static constexpr size_t kPage = 4096;
  static constexpr size_t kMemoryBytes = kSlotsBytes + 2 * kPage;
  static_assert(kSlotsBytes % kPage == 0, "the credit word starts a page");

  explicit VerbsChannel(std::shared_ptr<const Device> device)
      : device_(std::move(device)), lib_(device_->lib()) {}

  Status set_up() {
    memory_ =
        ::mmap(nullptr, kMemoryBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory_ == MAP_FAILED) return ResourceExhausted("mmap: " + errno_text(errno));
    // A protection domain of its own: the peer's queue pair reaches the
    // count word and nothing of the buffers registered in the device's.
    pd_ = lib_.alloc_pd(device_->context());
    if (!pd_) return ResourceExhausted("cannot allocate a protection domain: " + errno_text(errno));
    RDMABUF_ASSIGN_OR_RETURN(slots_mr_, register_range(*device_, pd_, memory_, kSlotsBytes + kPage,
                                                       IBV_ACCESS_LOCAL_WRITE));
    RDMABUF_ASSIGN_OR_RETURN(posted_mr_,
                             register_range(*device_, pd_, posted_word(), sizeof(uint64_t),
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
    events_ = lib_.create_comp_channel(device_->context());
    if (!events_)
      return ResourceExhausted("cannot create a completion channel: " + errno_text(errno));
    const int flags = ::fcntl(events_->fd, F_GETFL);
    if (flags < 0 || ::fcntl(events_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      return Internal("fcntl: " + errno_text(errno));
    }
    QueuePair::Shape shape;
    shape.send_depth = kSlots + 1;  // the SENDs and a credit read
    shape.receive_depth = kSlots;
    shape.receive_events = events_;
    shape.pd = pd_;
    shape.remote_access = IBV_ACCESS_REMOTE_READ;  // the count word's reads alone
    shape.inline_bytes = kInlineBytes;
    RDMABUF_ASSIGN_OR_RETURN(qp_, QueuePair::create(*device_, shape));
    if (qp_->depth() < kSlots + 1) {
      return ResourceExhausted("the device takes " + std::to_string(qp_->depth()) +
                               " work requests per queue pair (an ibverbs channel needs " +
                               std::to_string(kSlots + 1) + ")");
    }
    RDMABUF_RETURN_IF_ERROR(post_receives(0, kSlots));
    publish_posted(kSlots);
    // Armed from the start: the reader may sleep before it first looks.
    if (ibv_req_notify_cq(qp_->recv_cq(), 0) != 0) {
      return Internal("cannot arm the receive queue's completion events");
    }
    return Status::Ok();
  }

  uint8_t* send_slot(uint64_t slot) const {
    return static_cast<uint8_t*>(memory_) + slot * kSlotBytes;
  }
  uint8_t* receive_slot(uint64_t slot) const { return send_slot(kSlots + slot); }
  uint64_t* credit_word() const {
    return reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(memory_) + kSlotsBytes);
  }
  uint64_t* posted_word() const {
    return reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(memory_) + kSlotsBytes + kPage);
  }

  // Whether `sends` more SENDs may go now: the peer posted receives for
  // them, and their send slots are free.
  bool has_room(uint64_t sends) const {
    return sends_posted_ + sends <= peer_receives_ && sends_posted_ + sends - sends_done_ <= kSlots;
  }

  // Copies the bytes into the next send slots and posts a SEND for each;
  // bytes that go inline are gathered into the work request (post_inline_send).
  Status post_sends(std::span<const uint8_t> first,
                    std::span<const std::span<const uint8_t>> pieces, size_t total) {
    if (total <= std::min(qp_->inline_bytes(), kInlineBytes)) {
      return post_inline_send(first, pieces, total);
    }
    ibv_sge sge[kSlots];
    ibv_send_wr wr[kSlots];
    const uint32_t posted_imm = posted_for_peer();
    uint32_t count = 0;
    size_t filled = 0;  // bytes in the slot being filled
    auto add = [&](std::span<const uint8_t> bytes) {
      while (!bytes.empty()) {
        if (filled == 0 || filled == kSlotBytes) {
          filled = 0;
          ++count;
        }
        const size_t n = std::min(bytes.size(), kSlotBytes - filled);
        std::memcpy(send_slot((sends_posted_ + count - 1) % kSlots) + filled, bytes.data(), n);
        filled += n;
        bytes = bytes.subspan(n);
      }
    };
    add(first);
    for (const auto& piece : pieces)
      add(piece);
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t number = sends_posted_ + i;
      const auto length =
          static_cast<uint32_t>(std::min<size_t>(kSlotBytes, total - size_t{i} * kSlotBytes));
      sge[i] = {reinterpret_cast<uintptr_t>(send_slot(number % kSlots)), length, slots_mr_->lkey()};
      wr[i] = send_request(number, &sge[i], 1, length <= qp_->inline_bytes(), posted_imm);
      wr[i].next = i + 1 < count ? &wr[i + 1] : nullptr;
    }
    return post_chain(wr, count);
  }

  // One SEND of `total` bytes (at most the pair's inline bytes and
  // kInlineBytes), `first` then `pieces`: gathered on the stack into one
  // piece, which the device copies into the work request before
  // ibv_post_send returns. One gather entry, not one per piece: a
  // provider that copies inline bytes itself (Soft-RoCE's) makes a call
  // per entry, and an endpoint's small message comes in three (credits,
  // header, message). Its send slot, counted as every SEND's is, goes
  // unwritten.
  Status post_inline_send(std::span<const uint8_t> first,
                          std::span<const std::span<const uint8_t>> pieces, size_t total) {
    uint8_t gathered[kInlineBytes];
    size_t at = 0;
    auto add = [&](std::span<const uint8_t> bytes) {
      copy_short(gathered + at, bytes.data(), bytes.size());
      at += bytes.size();
    };
    add(first);
    for (const auto& piece : pieces)
      add(piece);
    ibv_sge sge{reinterpret_cast<uintptr_t>(gathered), static_cast<uint32_t>(total),
                slots_mr_->lkey()};  // unused: inline bytes are not read by the device
    ibv_send_wr wr = send_request(sends_posted_, &sge, 1, /*inline_bytes=*/true, posted_for_peer());
    return post_chain(&wr, 1);
  }

  // The work request of SEND `number`, its bytes in the `sges` entries at
  // `sge`, inline or not, signalled as kSignalEvery says, carrying `imm`
  // (posted_for_peer) as its immediate.
  static ibv_send_wr send_request(uint64_t number, ibv_sge* sge, int sges, bool inline_bytes,
                                  uint32_t imm) {
    ibv_send_wr wr{};
    wr.wr_id = number;
    wr.sg_list = sge;
    wr.num_sge = sges;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = imm;
    if (inline_bytes) wr.send_flags |= IBV_SEND_INLINE;
    if (signalled(number)) wr.send_flags |= IBV_SEND_SIGNALED;
    return wr;
  }

  // Posts the `count` SENDs chained from `wr`, the next ones in number.
  Status post_chain(ibv_send_wr* wr, uint32_t count) {
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_->qp(), wr, &bad);
    if (rc != 0) return fail_sending("cannot post a SEND: " + errno_text(rc));
    sends_posted_ += count;
    return Status::Ok();
  }

  // What each SEND carries as its immediate: the low 32 bits of this
  // side's posted-receives count, big-endian (hear_posted takes it in).
  uint32_t posted_for_peer() const {
    return htobe32(static_cast<uint32_t>(
        std::atomic_ref<uint64_t>(*posted_word()).load(std::memory_order_relaxed)));
  }

  // Takes in the peer's count as its last SEND carried it (hear_posted),
  // capped as a read one is.
  void hear_credits() {
    const uint64_t heard = peer_posted_heard_.load(std::memory_order_relaxed);
    peer_receives_ = std::clamp(heard, peer_receives_, sends_posted_ + kSlots);
  }

  // Whether SEND `number` asks for a completion (see kSignalEvery).
  static bool signalled(uint64_t number) { return number % kSignalEvery == kSignalEvery - 1; }

  // Reads the peer's posted-receives count (once at a time), to learn the
  // credits it gave since the last read.
  Status read_credits() {
    if (credit_read_pending_) return Status::Ok();
    ibv_sge sge{reinterpret_cast<uintptr_t>(credit_word()), sizeof(uint64_t), slots_mr_->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = kCreditRead;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peer_posted_addr_;
    wr.wr.rdma.rkey = peer_posted_rkey_;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_->qp(), &wr, &bad);
    if (rc != 0) return fail_sending("cannot post the credit read: " + errno_text(rc));
    credit_read_pending_ = true;
    credit_read_sends_ = sends_posted_;
    return Status::Ok();
  }

  // Takes every completion of the send queue.
  Status take_send_completions() {
    RDMABUF_RETURN_IF_ERROR(send_failure_);
    ibv_wc wc[kPollBatch];
    int n = kPollBatch;
    while (n == kPollBatch) {
      n = ibv_poll_cq(qp_->cq(), kPollBatch, wc);
      if (n < 0) return fail_sending("cannot poll the send queue's completions");
      RDMABUF_RETURN_IF_ERROR(take_send_completions(std::span<const ibv_wc>(wc, n)));
    }
    return Status::Ok();
  }
  Status take_send_completions(std::span<const ibv_wc> wc) {
    for (size_t i = 0; i < wc.size(); ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        return fail_sending(std::string(wc[i].wr_id == kCreditRead ? "a credit read" : "a SEND") +
                            " failed: " + lib_.wc_status_str(wc[i].status));
      }
      if (wc[i].wr_id != kCreditRead) {
        sends_done_ = wc[i].wr_id + 1;  // and those before it, unsignalled
        continue;
      }
      // Posted behind every SEND posted before it: those are done too.
      sends_done_ = std::max(sends_done_, credit_read_sends_);
      credit_read_pending_ = false;
      // The peer cannot have posted receives for more than it read of ours
      // and its first kSlots: a larger count is a lie, and it is capped.
      const uint64_t posted =
          std::atomic_ref<uint64_t>(*credit_word()).load(std::memory_order_acquire);
      peer_receives_ = std::clamp(posted, peer_receives_, sends_posted_ + kSlots);
    }
    return Status::Ok();
  }

  [[gnu::cold]] Status fail_sending(const std::string& why) {
    if (send_failure_.ok()) send_failure_ = Unavailable("the ibverbs channel to the peer: " + why);
    return send_failure_;
  }

  // Posts receives `from` to `to` (numbers: each into slot number %
  // kSlots), with one ibv_post_recv.
  Status post_receives(uint64_t from, uint64_t to) {
    ibv_sge sge[kSlots];
    ibv_recv_wr wr[kSlots];
    const auto count = static_cast<uint32_t>(to - from);
    for (uint32_t i = 0; i < count; ++i) {
      const auto slot = static_cast<uint32_t>((from + i) % kSlots);
      sge[i] = {reinterpret_cast<uintptr_t>(receive_slot(slot)), kSlotBytes, slots_mr_->lkey()};
      wr[i] = {};
      wr[i].wr_id = slot;
      wr[i].sg_list = &sge[i];
      wr[i].num_sge = 1;
      wr[i].next = i + 1 < count ? &wr[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    const int rc = ibv_post_recv(qp_->qp(), wr, &bad);
    if (rc != 0) return Unavailable("cannot post a receive: " + errno_text(rc));
    return Status::Ok();
  }

  // The peer may read the count from now on.
  void publish_posted(uint64_t posted) {
    std::atomic_ref<uint64_t>(*posted_word()).store(posted, std::memory_order_release);
  }

  // The oldest receive taken is read out. Once kRepostBatch are, they are
  // posted again (repost), and the peer may send into them: false when
  // they could not be (receive_failure_ says why).
  bool read_out() {
    ++receives_used_;
    offset_ = 0;
    if (receives_used_ - receives_reposted_ < kRepostBatch) return true;
    return repost();
  }

  // Posts the receives read out again (none: nothing to do); false when
  // they could not be (receive_failure_ says why).
  bool repost() {
    if (receives_used_ == receives_reposted_) return true;
    Status posted = post_receives(receives_reposted_, receives_used_);
    if (!posted.ok()) {
      if (receive_failure_.ok()) receive_failure_ = posted;
      return false;
    }
    receives_reposted_ = receives_used_;
    publish_posted(receives_reposted_ + kSlots);
    return true;
  }

  // A SEND's immediate: the low 32 bits of the peer's posted-receives
  // count when it posted the SEND, widened against the last one heard
  // (widen_posted_count). For the writer (hear_credits).
  void hear_posted(uint32_t low) {
    const uint64_t last = peer_posted_heard_.load(std::memory_order_relaxed);
    const uint64_t heard = widen_posted_count(last, low);
    if (heard != last) peer_posted_heard_.store(heard, std::memory_order_relaxed);
  }

  void take_receive_completions() {
    if (!receive_failure_.ok()) return;
    ibv_wc wc[kPollBatch];
    const int n = ibv_poll_cq(qp_->recv_cq(), kPollBatch, wc);
    if (n < 0) receive_failure_ = Unavailable("cannot poll the receive queue's completions");
    // Nothing came (every caller looks only once all it took is read out):
    // the time to post the receives read out again, rather than on the way
    // from a message to its answer (kRepostBatch).
    if (n == 0) {
      repost();
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t slot = receives_done_ % kSlots;
      // What the peer can cause (a SEND larger than a receive, a write
      // with immediate, which takes a receive too) is its protocol error.
      if (wc[i].status == IBV_WC_LOC_LEN_ERR) {
        receive_failure_ =
            ProtocolError("the peer sent more than an ibverbs channel's receive holds");
        return;
      }
      if (wc[i].status != IBV_WC_SUCCESS) {
        receive_failure_ = Unavailable(std::string("the ibverbs channel from the peer: ") +
                                       lib_.wc_status_str(wc[i].status));
        return;
      }
      if (wc[i].opcode != IBV_WC_RECV) {
        receive_failure_ = ProtocolError("the peer wrote into an ibverbs channel's receives");
        return;
      }
      if (wc[i].wr_id != slot) {
        receive_failure_ = Internal("an ibverbs channel's receives completed out of order");
        return;
      }
      lengths_[slot] = std::min(wc[i].byte_len, kSlotBytes);
      if ((wc[i].wc_flags & IBV_WC_WITH_IMM) != 0) hear_posted(be32toh(wc[i].imm_data));
      ++receives_done_;
    }
  }

  std::shared_ptr<const Device> device_;
  const IbvLib& lib_;
  void* memory_ = MAP_FAILED;
  ibv_pd* pd_ = nullptr;  // the channel's own
  std::shared_ptr<MemoryRegion> slots_mr_;
  std::shared_ptr<MemoryRegion> posted_mr_;
  ibv_comp_channel* events_ = nullptr;
  std::unique_ptr<QueuePair> qp_;
  uint64_t peer_posted_addr_ = 0;
  uint32_t peer_posted_rkey_ = 0;

  // The writer's.
  uint64_t sends_posted_ = 0;
  uint64_t sends_done_ = 0;
  uint64_t peer_receives_ = kSlots;  // the receives the peer had posted, as last read or heard
  bool credit_read_pending_ = false;
  uint64_t credit_read_sends_ = 0;  // the SENDs posted before the pending credit read
  Status send_failure_;

  // The reader's.
  uint64_t receives_done_ = 0;      // completions taken
  uint64_t receives_used_ = 0;      // receives read out
  uint64_t receives_reposted_ = 0;  // receives read out and posted again
  size_t offset_ = 0;               // bytes read of the oldest receive taken
  uint32_t lengths_[kSlots] = {};
  Status receive_failure_;

  // The peer's posted-receives count, as its SENDs last carried it: set by
  // the reader, taken in by the writer.
  std::atomic<uint64_t> peer_posted_heard_{kSlots};
};

}  // namespace

Result<std::unique_ptr<MessageChannel>> open_message_channel(std::shared_ptr<const Device> device) {
  return VerbsChannel::create(std::move(device));
}

}  // namespace rdmabuf::ibverbs
