// Fixtures for tests over ibverbs alone, which skip, saying why, where
// ibverbs is not viable (scripts/softroce-vm runs these tests): one that
// only checks that, and one of a reader and an owner, with one buffer of
// the owner's.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "tests/integration/integration.h"

namespace rdmabuf::testing {

// Empty when ibverbs is viable here, else why not (asked once).
inline const std::string& ibverbs_unviable_reason() {
  static const std::string reason = []() -> std::string {
    Config c;
    c.backends = {"ibverbs"};
    auto m = Manager::create(c);
    if (!m.ok()) return "cannot create a manager: " + m.status().to_string();
    for (const BackendInfo& info : (*m)->backends()) {
      if (info.name == "ibverbs") return info.viable ? "" : info.reason;
    }
    return "Manager::backends() does not list ibverbs";
  }();
  return reason;
}

// Tests that need ibverbs: skipped, saying why, where it is not viable.
class IbverbsOnlyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ibverbs_unviable_reason().empty()) {
      GTEST_SKIP() << "ibverbs is not viable here: " << ibverbs_unviable_reason();
    }
  }
};

class IbverbsPairTest : public ::testing::Test {
 protected:
  // Makes the managers and registers `remote_memory` with the owner.
  void set_up(LocalMemory remote_memory) {
    reader_ = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
    ASSERT_NE(reader_, nullptr);
    owner_ = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
    ASSERT_NE(owner_, nullptr);
    for (const BackendInfo& info : reader_->backends()) {
      if (info.name == "ibverbs" && !info.viable) {
        GTEST_SKIP() << "ibverbs is not viable here: " << info.reason;
      }
    }
    remote_memory_ = std::move(remote_memory);
    auto h = owner_->register_buffer(remote_memory_);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    remote_ = *h;
  }

  std::unique_ptr<Manager> reader_, owner_;
  LocalMemory remote_memory_;
  RemoteBuffer remote_;
};

}  // namespace rdmabuf::testing
