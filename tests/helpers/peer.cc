#include "tests/helpers/peer.h"

#include <sys/wait.h>

#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "common/crc32c.h"

namespace rdmabuf::testing {

std::string test_peer_path() {
#ifdef RDMABUF_TEST_PEER
  return RDMABUF_TEST_PEER;
#else
  return "rdmabuf_test_peer";
#endif
}

std::string crc_line(const void* data, size_t size) {
  char text[32];
  std::snprintf(text, sizeof text, "crc %08" PRIx32, crc32c(data, size));
  return text;
}

std::unique_ptr<TestPeer> TestPeer::start(const Options& options, std::string* error) {
  std::vector<std::string> args;
  for (const BufferSpec& b : options.buffers) {
    args.push_back("--buffer");
    args.push_back(std::to_string(b.size) + ":" + std::to_string(b.seed));
  }
  if (!options.listen.empty()) {
    args.push_back("--listen");
    args.push_back(options.listen);
  }
  if (options.gpu) args.push_back("--gpu");
  std::unique_ptr<TestPeer> peer(new TestPeer());
  peer->specs_ = options.buffers;
  peer->process_ = Subprocess::spawn(test_peer_path(), args, options.env, error);
  if (!peer->process_) return nullptr;
  // Filling hundreds of MiB with a pattern takes a while under sanitizers.
  const auto timeout = std::chrono::seconds(60);
  auto first = peer->process_->read_line(timeout);
  if (!first || first->rfind("address ", 0) != 0) {
    *error = "test peer did not print its address (got '" + first.value_or("<nothing>") + "')";
    return nullptr;
  }
  peer->address_ = first->substr(8);
  for (size_t i = 0; i < options.buffers.size(); ++i) {
    auto line = peer->process_->read_line(timeout);
    if (!line || !peer->add_handle_line(*line, error)) {
      if (!line) *error = "test peer did not print handle " + std::to_string(i);
      return nullptr;
    }
  }
  auto ready = peer->process_->read_line(timeout);
  if (!ready || *ready != "ready") {
    *error = "test peer did not say ready";
    return nullptr;
  }
  return peer;
}

bool TestPeer::add_handle_line(const std::string& line, std::string* error) {
  std::istringstream in(line);
  std::string word, text;
  size_t index = 0;
  if (!(in >> word >> index >> text) || word != "handle" || index != handles_.size()) {
    *error = "unexpected line from the test peer: '" + line + "'";
    return false;
  }
  auto handle = RemoteBuffer::from_text(text);
  if (!handle.ok()) {
    *error = "test peer printed a handle that does not decode: " + handle.status().to_string();
    return false;
  }
  handles_.push_back(*handle);
  texts_.push_back(text);
  return true;
}

std::string TestPeer::command(const std::string& line, std::chrono::milliseconds timeout) {
  if (!process_->write_line(line)) return "";
  return process_->read_line(timeout).value_or("");
}

std::string TestPeer::crc(size_t i, uint64_t offset, uint64_t length) {
  return command("crc " + std::to_string(i) + " " + std::to_string(offset) + " " +
                 std::to_string(length));
}

std::string TestPeer::check(size_t i, uint64_t offset, uint64_t length, uint64_t seed,
                            uint64_t start) {
  return command("check " + std::to_string(i) + " " + std::to_string(offset) + " " +
                 std::to_string(length) + " " + std::to_string(seed) + " " + std::to_string(start));
}

std::string TestPeer::zeros(size_t i, uint64_t offset, uint64_t length) {
  return command("zeros " + std::to_string(i) + " " + std::to_string(offset) + " " +
                 std::to_string(length));
}

uint64_t TestPeer::words(size_t i, uint64_t offset, uint64_t length, uint64_t seed,
                         uint64_t start) {
  std::string reply =
      command("words " + std::to_string(i) + " " + std::to_string(offset) + " " +
              std::to_string(length) + " " + std::to_string(seed) + " " + std::to_string(start));
  if (reply.rfind("words ", 0) != 0) return UINT64_MAX;
  return std::stoull(reply.substr(6));
}

int TestPeer::register_buffer(uint64_t size, uint64_t seed) {
  std::string reply = command("register " + std::to_string(size) + " " + std::to_string(seed));
  std::string error;
  if (!add_handle_line(reply, &error)) return -1;
  specs_.push_back(BufferSpec{size, seed});
  return static_cast<int>(handles_.size() - 1);
}

bool TestPeer::exit() {
  if (command("exit") != "bye") return false;
  auto status = process_->wait(std::chrono::seconds(30));
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

}  // namespace rdmabuf::testing
