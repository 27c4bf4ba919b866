// The conformance suite's fixture: two managers in this process (an owner
// and a reader), each enabling exactly one backend (config.backends =
// {name}), and the helpers the suite's files share. A backend that is not
// viable on this machine is skipped with its reason printed, unless
// RDMABUF_TEST_REQUIRE_BACKENDS (a comma-separated list) names it: then the
// test fails, so that a run meant to exercise that backend (the Soft-RoCE
// VM's) cannot pass having tested nothing.
//
// Adding a backend to the suite is one line: its name in backends_under_test().
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/backend_detail.h"
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

inline std::vector<std::string> backends_under_test() {
  return {
      "memory",
      "ibverbs",
      "tcp",
  };
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

// Names each instantiation after its backend: Backends/Suite.Test/memory.
inline std::string backend_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

inline constexpr auto kTimeout = 30s;  // generous: a loaded CI machine must not flake
inline constexpr std::byte kSentinel{0xCD};

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

class ConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& backend() const { return GetParam(); }

  Config config() const {
    Config c;
    c.backends = {backend()};
    return c;
  }

  std::unique_ptr<Manager> make(const std::function<void(Config&)>& tweak = {}) {
    Config c = config();
    if (tweak) tweak(c);
    auto m = Manager::create(c);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(m).value() : nullptr;
  }

  void SetUp() override {
    owner_ = make();
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
    reader_ = make();
    ASSERT_NE(reader_, nullptr);
  }

  struct Owned {
    LocalMemory memory;
    RemoteBuffer handle;
  };
  // A buffer of `size` bytes of pattern `seed`, registered with `owner`.
  Owned own(size_t size, uint64_t seed, Manager* owner = nullptr) {
    Owned o{with_pattern(size, seed), {}};
    auto h = (owner ? owner : owner_.get())->register_buffer(o.memory);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) o.handle = *h;
    return o;
  }

  // The owner's memory, read in this thread after remote writes (sanitizer.h).
  static std::vector<std::byte> snapshot(const LocalMemory& m) {
    ScopedIgnoreReads quiet;
    return std::vector<std::byte>(m.data(), m.data() + m.size());
  }

  std::unique_ptr<Manager> owner_;
  std::unique_ptr<Manager> reader_;
  TransportLevel level_ = TransportLevel::kTcp;
};

}  // namespace rdmabuf::conformance
