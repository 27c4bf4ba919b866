// Shared by the integration tests: the test process is the reader/writer
// (its own Manager), and the owners are real rdmabuf_test_peer processes.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/peer.h"
#include "tests/helpers/printers.h"

namespace rdmabuf::testing {

using namespace std::chrono_literals;

// Normal ops get a generous timeout so that a loaded machine does not
// flake; tests of timeouts use short ones.
constexpr auto kTimeout = 30s;
constexpr std::byte kSentinel{0xCD};

// Starts a peer; null after an ADD_FAILURE when it does not start.
inline std::unique_ptr<TestPeer> start_peer(std::vector<TestPeer::BufferSpec> buffers,
                                            std::vector<std::string> env = {},
                                            std::string listen = {}) {
  TestPeer::Options options;
  options.buffers = std::move(buffers);
  options.env = std::move(env);
  options.listen = std::move(listen);
  std::string error;
  auto peer = TestPeer::start(options, &error);
  if (!peer) ADD_FAILURE() << "cannot start rdmabuf_test_peer: " << error;
  return peer;
}

// Starts a peer that listens on `address`, where one just died: the port
// may take a moment to free, so it tries for up to 5 s. Null after an
// ADD_FAILURE when it does not start.
inline std::unique_ptr<TestPeer> restart_peer_at(const std::string& address,
                                                 std::vector<TestPeer::BufferSpec> buffers,
                                                 std::vector<std::string> env = {}) {
  TestPeer::Options options;
  options.buffers = std::move(buffers);
  options.env = std::move(env);
  options.listen = address;
  std::string error;
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (auto peer = TestPeer::start(options, &error)) return peer;
    std::this_thread::sleep_for(100ms);
  }
  ADD_FAILURE() << "cannot start rdmabuf_test_peer at " << address << ": " << error;
  return nullptr;
}

// How long `f()` takes.
template <typename F>
Clock::duration timed(F&& f) {
  auto start = Clock::now();
  f();
  return Clock::now() - start;
}

// A manager in this process that uses TCP only.
inline std::unique_ptr<Manager> make_manager(const std::function<void(Config&)>& tweak = {}) {
  Config c;
  c.backends = {"tcp"};
  if (tweak) tweak(c);
  auto m = Manager::create(c);
  if (!m.ok()) {
    ADD_FAILURE() << m.status().to_string();
    return nullptr;
  }
  return std::move(m).value();
}

inline LocalMemory allocate(size_t size) {
  auto m = LocalMemory::allocate(size);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : LocalMemory();
}

inline LocalMemory with_pattern(size_t size, uint64_t seed, uint64_t start = 0) {
  LocalMemory m = allocate(size);
  fill_pattern(m.span(), seed, start);
  return m;
}

inline LocalMemory with_sentinel(size_t size) {
  LocalMemory m = allocate(size);
  std::memset(m.data(), static_cast<int>(kSentinel), size);
  return m;
}

inline RemoteBuffer slice(const RemoteBuffer& h, uint64_t offset, uint64_t length) {
  auto s = h.slice(offset, length);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : RemoteBuffer();
}

inline LocalMemory slice(const LocalMemory& m, size_t offset, size_t length) {
  auto s = m.slice(offset, length);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : LocalMemory();
}

// A peer that is done with must exit cleanly: a sanitizer report in it
// turns into a non-zero exit status.
inline void expect_clean_exit(TestPeer& peer) {
  EXPECT_TRUE(peer.exit()) << "the test peer did not exit cleanly (see its stderr)";
}

}  // namespace rdmabuf::testing
