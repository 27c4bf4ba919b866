// Notices of tagged writes as the owner's side of a queue pair reads them
// (backends/ibverbs/responder.h), sent by a raw verbs peer written here: a
// notice is believed only with the key of an endpoint of the owner's, from
// the manager that endpoint talks to, naming a range of a buffer the
// owner has, with that buffer's token. Anything else is dropped and
// counted, and the pair, the owner and its other endpoints go on. A SEND
// too large for the owner's receives fails that pair alone.
//
// Needs an RDMA device (scripts/softroce-vm runs it, as the ctest test
// ibverbs_in_softroce_vm); skipped with the reason elsewhere.
#include <algorithm>
#include <array>
#include <memory>
#include <thread>

#include "backends/ibverbs/device.h"
#include "backends/ibverbs/handshake.h"
#include "backends/ibverbs/ibv_lib.h"
#include "backends/ibverbs/queue_pair.h"
#include "common/hello.h"
#include "common/socket.h"
#include "tests/helpers/backend_detail.h"
#include "tests/helpers/raw_endpoint.h"
#include "tests/helpers/raw_verbs_peer.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

using ibverbs::Device;
using ibverbs::IbvLib;
using ibverbs::QueuePair;

// A device of this host, or why there is none.
Result<std::unique_ptr<Device>> open_device() {
  RDMABUF_ASSIGN_OR_RETURN(const IbvLib* lib, IbvLib::get());
  Config defaults;
  return Device::open(*lib, defaults.ib_device, defaults.ib_gid_index);
}

// A raw peer presenting `target`'s handle, whose hello claims to be manager
// `caller`; it sends SENDs of any bytes.
std::unique_ptr<RawVerbsPeer> notice_peer(const Device& device, const Manager& owner,
                                          uint64_t caller, const RemoteBuffer& target) {
  auto peer = RawVerbsPeer::connect(device, owner, caller, ibverbs::HandleClaim::of(target));
  EXPECT_TRUE(peer.ok()) << peer.status().to_string();
  return peer.ok() ? std::move(peer).value() : nullptr;
}

ibv_wc_status send_notice(RawVerbsPeer& peer, const NoticeRecord& notice) {
  return peer.send(ibverbs::encode_notice(notice));
}

std::string ib_detail(const Manager& m, const std::string& key) {
  return backend_detail(m, "ibverbs", key);
}

// ib_detail(), once it is `want` or kTimeout has passed: its last value.
std::string eventually_detail(const Manager& m, const std::string& key, const std::string& want) {
  const auto until = Clock::now() + kTimeout;
  std::string got = ib_detail(m, key);
  while (got != want && Clock::now() < until) {
    std::this_thread::sleep_for(10ms);
    got = ib_detail(m, key);
  }
  return got;
}

class IbverbsNoticeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = open_device();
    if (!device.ok()) GTEST_SKIP() << "no RDMA device here: " << device.status().to_string();
    device_ = std::move(device).value();
    owner_ = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
    ASSERT_NE(owner_, nullptr);
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Manager> owner_;
};

TEST_F(IbverbsNoticeTest, OnlyANoticeWithTheEndpointsKeyAndTheBuffersTokenIsBelieved) {
  constexpr uint64_t kWriter = 0x5157;  // the manager id the raw peers claim
  LocalMemory memory = allocate(4096);
  auto target = owner_->register_buffer(memory);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
  // An endpoint of the owner's whose peer says it is kWriter: its hello
  // gives this side the endpoint's key.
  auto listener = owner_->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto raw_endpoint = RawEndpointPeer::start((*listener)->address(), kWriter);
  ASSERT_TRUE(raw_endpoint.has_value());
  auto endpoint = (*listener)->accept(kTimeout);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().to_string();
  ASSERT_TRUE(raw_endpoint->finish(kTimeout));

  NoticeRecord good;
  good.tag = 77;
  good.endpoint_key = raw_endpoint->peer_notice_key();
  good.buffer_id = target->id();
  good.offset = 1024;
  good.length = 2048;
  good.token = target->token();

  auto peer = notice_peer(*device_, *owner_, kWriter, *target);
  ASSERT_NE(peer, nullptr);
  auto impostor = notice_peer(*device_, *owner_, kWriter + 1, *target);
  ASSERT_NE(impostor, nullptr);

  // Each refused; the pair takes each SEND (its NIC completes them all).
  std::vector<std::pair<std::string, ibv_wc_status>> sent;
  auto altered = [&](auto change) {
    NoticeRecord n = good;
    change(n);
    return n;
  };
  sent.emplace_back("zeros", peer->send(std::array<uint8_t, ibverbs::kNoticeBytes>{}));
  const auto whole = ibverbs::encode_notice(good);
  sent.emplace_back("short", peer->send(std::span(whole).first(20)));
  sent.emplace_back("token", send_notice(*peer, altered([](NoticeRecord& n) { n.token[3] ^= 1; })));
  sent.emplace_back("range", send_notice(*peer, altered([](NoticeRecord& n) { n.offset = 3000; })));
  sent.emplace_back("empty", send_notice(*peer, altered([](NoticeRecord& n) { n.length = 0; })));
  sent.emplace_back("buffer",
                    send_notice(*peer, altered([](NoticeRecord& n) { n.buffer_id += 1000; })));
  sent.emplace_back("key",
                    send_notice(*peer, altered([](NoticeRecord& n) { n.endpoint_key ^= 4; })));
  sent.emplace_back("writer", send_notice(*impostor, good));
  for (const auto& [what, status] : sent)
    EXPECT_EQ(status, IBV_WC_SUCCESS) << what;
  EXPECT_EQ(owner_->next_notification(200ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(eventually_detail(*owner_, "notices refused", std::to_string(sent.size())),
            std::to_string(sent.size()));

  // The genuine one is believed, after all of that, on the same pair.
  ASSERT_EQ(send_notice(*peer, good), IBV_WC_SUCCESS);
  auto n = owner_->next_notification(kTimeout);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(n->tag, 77u);
  EXPECT_EQ(n->buffer_id, target->id());
  EXPECT_EQ(n->offset, 1024u);
  EXPECT_EQ(n->length, 2048u);
  EXPECT_EQ(n->peer, (*endpoint)->peer());
  EXPECT_EQ(ib_detail(*owner_, "notices taken"), "1");

  // A SEND larger than the owner's receives fails that pair (the sender's
  // completion says so); the owner lets go of its side once the reader
  // closes the connection, and another pair is believed as before.
  std::array<uint8_t, 200> large{};
  EXPECT_NE(peer->send(large), IBV_WC_SUCCESS);
  peer.reset();
  EXPECT_EQ(eventually_detail(*owner_, "owner-side queue pairs", "1"), "1")
      << "the impostor's alone";
  auto again = notice_peer(*device_, *owner_, kWriter, *target);
  ASSERT_NE(again, nullptr);
  good.tag = 78;
  ASSERT_EQ(send_notice(*again, good), IBV_WC_SUCCESS);
  n = owner_->next_notification(kTimeout);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(n->tag, 78u);

  // Once the endpoint is closed, its key names nothing.
  (*endpoint)->close();
  good.tag = 79;
  ASSERT_EQ(send_notice(*again, good), IBV_WC_SUCCESS);
  EXPECT_EQ(owner_->next_notification(200ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(eventually_detail(*owner_, "notices refused", std::to_string(sent.size() + 1)),
            std::to_string(sent.size() + 1));
}

}  // namespace
}  // namespace rdmabuf::testing
