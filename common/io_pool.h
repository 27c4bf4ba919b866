// A fixed set of I/O threads that serve many connections. Each connection is
// an IoSession: while it has nothing to do it waits in one epoll set, and
// when its socket is ready it runs on whichever pool thread takes the event
// first, never on two at once (EPOLLONESHOT). The number of threads does not
// grow with the number of connections.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/socket.h"
#include "rdmabuf/transfer.h"

namespace rdmabuf {

// One connection served by an IoPool (or by serve_on_this_thread). Its
// methods are called by one thread at a time, with happens-before between
// the calls, so a session needs no lock of its own for its state.
class IoSession {
 public:
  enum class Wait { kReadable, kWritable, kClose };

  virtual ~IoSession() = default;
  // The socket, owned by the session and closed when it is destroyed. The
  // same descriptor for the session's whole life.
  virtual int fd() const = 0;
  // Runs when the socket is ready for what the last call asked for (a
  // session just added waits until its socket is readable). Does what it
  // can without waiting on the socket; says what to wait for next, or that
  // the session is over. A wake-up may find nothing to do.
  virtual Wait on_ready() = 0;
  // Asked after on_ready or on_timeout returns a wait: the latest time the
  // readiness may come; past it, on_timeout runs instead. Deadline::max(): none.
  virtual Deadline deadline() const { return Deadline::max(); }
  virtual Wait on_timeout() { return Wait::kClose; }
  // Asked after on_ready returns a wait: whether the session holds nothing
  // in progress, so that it may be closed to make room for another.
  virtual bool idle() const { return false; }
  // Called on an idle session before the pool closes it to make room; false
  // when it turns out not to be idle after all (bytes arrived), and stays.
  virtual bool on_evict() { return true; }
};

class IoPool {
 public:
  // `threads` >= 1. A thread that has run a session keeps looking for the
  // next ready one for `busy_poll` (yielding the CPU between looks) before
  // it sleeps: a request that follows within that window costs no wake-up.
  static Result<std::unique_ptr<IoPool>> create(int threads,
                                                std::chrono::microseconds busy_poll = {});
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Takes the session; its on_ready runs on a pool thread once its socket
  // is readable (a fresh connection: once its first bytes arrive) or its
  // deadline passes. Destroyed (closing the socket) at once if the pool has
  // stopped.
  void add(std::unique_ptr<IoSession> session);
  // Closes the idle session that has waited longest (after its on_evict),
  // to make room; false when no session is idle.
  bool evict_idle();
  // Sessions held, running or waiting.
  size_t size() const { return count_.load(std::memory_order_relaxed); }
  // Sessions waiting idle (those evict_idle may close).
  size_t idle_count() const;
  int threads() const { return static_cast<int>(threads_.size()); }
  // For a session's on_ready deciding whether to spin before it returns a
  // wait. On a pool thread: false while every other pool thread is busy
  // too (spinning would hold up the sessions that turn ready meanwhile) or
  // another thread spins already (one spinner at a time: spinners compete
  // for the cores with the threads doing the work); true elsewhere.
  static bool may_spin();
  // Lets the threads finish the sessions they are running, joins them, and
  // destroys every session. Sessions must see their own stop signal (a
  // flag their on_ready checks) for this to return promptly.
  void stop();

 private:
  struct Entry {
    std::unique_ptr<IoSession> session;
    bool parked = false;  // waiting in the epoll set (else a thread runs it)
    bool idle = false;
    Deadline deadline = Deadline::max();
    std::list<uint64_t>::iterator lru;  // in idle_lru_ when parked && idle
  };

  IoPool(Fd epoll, Fd stop, Fd timer, std::chrono::microseconds busy_poll);
  void run();
  // Takes a parked session for this thread; null when it is gone or taken.
  Entry* claim(uint64_t id);
  // Parks the session this thread ran, or removes it, as `wait` says.
  void settle(uint64_t id, Entry* entry, IoSession::Wait wait);
  void park_locked(uint64_t id, Entry* entry, IoSession::Wait wait);
  void remove(uint64_t id, Entry* entry);
  void run_timeouts();
  void arm_timer_locked(Deadline at);
  // The one spinner's token, held by at most one thread (thread-local flag).
  bool take_spin_token();
  void drop_spin_token();

  Fd epoll_;
  Fd stop_;   // eventfd: level-triggered in the epoll set, wakes every thread
  Fd timer_;  // timerfd armed for the earliest deadline of a parked session
  const std::chrono::microseconds busy_poll_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> count_{0};
  std::atomic<int> waiting_{0};   // threads looking for a ready session
  std::atomic<int> spinners_{0};  // 1 while a thread holds the spin token

  // Guards everything below; epoll_ctl calls on a session's socket happen
  // under it too, so that no other thread can close that socket meanwhile.
  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Entry>> entries_;
  std::list<uint64_t> idle_lru_;  // parked idle sessions, longest waiting first
  Deadline timer_at_ = Deadline::max();
  bool stopped_ = false;
};

// Serves `session` on the calling thread until it closes (or `stop_fd`,
// when >= 0, turns readable): the pool's loop for one session.
void serve_on_this_thread(IoSession& session, int stop_fd = -1);

// The pool size for `requested` threads (RDMABUF_IO_THREADS; 0: as many as
// the cores, within 4..16: at least as many as the default tcp streams of
// one peer, so that one busy peer does not share threads).
int io_threads_for(int requested);

}  // namespace rdmabuf
