// Frames into an endpoint: read by the reader role's holder (reader_role.h),
// taken where they lie in a frames-in-place channel or copied into the
// holder's buffer, decoded (frames.h) and dispatched.
#include <cstring>

#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// Frames other than messages up to this many payload bytes are taken from a
// frames-in-place channel where they lie, through a copy on the stack
// (credits, answers, notifications); larger ones (handles) through the read
// buffer.
constexpr size_t kSmallFrame = 256;

// A frames-in-place channel: the bytes of the whole frames at the front of
// `view` (which starts with a frame) up to the first message that
// take_frames_in_place() takes where it lies; 0 when none.
size_t frames_before_a_message(std::span<const uint8_t> view) {
  size_t at = 0;
  while (view.size() - at >= endpoint::kHeaderSize) {
    uint8_t head[endpoint::kHeaderSize];
    std::memcpy(head, view.data() + at, sizeof head);  // the peer may write the channel
    const auto [size, type] = endpoint::read_header(head);
    if (type == Frame::kSentInline || type == Frame::kSentPart) break;
    if (size > endpoint::kMaxPayload || view.size() - at - endpoint::kHeaderSize < size) break;
    at += endpoint::kHeaderSize + size;
  }
  return at;
}

}  // namespace

// Reads and dispatches what the channel holds (reader role held): every
// whole frame held, then one read of the channel (what it has, up to
// kInCapacity) and what came; never blocks. `progressed`: a frame was
// taken. One read per call, so that the caller looks at what it waits for,
// and wakes the others, between reads even while a fast sender keeps the
// channel full. Stops early, leaving frames unread, while kMaxPendingNotes
// notifications wait for the endpoint's server, and, with
// Take::kUpToAMessage, after the first inline message taken where it lies.
// The replies the dispatches wrote are held meanwhile and written at the
// end; inside a blocking write (whose lock this thread holds), by the next
// pump instead. `lock`, held or not on entry, may be held on return: the
// frames taken last were messages or credits, taken under it, and the
// caller's next step is to take it anyway.
Status EndpointImpl::pump(const ReaderRole::Held& role, bool& progressed, StateLock& lock,
                          Take take) {
  Status st = pump_holding_replies(role, progressed, lock, take);
  if (reading_.held_replies.empty() || writing_blocked_here()) return st;
  if (lock.owns_lock()) lock.unlock();  // a write may wait, and read meanwhile
  const std::vector<uint8_t> replies = std::move(reading_.held_replies);
  reading_.held_replies.clear();
  const std::span<const uint8_t> pieces[] = {replies};
  ++reading_.reply_depth;
  Status wrote = write_pieces(pieces);
  --reading_.reply_depth;
  return st.ok() ? wrote : st;
}

// pump(), returning with mu_ free.
Status EndpointImpl::pump(const ReaderRole::Held& role, bool& progressed) {
  StateLock lock(mu_, std::defer_lock);
  return pump(role, progressed, lock);
}

// pump() short of writing the replies: they stay held, for the reader
// role's next holder to write (its pump()). It never waits for room in the
// channel.
Status EndpointImpl::pump_holding_replies(const ReaderRole::Held& role, bool& progressed,
                                          StateLock& lock, Take take) {
  role_.begin_pump(role);
  Status st = pump_frames(role, progressed, lock, take);
  role_.end_pump(role);
  return st;
}

Status EndpointImpl::pump_frames(const ReaderRole::Held& role, bool& progressed, StateLock& lock,
                                 Take take) {
  Reading& r = reading_;
  const bool in_place = channel_.frames_in_place();
  bool read_once = false;
  if (r.in_begin != r.in_end && lock.owns_lock()) lock.unlock();  // dispatch takes it
  while (true) {
    while (r.in_end - r.in_begin >= endpoint::kHeaderSize) {
      const auto [size, type] = endpoint::read_header(r.in.get() + r.in_begin);
      if (size > endpoint::kMaxPayload) return endpoint::payload_too_large(size);
      if (r.in_end - r.in_begin < endpoint::kHeaderSize + size) break;
      if (type == Frame::kNotify && notes_full()) {
        signal_eventfd(wake_.get());
        return Status::Ok();
      }
      RDMABUF_RETURN_IF_ERROR(dispatch(
          role, type,
          std::span<const uint8_t>(r.in.get() + r.in_begin + endpoint::kHeaderSize, size)));
      r.in_begin += endpoint::kHeaderSize + size;
      progressed = true;
    }
    if (in_place && r.in_begin == r.in_end) {
      RDMABUF_ASSIGN_OR_RETURN(const bool stopped,
                               take_frames_in_place(role, progressed, lock, take));
      // Stopped after a message, or nothing more came: no read to try
      // (peer_closed: the read says so).
      if (stopped || !channel_has_more()) return Status::Ok();
    }
    // One read per call; from a frames-in-place channel, as many as complete
    // the frame begun (receive_some copies one in two: its header, then the
    // rest).
    if (read_once && !(in_place && r.in_end > r.in_begin)) return Status::Ok();
    if (lock.owns_lock()) lock.unlock();  // dispatch takes it
    // Keep what is left of a frame at the front, then read more.
    std::memmove(r.in.get(), r.in.get() + r.in_begin, r.in_end - r.in_begin);
    r.in_end -= r.in_begin;
    r.in_begin = 0;
    RDMABUF_ASSIGN_OR_RETURN(
        size_t n, receive_some(role, r.in.get() + r.in_end, endpoint::kInCapacity - r.in_end));
    if (n == 0) return Status::Ok();
    r.in_end += n;
    read_once = true;
  }
}

// A frames-in-place channel, nothing buffered: takes the frames at its front
// where they lie, with no copy through the read buffer. A message
// (kSentInline, kSentPart) is copied once, channel to receive; a credit
// without a handle is decoded where it lies (each byte read once); any other
// frame up to kSmallFrame bytes is copied whole onto the stack first (the
// peer may write the channel meanwhile), then dispatched. Stops at a larger
// frame, one not whole in one piece, or a notification while the queue is
// full: pump() copies those. A run of small messages and credits, the
// frames of a steady stream, is taken under one hold of mu_ (`lock`, which
// it leaves held after them: see pump()). With Take::kUpToAMessage it
// stops after the first inline message: true then (more may be there),
// else false. With Take::kLeanly, the same, and it also stops (false)
// before a part or any frame other than a credit, never letting go of mu_
// once it took it.
Result<bool> EndpointImpl::take_frames_in_place(const ReaderRole::Held& role, bool& progressed,
                                                StateLock& lock, Take take) {
  uint8_t copy[endpoint::kHeaderSize + kSmallFrame];
  // Where views stay valid through consume() (keeps_views: RDMA), the
  // unread bytes the last peek() gave, less the frames taken since: the next
  // frame is looked for there first, and peek() is called again only when
  // they end (a credit and the message behind it, one SEND, take one peek(),
  // not two; each frame is still consumed on its own). `stale`: more may
  // have come since. The rings' peek() is inline and cheap, and a credit
  // there is most often a record of its own: each frame peeks afresh
  // (keeping the view cost the shared-memory ping-pong about 25
  // instructions a round trip).
  const bool keep_view = channel_.keeps_views();
  std::span<const uint8_t> view;
  bool stale = false;
  while (true) {
    if (view.size() < endpoint::kHeaderSize) {
      RDMABUF_ASSIGN_OR_RETURN(view, channel_.peek());
      stale = false;
      if (view.size() < endpoint::kHeaderSize) return false;
    }
    // A copy of the header: the peer may write the channel meanwhile.
    uint8_t head[endpoint::kHeaderSize];
    std::memcpy(head, view.data(), sizeof head);
    const auto [size, type] = endpoint::read_header(head);
    if (size > endpoint::kMaxPayload) return false;  // pump() says so
    if (view.size() < endpoint::kHeaderSize + size) {
      if (!stale) return false;
      view = {};  // peek() again: the rest of the frame may have come
      continue;
    }
    const auto payload = view.subspan(endpoint::kHeaderSize, size);
    if (type == Frame::kSentInline || type == Frame::kSentPart) {
      if (type == Frame::kSentPart) {
        if (take == Take::kLeanly) return false;  // its copy lets go of mu_
        endpoint::MessagePart part;
        if (!endpoint::decode_part(payload, part)) return endpoint::malformed(type);
        if (!lock.owns_lock()) lock.lock();
        RDMABUF_RETURN_IF_ERROR(receives_.fill(lock, part, credits_));
        // A part's copy (up to 8 KiB) is the longest hold of mu_: let go
        // after each, so that a long message keeps other callers out for one
        // part at a time, not for all of it.
        lock.unlock();
      } else {
        endpoint::MessageAnswer answer;
        if (!endpoint::decode_answer(type, payload, answer)) return endpoint::malformed(type);
        if (!lock.owns_lock()) lock.lock();
        RDMABUF_RETURN_IF_ERROR(receives_.answer(lock, type, answer, credits_));
        if (take != Take::kAll) {
          channel_.consume(endpoint::kHeaderSize + size);
          progressed = true;
          return true;
        }
      }
    } else {
      if (size > kSmallFrame) return false;
      if (type == Frame::kPosted) {
        Credit credit;
        if (size == endpoint::kBareCreditPayload) {
          // A receive's credit, on every message's path: decoded where it
          // lies, each byte read once.
          if (!endpoint::decode_bare_credit(payload, credit)) return endpoint::malformed(type);
        } else {
          std::memcpy(copy, payload.data(), size);
          RDMABUF_RETURN_IF_ERROR(
              endpoint::decode_credit(std::span<const uint8_t>(copy, size), credit));
        }
        if (!lock.owns_lock()) lock.lock();
        credits_.peer(lock).push_back(std::move(credit));
      } else {
        if (take == Take::kLeanly) return false;  // its dispatch lets go of mu_
        std::memcpy(copy, payload.data(), size);
        if (lock.owns_lock()) lock.unlock();
        if (type == Frame::kNotify && notes_full()) return false;  // pump() waits
        RDMABUF_RETURN_IF_ERROR(dispatch(role, type, std::span<const uint8_t>(copy, size)));
      }
    }
    channel_.consume(endpoint::kHeaderSize + size);
    view = keep_view ? view.subspan(endpoint::kHeaderSize + size) : std::span<const uint8_t>();
    stale = true;
    progressed = true;
  }
}

// A frames-in-place channel: how many bytes receive_some() may copy out of
// it, so that no frame take_frames_in_place() could take where it lies goes
// through the read buffer (twice copied). At a frame's start, the whole
// frames in front when they are not messages; else the frame in front is
// one that it could not take (a large frame other than a message, a
// notification while the queue is full, or one a peer cut across two
// records, which this version's writers never do): its header, then the
// rest of it. The read buffer holds only the start of a frame, if any.
Result<size_t> EndpointImpl::channel_bytes_to_copy(const ReaderRole::Held&) {
  const size_t have = reading_.in_end - reading_.in_begin;
  if (have == 0) {
    RDMABUF_ASSIGN_OR_RETURN(std::span<const uint8_t> view, channel_.peek());
    const size_t before = frames_before_a_message(view);
    return before > 0 ? before : endpoint::kHeaderSize;
  }
  if (have < endpoint::kHeaderSize) return endpoint::kHeaderSize - have;
  // Its size was checked when its header came (pump_frames).
  const auto [size, type] = endpoint::read_header(reading_.in.get() + reading_.in_begin);
  return endpoint::kHeaderSize + size - have;
}

// Takes what the channel holds, up to `size` bytes, without blocking: how
// many, 0 when it has none. From a frames-in-place channel, only the frames
// that cannot be taken where they lie (channel_bytes_to_copy).
Result<size_t> EndpointImpl::receive_some(const ReaderRole::Held& role, uint8_t* out, size_t size) {
  if (!channel_.frames_in_place()) return channel_.read_some(out, size);
  RDMABUF_ASSIGN_OR_RETURN(const size_t most, channel_bytes_to_copy(role));
  RDMABUF_ASSIGN_OR_RETURN(size_t n, channel_.read_some(out, std::min(size, most)));
  // The peer's frames before its end are all in the channel: read them first.
  if (n == 0 && reading_.peer_closed) return Unavailable("connection closed by peer");
  return n;
}

bool EndpointImpl::notes_full() {
  StateLock lock(mu_);
  return notes_.size() >= endpoint::kMaxPendingNotes;
}

// Takes one frame of the peer's (reader role held; inside pump(), whose
// caller wakes the callers waiting on cv_ once a frame was taken).
Status EndpointImpl::dispatch(const ReaderRole::Held&, Frame type,
                              std::span<const uint8_t> payload) {
  switch (type) {
    case Frame::kPosted: {
      Credit credit;
      RDMABUF_RETURN_IF_ERROR(endpoint::decode_credit(payload, credit));
      StateLock lock(mu_);
      credits_.peer(lock).push_back(std::move(credit));
      return Status::Ok();
    }
    case Frame::kSent:
    case Frame::kTooLarge:
    case Frame::kNotTaken:
    case Frame::kSentInline: {
      endpoint::MessageAnswer answer;
      if (!endpoint::decode_answer(type, payload, answer)) return endpoint::malformed(type);
      StateLock lock(mu_);
      return receives_.answer(lock, type, answer, credits_);
    }
    case Frame::kSentPart: {
      endpoint::MessagePart part;
      if (!endpoint::decode_part(payload, part)) return endpoint::malformed(type);
      StateLock lock(mu_);
      return receives_.fill(lock, part, credits_);
    }
    case Frame::kWithdrawn: {
      RDMABUF_ASSIGN_OR_RETURN(const uint64_t seq, endpoint::decode_withdrawn(payload));
      StateLock lock(mu_);
      if (sends_.withdraw_taken(lock, seq)) return Status::Ok();  // its send answers when done
      if (!credits_.peer(lock).erase_first_if([seq](const Credit& c) { return c.seq == seq; })) {
        return Status::Ok();  // answered already: the answer crossed this
      }
      lock.unlock();
      return write_frame(endpoint::answer_frame(Frame::kNotTaken, seq, 0));
    }
    case Frame::kNotify: {
      endpoint::Notice notice;
      RDMABUF_RETURN_IF_ERROR(endpoint::decode_notify(payload, notice));
      return take_notice(notice);
    }
    case Frame::kLendRequest:
    case Frame::kRenew:
    case Frame::kHandleWanted: {
      endpoint::Request request;
      RDMABUF_RETURN_IF_ERROR(endpoint::decode_request(type, payload, request));
      if (type == Frame::kHandleWanted) return answer_handle_request(request.id, request.second);
      const auto lease = std::chrono::milliseconds(std::min<uint64_t>(request.third, 1ull << 40));
      if (type == Frame::kRenew) return answer_renew(request.id, request.second, lease);
      return answer_lend(request.id, request.second, lease);
    }
    case Frame::kLent:
    case Frame::kRenewed:
    case Frame::kReceiveHandle: {
      endpoint::Reply decoded;
      RDMABUF_RETURN_IF_ERROR(endpoint::decode_reply(payload, decoded));
      StateLock lock(mu_);
      auto it = replies_.find(decoded.id);
      if (it == replies_.end()) return Status::Ok();  // its caller gave up
      AwaitedReply& reply = it->second;
      reply.arrived = true;
      if (reply.for_send) sends_.events(lock).push_back(reply.send);
      reply.value = decoded.value;
      if (decoded.code == StatusCode::kOk) {
        reply.body.assign(decoded.body.begin(), decoded.body.end());
      } else {
        reply.status = Status(decoded.code,
                              "the peer: " + std::string(decoded.body.begin(), decoded.body.end()));
      }
      return Status::Ok();
    }
    case Frame::kBuffer: {
      RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer buffer, endpoint::decode_buffer(payload));
      return take_buffer(std::move(buffer));
    }
    default:
      return ProtocolError("unknown endpoint frame type " + std::to_string(static_cast<int>(type)));
  }
}

}  // namespace rdmabuf
