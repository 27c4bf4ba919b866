// What a peer that reaches the owner's listener and NIC can do over ibverbs
// (backends/ibverbs/remote_access.h), tried with raw verbs
// (tests/helpers/raw_verbs_peer.h): it gets a queue pair only by presenting
// a genuine handle; it reaches only the buffers whose handles it presented
// on that pair, whatever keys it guesses or borrows from other pairs; and a
// release revokes its key at once.
//
// Needs an RDMA device whose windows bind to a queue pair (scripts/
// softroce-vm runs it, as the ctest test ibverbs_in_softroce_vm); skipped
// with the reason elsewhere.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/ibv_lib.h"
#include "tests/helpers/backend_detail.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/raw_verbs_peer.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

using ibverbs::HandleClaim;

constexpr uint64_t kSize = 4096;
constexpr uint64_t kCaller = 0xacce55;

class IbverbsAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto lib = ibverbs::IbvLib::get();
    if (!lib.ok()) GTEST_SKIP() << "no RDMA device here: " << lib.status().to_string();
    Config defaults;
    auto device = ibverbs::Device::open(**lib, defaults.ib_device, defaults.ib_gid_index);
    if (!device.ok()) GTEST_SKIP() << "no RDMA device here: " << device.status().to_string();
    device_ = std::move(device).value();
    if (!device_->has_windows()) {
      GTEST_SKIP() << device_->name() << " has no type-2 memory windows: keys are not bound "
                   << "to queue pairs there (docs/security.md)";
    }
    owner_ = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
    ASSERT_NE(owner_, nullptr);
    EXPECT_EQ(backend_detail(*owner_, "ibverbs", "access control"),
              "memory windows, each bound to one reader's queue pair");
  }

  struct Owned {
    LocalMemory memory;
    RemoteBuffer handle;
    uint64_t addr = 0;  // at the owner, from the handle
  };
  Owned own(uint64_t seed) {
    Owned o{with_pattern(kSize, seed), {}, 0};
    auto h = owner_->register_buffer(o.memory);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return o;
    o.handle = *h;
    auto ctx = ibverbs_context(o.handle);
    EXPECT_TRUE(ctx.has_value());
    if (ctx) o.addr = ctx->addr;
    return o;
  }

  Result<std::unique_ptr<RawVerbsPeer>> peer_presenting(const HandleClaim& claim) {
    return RawVerbsPeer::connect(*device_, *owner_, kCaller, claim);
  }

  // A pair presenting `o`, and the key the owner granted it for `o`.
  std::unique_ptr<RawVerbsPeer> granted(const Owned& o, uint32_t* key) {
    auto peer = peer_presenting(HandleClaim::of(o.handle));
    EXPECT_TRUE(peer.ok()) << peer.status().to_string();
    if (!peer.ok()) return nullptr;
    auto answer = (*peer)->ask(HandleClaim::of(o.handle));
    EXPECT_TRUE(answer.ok()) << answer.status().to_string();
    if (!answer.ok()) return nullptr;
    EXPECT_EQ(answer->code, StatusCode::kOk);
    *key = answer->rkey;
    return std::move(peer).value();
  }

  std::unique_ptr<ibverbs::Device> device_;
  std::unique_ptr<Manager> owner_;
};

TEST_F(IbverbsAccessTest, AQueuePairIsSetUpOnlyForAPeerThatPresentsAHandle) {
  Owned a = own(11);
  HandleClaim genuine = HandleClaim::of(a.handle);
  HandleClaim token = genuine;
  token.token[5] ^= 0x20;
  HandleClaim size = genuine;
  size.region_size *= 2;
  HandleClaim unknown = genuine;
  unknown.id += 1000;
  struct Case {
    const char* what;
    HandleClaim claim;
    StatusCode code;
  };
  for (const Case& c : {Case{"an altered token", token, StatusCode::kPermissionDenied},
                        Case{"an altered size", size, StatusCode::kInvalidArgument},
                        Case{"an unknown buffer", unknown, StatusCode::kNotFound}}) {
    SCOPED_TRACE(c.what);
    auto peer = peer_presenting(c.claim);
    EXPECT_EQ(peer.status().code(), c.code) << peer.status().to_string();
  }
  EXPECT_EQ(backend_detail(*owner_, "ibverbs", "owner-side queue pairs"), "0")
      << "a queue pair was set up for a peer without a handle";
  uint32_t key = 0;
  auto peer = granted(a, &key);
  ASSERT_NE(peer, nullptr);
  ASSERT_EQ(peer->read(a.addr, key, kSize), IBV_WC_SUCCESS);
  EXPECT_EQ(find_mismatch(std::as_bytes(peer->bytes()), 11), std::nullopt);
}

// A peer that presented buffer A's handle, and so holds a pair and A's key,
// tries buffer B's memory with every key it can get or guess: B's key as
// granted to another pair, A's own key, and keys of the windows beside A's.
// Each READ and WRITE fails at the owner's NIC (which fails the pair, so
// each try gets a fresh one); not a byte of B moves either way.
TEST_F(IbverbsAccessTest, APeerReachesOnlyTheBuffersWhoseHandlesItPresented) {
  Owned a = own(21);
  Owned b = own(22);
  uint32_t key_a = 0, key_b = 0;
  auto holder_of_b = granted(b, &key_b);  // another pair, rightly granted B
  ASSERT_NE(holder_of_b, nullptr);
  ASSERT_EQ(holder_of_b->read(b.addr, key_b, kSize), IBV_WC_SUCCESS);
  {
    auto probe = granted(a, &key_a);
    ASSERT_NE(probe, nullptr);
  }
  std::vector<uint32_t> guesses = {key_b, key_a, 0};
  for (int index = -2; index <= 2; ++index) {
    for (uint32_t byte : {0x00u, 0xffu, key_a & 0xffu, key_b & 0xffu}) {
      guesses.push_back(((key_a >> 8) + static_cast<uint32_t>(index)) << 8 | byte);
    }
  }
  std::sort(guesses.begin(), guesses.end());
  guesses.erase(std::unique(guesses.begin(), guesses.end()), guesses.end());
  for (uint32_t guess : guesses) {
    for (bool write : {false, true}) {
      SCOPED_TRACE((write ? "WRITE with key " : "READ with key ") + std::to_string(guess));
      uint32_t own_key = 0;
      auto thief = granted(a, &own_key);
      ASSERT_NE(thief, nullptr);
      std::fill(thief->bytes().begin(), thief->bytes().end(), uint8_t{0xCD});
      const ibv_wc_status status =
          write ? thief->write(b.addr, guess, kSize) : thief->read(b.addr, guess, kSize);
      EXPECT_NE(status, IBV_WC_SUCCESS) << "buffer B was reached without its handle";
      EXPECT_EQ(count_pattern_words(std::as_bytes(thief->bytes()), 22), 0u)
          << "bytes of B came back";
    }
  }
  EXPECT_EQ(find_mismatch(a.memory.span(), 21), std::nullopt);
  EXPECT_EQ(find_mismatch(b.memory.span(), 22), std::nullopt) << "a write reached buffer B";
  // The rightful holder still reads B.
  ASSERT_EQ(holder_of_b->read(b.addr, key_b, kSize), IBV_WC_SUCCESS);
  EXPECT_EQ(find_mismatch(std::as_bytes(holder_of_b->bytes()), 22), std::nullopt);
}

TEST_F(IbverbsAccessTest, ReleaseRevokesAGrantedKeyAtOnce) {
  Owned a = own(31);
  uint32_t key = 0;
  auto peer = granted(a, &key);
  ASSERT_NE(peer, nullptr);
  ASSERT_EQ(peer->read(a.addr, key, kSize), IBV_WC_SUCCESS);
  ASSERT_TRUE(owner_->release(a.handle).ok());
  std::fill(peer->bytes().begin(), peer->bytes().end(), uint8_t{0xCD});
  EXPECT_NE(peer->read(a.addr, key, kSize), IBV_WC_SUCCESS) << "a released buffer was read";
  EXPECT_EQ(count_pattern_words(std::as_bytes(peer->bytes()), 31), 0u);
  // Asked again, the owner has nothing to grant.
  auto again = peer_presenting(HandleClaim::of(a.handle));
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound) << again.status().to_string();
}

}  // namespace
}  // namespace rdmabuf::testing
