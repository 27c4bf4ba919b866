// SpinStretch: how much longer than the busy-poll window an endpoint's
// reader keeps looking, yielding the CPU between looks, before it sleeps,
// learned from the waits before.
//
// A wait spins for the window (RDMABUF_BUSY_POLL_US), then sleeps until the
// channel wakes it. When what it waits for keeps coming a little after the
// window (a peer that answers after some work; every message of a few KiB
// or more in the Soft-RoCE VM, where one takes several hundred µs), every
// wait pays a sleep and a wake-up: in that VM a 4 KiB message went one way
// in 957 µs with a 200 µs window and in 382 µs with a 5 ms one (UCX, which
// never sleeps: 336-374). So a wait that slept and then got its answer
// within kMostWindows windows after its busy-poll window stretches the
// next waits by that much and a quarter more; one that slept longer, or
// that reached its deadline with the stretch spent (missed()), halves the
// stretch, so that a peer gone quiet costs a few stretched waits, not a
// core. The stretch yields (sched_yield) between looks, so that a peer
// sharing the core runs meanwhile. With the window at 0 (spinning off)
// there is no stretch. Not thread-safe: its owner's reader role guards it.
#pragma once

#include <algorithm>
#include <chrono>

namespace rdmabuf {

class SpinStretch {
 public:
  // The longest stretch, in busy-poll windows.
  static constexpr int kMostWindows = 8;

  // How long to keep looking, yielding, after the busy-poll window.
  std::chrono::nanoseconds length() const { return length_; }

  // A wait reached its deadline after it had spent the stretch, with
  // nothing come: a peer gone quiet.
  void missed() { length_ /= 2; }

  // A wait that slept on the way got what it waited for `waited` after its
  // spin began, with busy-poll window `window`. Only such waits teach it: a
  // wait that did not sleep found the stretch (or the window) long enough,
  // and its caller leaves the stretch as it is.
  void learn_from_sleep(std::chrono::nanoseconds waited, std::chrono::nanoseconds window) {
    const std::chrono::nanoseconds most = window * kMostWindows;
    const std::chrono::nanoseconds beyond = waited - window;
    if (beyond > most || beyond <= std::chrono::nanoseconds::zero()) {
      length_ /= 2;
    } else {
      length_ = std::min(most, beyond + beyond / 4);
    }
  }

 private:
  std::chrono::nanoseconds length_{0};
};

}  // namespace rdmabuf
