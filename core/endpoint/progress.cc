// Progress: whoever waits reads.
//
// Frames are read and dispatched, in order, by whichever thread holds the
// reader role (reader_role.h). A caller that waits for the peer (a credit, a
// message, a reply) takes the role and reads the channel itself, so what it
// waits for reaches it without a hand-off between threads; other callers
// follow on cv_ and take the role when it comes free. When no caller has
// held it since the endpoint's server last looked (kLinger to kMostLinger
// before), the server takes it, woken by epoll (server.h: a task on one of
// the manager's event loops, whose turns run on its endpoint workers; an
// endpoint has no thread of its own): callers that read lately
// are likely back within microseconds, and the endpoint's server, woken
// once, then looks again after kLinger, and less often while callers keep
// reading (up to kMostLinger), rather than at every frame. So frames nobody
// waits for (withdrawals, lend requests, notifications) are read at once
// when callers have been gone a while, within about 2 * kLinger after one
// short call, and within about 2 * kMostLinger after callers read for
// several milliseconds (one long wait will do), even while no call waits.
// Once two looks in a row find the role held with no caller's turn ending
// between (a long wait, which reads whatever comes), the server sleeps
// until that caller gives the role back and wakes it (take_role): an idle
// endpoint costs no wake-ups. Notifications are queued, and delivered by
// the endpoint's server alone, so a handler never runs inside a caller's
// call. The waits themselves are templates: progress_templates.h.
#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "core/endpoint/endpoint_impl.h"

namespace rdmabuf {
namespace {

// How long after a caller last read the endpoint's server leaves the channel
// to callers: kLinger at first, twice as long at each look that finds
// callers read meanwhile, up to kMostLinger. A look takes a core from
// whoever runs there: in the Soft-RoCE VM, where a ping-pong's two
// processes keep both cores busy, a look every kLinger held the median 8 B
// message at 24.5-25.3 us one way against 20.9-21.7 with looks backing off
// to 8 ms (16 ms gained nothing more), and its 90th percentile at 96-185 us
// against 47-50. The price: a frame that comes just after callers stop
// reading, while no call waits, may wait for the look after next (about 2
// * kMostLinger), and so may a credit held back (see server_look: a look while
// callers read sends only the credits that are due).
constexpr int kMostLingerMs = 8;

}  // namespace

// The server takes the reader role if it is free; if not, and
// `until_released`, its holder's release wakes the server.
std::optional<ReaderRole::Held> EndpointImpl::take_role(bool until_released) {
  StateLock lock(mu_);
  if (role_.held(lock)) {
    if (until_released) role_.want(lock);
    return std::nullopt;
  }
  return role_.take(lock);
}

void EndpointImpl::give_back_role() {
  StateLock lock(mu_);
  release_role(lock);
}

// Gives the reader role back, waking the callers that wait for it or for
// what was read, and the endpoint's server when it waits for the role
// (take_role): after it found the role held, with no caller's turn ending,
// at two looks in a row (a wait of some 8 to 16 ms or more, an idle
// endpoint's), so the write comes once a long wait, not once a message.
void EndpointImpl::release_role(const StateLock& lock) {
  const bool wanted = role_.release(lock);
  wake_sleepers(lock);
  if (wanted) [[unlikely]]
    signal_eventfd(wake_.get());
}

// Between two looks at the channel while spinning. A look at a frames-in-
// place channel is a load (or a user-space poll of a completion queue):
// spin on it, a CPU pause at a time (about 25 ns here), for as long as a
// look at everything else would take about ten times over, and stop as
// soon as bytes come. In the Soft-RoCE VM an 8 B message went one way in
// 22.4-23.7 us so against 25.3-25.7 with a yield, and the look at the
// clock between spins (a system call there) came 32 times less often. A
// look at a stream channel is a system call, and a yield lets other
// threads run meanwhile.
//
// `core_shared`: the endpoint's maker may run on one CPU alone (one_cpu_),
// or the peer's reader began its last wait on this thread's CPU (the rings
// tell). Then the peer runs only when this side lets go of the core, so a
// wait yields from its first look: with both processes on one CPU an 8 B
// message went one way through shared memory in 1.6-2.6 µs so, against
// 204-210 when the wait spun for its whole window (UCX, whose waits spin
// until the kernel preempts them: 3200-4000).
void EndpointImpl::relax(bool core_shared) {
  if (!channel_.frames_in_place() || core_shared) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  for (int i = 0; i < 32 && !channel_.has_incoming(); ++i)
    __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Sleeps (reader role held) until the channel may have bytes, or
// `deadline`; false when the endpoint is closing. Also wakes when a posted
// send's write finished (sends_wake_).
bool EndpointImpl::sleep_on_channel(const ReaderRole::Held& role, Deadline deadline) {
  if (!channel_.prepare_sleep()) return true;  // bytes came meanwhile
  // The RDMA channel's wakeup last (-1, ignored by poll, without one).
  pollfd watched[4] = {{fd_.get(), POLLIN, 0},
                       {stop_.get(), POLLIN, 0},
                       {sends_wake_.get(), POLLIN, 0},
                       {channel_.wakeup_fd(), POLLIN, 0}};
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  // An error (EINTR) or the deadline: the caller looks again.
  if (::poll(watched, 4, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30))) > 0) {
    if (watched[1].revents != 0) return false;
    if (watched[2].revents != 0) drain_eventfd(sends_wake_.get());
  }
  if (channel_.frames_in_place()) take_doorbells(role);
  return true;
}

// A frames-in-place channel: empties the TCP connection of doorbells (it
// carries nothing else) and notes its end; over RDMA, takes the channel's
// wakeups too (as doorbells). Reader role held.
//
// One doorbell wakes every sleeper of this side, but a caller may take it
// before the endpoint's server, asleep on its events, has looked: then the
// server would sleep on with its request used up, and frames no call waits
// for would sit in the channel. So a taken doorbell is counted, and the
// endpoint's server, when it sleeps, is woken to look again.
void EndpointImpl::take_doorbells(const ReaderRole::Held&) {
  if (!channel_.take_doorbells(reading_.peer_closed)) return;
  doorbells_taken_.fetch_add(1);  // seq_cst, against serve_sleeping_ (see server_wait)
  // Not when the endpoint's server waits for the role's holder, which takes
  // the frames this doorbell rang for (and then wakes it).
  if (serve_sleeping_.load() && !role_.wanted()) signal_eventfd(wake_.get());
}

// Arms the endpoint server's one-shot watches on the socket and the RDMA
// channel's wakeups.
void EndpointImpl::watch_socket() {
  for (int watched : {fd_.get(), channel_.wakeup_fd()}) {
    if (watched < 0) continue;
    epoll_event e{};
    e.events = EPOLLIN | EPOLLONESHOT;
    e.data.fd = watched;
    ::epoll_ctl(events_.get(), EPOLL_CTL_MOD, watched, &e);
  }
}

// The server's steps (server.h runs them, one at a time). It arms its watch
// on the socket only after it read it itself; callers leave the watch as it
// is. Woken while callers read, it looks again after kLinger, then after
// twice as long each time callers read meanwhile (up to kMostLinger),
// until they have been gone since its last look.

// Before the server waits for its events: for how long, in ms (-1: until
// one comes), or kNoWait: credits are held back with no look due, so a
// turn goes on at once and sends them.
int EndpointImpl::server_wait() {
  ServerState& s = server_;
  // Waiting with no timeout: a frame deferred from now on wakes the server.
  serve_sleeping_.store(s.timeout_ms < 0);
  if (s.timeout_ms < 0 && channel_.frames_in_place() &&
      doorbells_taken_.load() != doorbells_seen_) {
    // A caller took a doorbell since the server asked for one: it may have
    // been the server's. Look again soon instead of waiting on it.
    serve_sleeping_.store(false);
    s.timeout_ms = kLingerMs;
  }
  if (s.timeout_ms < 0 && credits_.any_held()) return kNoWait;
  return s.timeout_ms;
}

// The wait ended, `woken` by that many events (0: the look's time came,
// or there was no wait): what follows. Never blocks, and takes no lock.
ServerLook EndpointImpl::server_look(int woken) {
  serve_sleeping_.store(false);
  if (woken == 0 && server_.timeout_ms >= 0 && role_.led_lately()) {
    // A look that nothing woke, while callers read. Their waits answer
    // what the peer sends, move sends on after each read and send the
    // credits held back once due; whatever needs the server (a
    // notification to deliver, a write that finished while no caller
    // read, the end) signals one of its watches. Left for it: held
    // credits that are due (a receive posted with no wait after it). The
    // others wait for the next frame, or the server's first look after
    // callers stop, as the peer does not need them yet. Otherwise no lock
    // and no write: a look does not meet a caller on mu_ (in the
    // Soft-RoCE VM a futex wake then sat on the caller's message's way)
    // nor send credits of its own (8 B ping-pong: 4.00 packets a round
    // trip, against 4.01-4.02 when each look sent what was held). The
    // price: a send that became ready just as a wait ended (at its
    // deadline, or a writer's read while blocked, which moves no sends)
    // moves at the look after next, not the next.
    server_.held_looks = 0;
    look_later();
    return credits_.any_held_now() && credits_.due() ? ServerLook::kSendCredits : ServerLook::kDone;
  }
  return ServerLook::kTurn;
}

// Callers read: the next look, and the one after.
void EndpointImpl::look_later() {
  server_.timeout_ms = server_.linger_ms;
  server_.linger_ms = std::min(2 * server_.linger_ms, kMostLingerMs);
}

// A turn (on a worker: it may block); false once serving ended.
bool EndpointImpl::serve_turn(ServerLook look) {
  ServerState& s = server_;
  if (look == ServerLook::kSendCredits) {
    flush().ignore();
    return true;
  }
  if (look == ServerLook::kFailed) {
    break_with(Internal("the endpoint's server lost its events (epoll)"));
    return false;
  }
  drain_eventfd(wake_.get());
  flush().ignore();
  progress_sends();  // writes that finished, credits read by callers
  if (!deliver_notes()) {
    break_with(Cancelled("the manager is shutting down"));
    return end_serving();
  }
  if (stopping()) return end_serving();
  // A waiter that looked for notifications went to sleep (looks_ended):
  // read again now, rather than after callers have been gone a while.
  const bool handed_back = reader_wanted_.exchange(false);
  if (role_.led_lately() && !handed_back) {
    s.held_looks = 0;
    look_later();
    return true;
  }
  // The role held at this look and the one before, with no caller's turn
  // ending between: one wait that reads every frame that comes (an idle
  // endpoint's receive waiting for a day, say). Its release wakes the
  // server, which waits until then: looking every kMostLinger meanwhile
  // cost each idle endpoint 125 wake-ups a second. (After one such look
  // it looks once more: a wait that ends within it needs no wake-up.) The
  // holder takes the doorbells too, so none is the server's to wait for.
  const bool until_released = s.held_looks > 0;
  const std::optional<ReaderRole::Held> role = take_role(until_released);
  if (!role) {
    if (handed_back) reader_wanted_.store(true);  // at the release, or the next look
    if (until_released) {
      s.held_looks = 0;
      s.timeout_ms = -1;
      doorbells_seen_ = doorbells_taken_.load();
    } else {
      ++s.held_looks;
      look_later();
    }
    return true;
  }
  s.held_looks = 0;
  s.linger_ms = kLingerMs;
  s.timeout_ms = -1;
  Status st;
  const bool in_place = channel_.frames_in_place();
  if (in_place) take_doorbells(*role);
  while (true) {
    bool progressed = true;
    while (st.ok() && progressed && !notes_full()) {
      progressed = false;
      st = pump(*role, progressed);
      if (progressed) cv_.notify_all();
    }
    // Before sleeping, a frames-in-place reader asks for a doorbell (or
    // arms its wakeups); bytes that came meanwhile are read first.
    if (!st.ok() || !in_place || notes_full() || channel_.prepare_sleep()) break;
  }
  doorbells_seen_ = doorbells_taken_.load();
  watch_socket();
  give_back_role();
  if (!st.ok()) {
    fail_reading(st);
    return end_serving();
  }
  progress_sends();  // with the credits just read
  return true;
}

// The last turn: delivers what was read before the end, while the queue
// has room. False, for serve_turn to return.
bool EndpointImpl::end_serving() {
  deliver_notes();
  return false;
}

// The server takes no more steps (server.h): after its last turn, or when
// the manager's loops or workers stopped first, in which case nothing
// reads for the endpoint any more and it breaks. close() waits for this.
void EndpointImpl::served_out() {
  // (Not kCancelled: that would wait for the channel's writes to drain.)
  if (!stopping()) {
    break_with(FailedPrecondition(
        "the endpoint's server stopped: its manager shut down, or no thread could start"));
  }
  std::lock_guard lock(served_mu_);
  served_out_ = true;
  served_cv_.notify_all();
}

}  // namespace rdmabuf
