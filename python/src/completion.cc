// Notifier and Completion: how a transfer that finishes on a library thread
// reaches an asyncio event loop without the GIL and without polling.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "python/src/binding.h"

namespace rdmabuf::python {

Notifier::Notifier() {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) {
    raise_code(StatusCode::kInternal, std::string("eventfd: ") + std::strerror(errno));
  }
}

Notifier::~Notifier() {
  if (fd_ >= 0) close(fd_);
}

void Notifier::push(uint64_t token) {
  bool wake;
  {
    std::lock_guard lock(mu_);
    wake = ready_.empty();
    ready_.push_back(token);
  }
  if (wake) {
    const uint64_t one = 1;
    // Cannot fail short of a bug: the counter would have to reach 2^64 - 1.
    ssize_t n;
    do {
      n = write(fd_, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
  }
}

std::vector<uint64_t> Notifier::drain() {
  uint64_t count;
  ssize_t n;
  do {
    n = read(fd_, &count, sizeof count);  // EAGAIN when already cleared: fine
  } while (n < 0 && errno == EINTR);
  std::vector<uint64_t> out;
  std::lock_guard lock(mu_);
  out.swap(ready_);
  return out;
}

void Completion::fire() {
  std::vector<std::pair<std::shared_ptr<Notifier>, uint64_t>> waiters;
  {
    std::lock_guard lock(mu_);
    done_ = true;
    waiters.swap(waiters_);
  }
  for (auto& [notifier, token] : waiters)
    notifier->push(token);
}

bool Completion::attach(std::shared_ptr<Notifier> notifier, uint64_t token) {
  std::lock_guard lock(mu_);
  if (done_) return false;
  waiters_.emplace_back(std::move(notifier), token);
  return true;
}

}  // namespace rdmabuf::python
