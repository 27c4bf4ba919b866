// TestPeer: a running rdmabuf_test_peer (see test_peer.cc) and its handles.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rdmabuf/buffer.h"
#include "tests/helpers/process.h"

namespace rdmabuf::testing {

// The path of rdmabuf_test_peer, from the build (RDMABUF_TEST_PEER).
std::string test_peer_path();

class TestPeer {
 public:
  struct BufferSpec {
    uint64_t size = 0;
    uint64_t seed = 0;
  };
  struct Options {
    std::vector<BufferSpec> buffers;
    // "NAME=VALUE" entries added to the peer's environment.
    std::vector<std::string> env;
    // --listen; empty for the default (127.0.0.1:0).
    std::string listen;
    // --gpu: its memory on GPU 0 (the test driver, unless
    // RDMABUF_TEST_REAL_GPU=1; see gpu.h).
    bool gpu = false;
  };

  // Starts a peer and reads its address and handles. Null, with `*error`
  // set, when it does not start or does not print them within 60 s.
  static std::unique_ptr<TestPeer> start(const Options& options, std::string* error);

  const std::string& address() const { return address_; }
  size_t buffer_count() const { return handles_.size(); }
  const RemoteBuffer& handle(size_t i) const { return handles_.at(i); }
  const std::string& handle_text(size_t i) const { return texts_.at(i); }
  const BufferSpec& spec(size_t i) const { return specs_.at(i); }
  Subprocess& process() { return *process_; }

  // Sends one command and returns its one-line answer; "" when the peer
  // did not answer within `timeout` (stopped, dead).
  std::string command(const std::string& line,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Conveniences over command(); see test_peer.cc for the answers.
  std::string release(size_t i) { return command("release " + std::to_string(i)); }
  std::string crc(size_t i, uint64_t offset, uint64_t length);
  std::string check(size_t i, uint64_t offset, uint64_t length, uint64_t seed, uint64_t start);
  // check() of the whole buffer against the pattern it was created with.
  std::string check_original(size_t i) {
    return check(i, 0, specs_.at(i).size, specs_.at(i).seed, 0);
  }
  std::string zeros(size_t i, uint64_t offset, uint64_t length);
  uint64_t words(size_t i, uint64_t offset, uint64_t length, uint64_t seed, uint64_t start);
  // Registers one more buffer; its index, or -1 on failure.
  int register_buffer(uint64_t size, uint64_t seed);
  // Asks the peer to exit and waits for it; true when it exited with 0.
  bool exit();

 private:
  bool add_handle_line(const std::string& line, std::string* error);

  std::unique_ptr<Subprocess> process_;
  std::string address_;
  std::vector<RemoteBuffer> handles_;
  std::vector<std::string> texts_;
  std::vector<BufferSpec> specs_;
};

// "crc XXXXXXXX" for `bytes`, as the peer answers crc commands.
std::string crc_line(const void* data, size_t size);

}  // namespace rdmabuf::testing
