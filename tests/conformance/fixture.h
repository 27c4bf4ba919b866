// The conformance suite's fixture: two managers in this process (an owner
// and a reader), each enabling exactly one backend (config.backends =
// {name}), and the helpers the suite's files share. A backend that is not
// viable on this machine is skipped with its reason printed, unless
// RDMABUF_TEST_REQUIRE_BACKENDS (a comma-separated list) names it: then the
// test fails, so that a run meant to exercise that backend (the Soft-RoCE
// VM's) cannot pass having tested nothing.
//
// Each test runs for every backend with host memory (Backends/...), and
// again with GPU memory on either side and both (Gpu/...: the test CUDA
// driver, tests/helpers/gpu.h).
//
// Across hosts: with RDMABUF_TEST_OWNER_NETNS naming a network namespace
// (another host's, made by scripts/netns_hosts.py), the owner's manager is
// made there (make_owner()), so that every byte between it and the reader
// crosses the link between two hosts' network stacks.
//
// Adding a backend to the suite is one line: its name in backend_names().
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/backend_detail.h"
#include "tests/helpers/gpu.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/printers.h"
#include "tests/helpers/sanitizer.h"

namespace rdmabuf::conformance {

using namespace std::chrono_literals;
using testing::backend_detail;
using testing::count_pattern_words;
using testing::fill_pattern;
using testing::find_mismatch;
using testing::find_not;
using testing::ScopedIgnoreReads;

inline std::vector<std::string> backend_names() {
  return {
      "memory",
      "ibverbs",
      "tcp",
  };
}

// What one instantiation runs: a backend, and where the reader's memory
// (`local`) and the owner's buffers (`remote`) are: host memory, or GPU
// memory (through the test CUDA driver, tests/helpers/gpu.h, unless
// RDMABUF_TEST_REAL_GPU=1 runs on a real one).
//
// `private_host`: host memory on both sides is anonymous and private
// (testing::allocate_private) rather than LocalMemory::allocate's shared
// file; the memory transport copies the one through the kernel and maps
// the other, so it runs the suite with both.
struct Setup {
  std::string backend;
  MemoryKind local = MemoryKind::kHost;
  MemoryKind remote = MemoryKind::kHost;
  bool private_host = false;
};

inline std::vector<Setup> backends_under_test() {
  std::vector<Setup> setups;
  for (const std::string& name : backend_names())
    setups.push_back({name});
  setups.push_back({"memory", MemoryKind::kHost, MemoryKind::kHost, true});
  return setups;
}

// Every backend with GPU memory on the reader's side, the owner's, and both.
inline std::vector<Setup> gpu_setups_under_test() {
  std::vector<Setup> setups;
  for (const std::string& name : backend_names()) {
    setups.push_back({name, MemoryKind::kCuda, MemoryKind::kHost});
    setups.push_back({name, MemoryKind::kHost, MemoryKind::kCuda});
    setups.push_back({name, MemoryKind::kCuda, MemoryKind::kCuda});
  }
  return setups;
}

// Whether RDMABUF_TEST_REQUIRE_BACKENDS names `backend`.
inline bool required_here(const std::string& backend) {
  const char* list = std::getenv("RDMABUF_TEST_REQUIRE_BACKENDS");
  std::stringstream names(list ? list : "");
  for (std::string name; std::getline(names, name, ',');) {
    if (name == backend) return true;
  }
  return false;
}

// Names each instantiation: Backends/Suite.Test/memory, Gpu/Suite.Test/tcp_gpu_local.
inline std::string backend_name(const ::testing::TestParamInfo<Setup>& info) {
  const Setup& s = info.param;
  if (s.private_host) return s.backend + "_private_host";
  if (s.local == MemoryKind::kHost && s.remote == MemoryKind::kHost) return s.backend;
  if (s.remote == MemoryKind::kHost) return s.backend + "_gpu_local";
  if (s.local == MemoryKind::kHost) return s.backend + "_gpu_remote";
  return s.backend + "_gpu_both";
}

inline void PrintTo(const Setup& s, std::ostream* os) {
  *os << s.backend << " (local " << memory_kind_name(s.local) << ", remote "
      << memory_kind_name(s.remote) << (s.private_host ? ", private host memory" : "") << ")";
}

inline constexpr auto kTimeout = 30s;  // generous: a loaded CI machine must not flake
inline constexpr std::byte kSentinel{0xCD};

inline LocalMemory slice(const LocalMemory& m, size_t offset, size_t length) {
  auto s = m.slice(offset, length);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : LocalMemory();
}

inline RemoteBuffer slice(const RemoteBuffer& h, uint64_t offset, uint64_t length) {
  auto s = h.slice(offset, length);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : RemoteBuffer();
}

inline std::vector<Op> one(Op op) {
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  return ops;
}

class ConformanceTest : public ::testing::TestWithParam<Setup> {
 protected:
  const std::string& backend() const { return GetParam().backend; }
  MemoryKind local_kind() const { return GetParam().local; }
  MemoryKind remote_kind() const { return GetParam().remote; }
  bool gpu_setup() const {
    return local_kind() == MemoryKind::kCuda || remote_kind() == MemoryKind::kCuda;
  }

  Config config() const {
    Config c;
    c.backends = {backend()};
    if (remote_kind() == MemoryKind::kCuda) c.lend_device = 0;  // endpoints lend GPU memory
    return c;
  }

  std::unique_ptr<Manager> make(const std::function<void(Config&)>& tweak = {}) {
    Config c = config();
    if (tweak) tweak(c);
    auto m = Manager::create(c);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(m).value() : nullptr;
  }

  // The owner's manager: as make(), or, under RDMABUF_TEST_OWNER_NETNS,
  // made by a thread that joined that network namespace, listening on
  // every interface there. Its listener and I/O threads (which inherit the
  // namespace) and their sockets live in it; handles name its address.
  std::unique_ptr<Manager> make_owner() {
    const char* netns = std::getenv("RDMABUF_TEST_OWNER_NETNS");
    if (!netns || !*netns) return make();
    std::unique_ptr<Manager> made;
    std::thread elsewhere([&] {
      const int fd = ::open(netns, O_RDONLY | O_CLOEXEC);
      const bool joined = fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
      if (fd >= 0) ::close(fd);
      if (!joined) {
        ADD_FAILURE() << "cannot join the network namespace " << netns << " (root needed)";
        return;
      }
      made = make([](Config& c) { c.listen_address = "0.0.0.0:0"; });
    });
    elsewhere.join();
    if (made && made->address().rfind("127.", 0) == 0) {
      ADD_FAILURE() << "the owner in " << netns << " has no address but loopback";
    }
    return made;
  }

  void SetUp() override {
    testing::private_host_memory() = GetParam().private_host;
    if (gpu_setup()) {
      Status gpu = testing::use_test_gpu();
      ASSERT_TRUE(gpu.ok()) << "no GPU memory for this setup: " << gpu.to_string();
    }
    owner_ = make_owner();
    ASSERT_NE(owner_, nullptr);
    bool listed = false;
    for (const BackendInfo& info : owner_->backends()) {
      if (info.name != backend()) continue;
      listed = true;
      level_ = info.level;
      if (!info.viable) {
        if (required_here(backend())) {
          FAIL() << "backend '" << backend() << "' is not viable here: " << info.reason
                 << " (RDMABUF_TEST_REQUIRE_BACKENDS requires it)";
        }
        GTEST_SKIP() << "backend '" << backend() << "' is not viable here: " << info.reason;
      }
    }
    ASSERT_TRUE(listed) << "Manager::backends() does not list '" << backend() << "'";
    if (remote_kind() == MemoryKind::kCuda) {
      // A NIC that can reach no GPU memory (no dma-buf, no peer-memory
      // module: Soft-RoCE) offers none; tests/integration/gpu_test.cc checks
      // that it says why.
      LocalMemory probe = testing::allocate_of(MemoryKind::kCuda, 4096);
      auto offered = owner_->register_buffer(probe);
      if (!offered.ok()) {
        GTEST_SKIP() << "the owner offers no GPU memory over " << backend()
                     << " here: " << offered.status().to_string();
      }
      ASSERT_TRUE(owner_->release(*offered).ok());
    }
    reader_ = make();
    ASSERT_NE(reader_, nullptr);
  }

  // Memory of the reader's kind (the setup's `local`): zero-filled, of
  // pattern `seed`, or of kSentinel bytes.
  LocalMemory allocate(size_t size) const { return testing::allocate_of(local_kind(), size); }
  LocalMemory with_pattern(size_t size, uint64_t seed, uint64_t start = 0) const {
    return testing::with_pattern_of(local_kind(), size, seed, start);
  }
  LocalMemory with_sentinel(size_t size) const {
    return testing::filled_of(local_kind(), size, kSentinel);
  }
  // A copy of any memory's bytes in host memory, to check them: use
  // bytes(m).span() where host memory would use m.span().
  static testing::HostBytes bytes(const LocalMemory& m) { return testing::HostBytes(m); }

  struct Owned {
    LocalMemory memory;
    RemoteBuffer handle;
  };
  // A buffer of `size` bytes of pattern `seed`, of the owner's kind (the
  // setup's `remote`), registered with `owner`.
  Owned own(size_t size, uint64_t seed, Manager* owner = nullptr) {
    Owned o{testing::with_pattern_of(remote_kind(), size, seed), {}};
    auto h = (owner ? owner : owner_.get())->register_buffer(o.memory);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) o.handle = *h;
    return o;
  }

  // The owner's memory, read in this thread after remote writes (sanitizer.h).
  static std::vector<std::byte> snapshot(const LocalMemory& m) {
    ScopedIgnoreReads quiet;
    return testing::HostBytes(m).vector();
  }

  std::unique_ptr<Manager> owner_;
  std::unique_ptr<Manager> reader_;
  TransportLevel level_ = TransportLevel::kTcp;
};

}  // namespace rdmabuf::conformance
