// A fixture for tests of one reader and one owner over ibverbs alone: both
// managers, and one buffer of the owner's. Skips, saying why, where
// ibverbs is not viable (scripts/softroce-vm runs these tests).
#pragma once

#include <memory>
#include <utility>

#include "tests/integration/integration.h"

namespace rdmabuf::testing {

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
