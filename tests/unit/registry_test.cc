// Registry: pins, tokens and release (core/registry.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "core/registry.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;

Token token_of(uint8_t seed) {
  Token t{};
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<uint8_t>(seed + i);
  return t;
}

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    memory_.resize(4096);
    registry_.add(7, token_of(1), LocalMemory::from_span(memory_));
  }
  std::vector<std::byte> memory_;
  Registry registry_;
};

class FlagAbort final : public PinAbort {
 public:
  void abort_pinned_io() override {
    calls.fetch_add(1);
    aborted.store(true);
  }
  std::atomic<int> calls{0};
  std::atomic<bool> aborted{false};
};

TEST_F(RegistryTest, PinGivesTheMemory) {
  auto pin = registry_.pin(7, token_of(1), nullptr);
  ASSERT_TRUE(pin.ok()) << pin.status().to_string();
  EXPECT_TRUE(pin->held());
  EXPECT_EQ(pin->data(), memory_.data());
  EXPECT_EQ(pin->size(), memory_.size());
  pin->reset();
  EXPECT_FALSE(pin->held());
  EXPECT_EQ(pin->data(), nullptr);
  EXPECT_EQ(registry_.size(), 1u);
  EXPECT_EQ(registry_.ids(), std::vector<uint64_t>{7});
}

TEST_F(RegistryTest, WrongTokenIsPermissionDenied) {
  for (size_t byte = 0; byte < 16; ++byte) {
    Token t = token_of(1);
    t[byte] ^= 0x80;
    auto pin = registry_.pin(7, t, nullptr);
    EXPECT_EQ(pin.status().code(), StatusCode::kPermissionDenied) << byte;
  }
  EXPECT_EQ(registry_.pin(7, Token{}, nullptr).status().code(), StatusCode::kPermissionDenied);
  // A refused pin holds nothing: release does not wait.
  auto took = std::chrono::steady_clock::now();
  EXPECT_TRUE(registry_.release(7).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - took, 500ms);
}

TEST_F(RegistryTest, UnknownIdIsNotFound) {
  EXPECT_EQ(registry_.pin(8, token_of(1), nullptr).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(registry_.release(8).status().code(), StatusCode::kNotFound);
}

TEST_F(RegistryTest, ReleasedIdIsNotFound) {
  ASSERT_TRUE(registry_.release(7).ok());
  EXPECT_EQ(registry_.size(), 0u);
  EXPECT_TRUE(registry_.ids().empty());
  EXPECT_EQ(registry_.pin(7, token_of(1), nullptr).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(registry_.release(7).status().code(), StatusCode::kNotFound) << "release twice";
}

// The registry lets go of the memory's keepalive only through what release
// returns: the manager drops it once every backend has stopped serving the
// buffer, never before.
TEST_F(RegistryTest, ReleaseHandsTheKeepaliveToTheCaller) {
  auto freed = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<const void> keepalive(new int(0), [freed](const int* p) {
    freed->store(true);
    delete p;
  });
  std::vector<std::byte> bytes(64);
  registry_.add(9, token_of(2), LocalMemory(bytes.data(), bytes.size(), std::move(keepalive)));
  Result<LocalMemory> released = registry_.release(9);
  ASSERT_TRUE(released.ok()) << released.status().to_string();
  EXPECT_FALSE(freed->load()) << "the registry dropped the keepalive itself";
  EXPECT_EQ(released->data(), bytes.data());
  EXPECT_EQ(released->size(), bytes.size());
  released = NotFound("dropped");
  EXPECT_TRUE(freed->load());
}

TEST_F(RegistryTest, PinsMove) {
  auto pin = registry_.pin(7, token_of(1), nullptr);
  ASSERT_TRUE(pin.ok());
  PinnedRegion a = std::move(pin).value();
  PinnedRegion b;
  b = std::move(a);
  EXPECT_FALSE(a.held());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_TRUE(b.held());
  b = PinnedRegion();  // unpins
  auto took = std::chrono::steady_clock::now();
  EXPECT_TRUE(registry_.release(7).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - took, 500ms) << "the moved pin was not released";
}

TEST_F(RegistryTest, ReleaseWaitsForPins) {
  auto pin1 = registry_.pin(7, token_of(1), nullptr);
  auto pin2 = registry_.pin(7, token_of(1), nullptr);
  ASSERT_TRUE(pin1.ok() && pin2.ok());
  auto release = std::async(std::launch::async, [&] { return registry_.release(7); });
  EXPECT_EQ(release.wait_for(150ms), std::future_status::timeout)
      << "release returned while the buffer was pinned";
  // New pins fail at once while the release waits.
  EXPECT_EQ(registry_.pin(7, token_of(1), nullptr).status().code(), StatusCode::kNotFound);
  pin1->reset();
  EXPECT_EQ(release.wait_for(150ms), std::future_status::timeout) << "one pin is left";
  pin2->reset();
  ASSERT_EQ(release.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(release.get().ok());
}

TEST_F(RegistryTest, ReleaseWaitsForPinsWithoutAbortBeyondTheGrace) {
  // A holder that gave no PinAbort cannot be interrupted: release keeps
  // waiting (it must never free memory under an access).
  auto pin = registry_.pin(7, token_of(1), nullptr);
  ASSERT_TRUE(pin.ok());
  auto release = std::async(std::launch::async, [&] { return registry_.release(7); });
  EXPECT_EQ(release.wait_for(Registry::kReleaseGrace + 300ms), std::future_status::timeout);
  pin->reset();
  ASSERT_EQ(release.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(release.get().ok());
}

TEST_F(RegistryTest, ReleaseAbortsAStalledHolderAfterTheGrace) {
  FlagAbort abort;
  auto pinned = registry_.pin(7, token_of(1), &abort);
  ASSERT_TRUE(pinned.ok());
  // The holder: blocked "in I/O" until aborted, then it lets go.
  std::thread holder([&, pin = std::move(pinned).value()]() mutable {
    while (!abort.aborted.load())
      std::this_thread::sleep_for(1ms);
    pin.reset();
  });
  auto start = std::chrono::steady_clock::now();
  Status s = registry_.release(7).status();
  auto took = std::chrono::steady_clock::now() - start;
  holder.join();
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_GE(abort.calls.load(), 1);
  EXPECT_GE(took, Registry::kReleaseGrace - 50ms) << "aborted before the grace period";
  EXPECT_LT(took, Registry::kReleaseGrace + 2s);
}

TEST_F(RegistryTest, AbortIsNotCalledForAFinishedHolder) {
  FlagAbort abort;
  {
    auto pinned = registry_.pin(7, token_of(1), &abort);
    ASSERT_TRUE(pinned.ok());
  }  // unpinned: the abort is deregistered
  EXPECT_TRUE(registry_.release(7).ok());
  EXPECT_EQ(abort.calls.load(), 0);
}

TEST_F(RegistryTest, AbortOnlyTheHoldersStillPinned) {
  FlagAbort finished, stalled;
  auto done_pin = registry_.pin(7, token_of(1), &finished);
  auto stalled_pin = registry_.pin(7, token_of(1), &stalled);
  ASSERT_TRUE(done_pin.ok() && stalled_pin.ok());
  done_pin->reset();
  std::thread holder([&, pin = std::move(stalled_pin).value()]() mutable {
    while (!stalled.aborted.load())
      std::this_thread::sleep_for(1ms);
    pin.reset();
  });
  EXPECT_TRUE(registry_.release(7).ok());
  holder.join();
  EXPECT_EQ(finished.calls.load(), 0);
  EXPECT_GE(stalled.calls.load(), 1);
}

TEST_F(RegistryTest, ManyBuffersAreIndependent) {
  std::vector<std::vector<std::byte>> mems(20, std::vector<std::byte>(64));
  for (uint64_t id = 100; id < 120; ++id)
    registry_.add(id, token_of(static_cast<uint8_t>(id)), LocalMemory::from_span(mems[id - 100]));
  EXPECT_EQ(registry_.size(), 21u);
  auto pin = registry_.pin(105, token_of(105), nullptr);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(pin->data(), mems[5].data());
  EXPECT_EQ(registry_.pin(105, token_of(106), nullptr).status().code(),
            StatusCode::kPermissionDenied)
      << "another buffer's token";
  // Releasing other buffers does not wait for this pin.
  for (uint64_t id = 110; id < 120; ++id)
    EXPECT_TRUE(registry_.release(id).ok());
  EXPECT_EQ(registry_.size(), 11u);
}

TEST_F(RegistryTest, PinAndReleaseRace) {
  // Pins and unpins from several threads while the buffer is released: every
  // pin either fails with NotFound or is held until its holder lets go, and
  // release returns only when none is held.
  for (int round = 0; round < 30; ++round) {
    std::vector<std::byte> mem(64);
    const uint64_t id = 1000 + static_cast<uint64_t>(round);
    registry_.add(id, token_of(9), LocalMemory::from_span(mem));
    std::atomic<int> held{0};
    std::atomic<bool> released{false}, violation{false}, stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        while (!stop.load()) {
          auto pin = registry_.pin(id, token_of(9), nullptr);
          if (!pin.ok()) {
            if (pin.status().code() != StatusCode::kNotFound) violation = true;
            continue;
          }
          held.fetch_add(1);
          if (released.load()) violation = true;
          held.fetch_sub(1);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    EXPECT_TRUE(registry_.release(id).ok());
    released = true;
    EXPECT_EQ(held.load(), 0);
    stop = true;
    for (auto& th : threads)
      th.join();
    EXPECT_FALSE(violation.load()) << "a pin was held after release returned";
  }
}

}  // namespace
}  // namespace rdmabuf
