// Faults on an endpoint's control connection: a peer that completes the
// handshake and then sends malformed or lying frames (tests/helpers/
// raw_endpoint.h speaks the wire format by hand). The real endpoint must
// close with kProtocolError and a message that names the fault, fail the
// call that waits, write nothing into the waiting receive's memory that the
// peer did not legitimately send, and leave its manager serving: a fresh
// endpoint works afterwards, and no registration is left behind (a large
// receive registered when posted is released; so is memory lent). A request
// the real side can refuse (an absurd loan) is refused, and the endpoint
// goes on.
#include <future>
#include <memory>
#include <thread>

#include "common/host.h"
#include "tests/helpers/process.h"
#include "tests/helpers/raw_endpoint.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

constexpr size_t kReceiveBytes = 64;              // only inline messages fit: never registered
constexpr size_t kRegisteredReceiveBytes = 8192;  // registered when posted on a fresh endpoint
constexpr auto kFrameWait = std::chrono::seconds(10);

class HostileEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manager_ = make_manager();
    ASSERT_TRUE(manager_);
    auto listener = manager_->listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status().to_string();
    listener_ = std::move(listener).value();
    baseline_registered_ = manager_->registered_count();
  }

  // A raw peer and the real endpoint it connected to. Null endpoint after
  // a test failure.
  std::unique_ptr<Endpoint> connect(std::optional<RawEndpointPeer>& raw) {
    raw = RawEndpointPeer::start(listener_->address(), /*manager_id=*/0x5eed);
    EXPECT_TRUE(raw.has_value()) << "cannot connect to " << listener_->address();
    if (!raw) return nullptr;
    auto accepted = listener_->accept(kTimeout);
    EXPECT_TRUE(accepted.ok()) << accepted.status().to_string();
    EXPECT_TRUE(raw->finish(kFrameWait)) << "the real side's hello or channel answer was wrong";
    if (!accepted.ok()) return nullptr;
    EXPECT_EQ((*accepted)->channel(),
              "tcp (shared memory: the peer: a raw test peer; RDMA: the peer: a raw test peer)")
        << (*accepted)->channel();
    return std::move(accepted).value();
  }

  // Posts a receive on `endpoint` and reads its credit at the raw peer:
  // the receive's seq.
  std::optional<uint64_t> post(Endpoint& endpoint, RawEndpointPeer& raw, const LocalMemory& into,
                               std::optional<PendingReceive>& pending) {
    auto posted = endpoint.post_receive(into);
    EXPECT_TRUE(posted.ok()) << posted.status().to_string();
    if (!posted.ok()) return std::nullopt;
    pending = std::move(posted).value();
    RawFrame type{};
    std::vector<uint8_t> payload;
    // The credit goes out within about a millisecond (the endpoint's server
    // flushes what was held back).
    EXPECT_TRUE(raw.read_frame(type, payload, kFrameWait)) << "no credit came";
    EXPECT_EQ(type, RawFrame::kPosted);
    if (type != RawFrame::kPosted || payload.size() < 18) return std::nullopt;
    EXPECT_EQ(read_u64_le(payload, 8), into.size()) << "the credit's capacity";
    return read_u64_le(payload, 0);
  }

  // Sends what `hostile(seq)` makes while a receive waits, and checks that
  // the endpoint closes with kProtocolError naming `fault`, the receive's
  // memory untouched, the manager still serving.
  void expect_cut_off(const std::function<std::vector<uint8_t>(uint64_t seq)>& hostile,
                      const std::string& fault) {
    SCOPED_TRACE("fault: " + fault);
    std::optional<RawEndpointPeer> raw;
    auto endpoint = connect(raw);
    ASSERT_TRUE(endpoint);
    // A receive too large for an inline message, posted first: its memory
    // is registered when posted, and must be released when the endpoint
    // is cut off.
    std::optional<PendingReceive> large_pending;
    ASSERT_TRUE(post(*endpoint, *raw, allocate(kRegisteredReceiveBytes), large_pending));
    ASSERT_GT(manager_->registered_count(), baseline_registered_)
        << "the large receive was not registered when posted";
    LocalMemory into = allocate(kReceiveBytes);
    std::memset(into.data(), 0xCD, into.size());
    std::optional<PendingReceive> pending;
    auto seq = post(*endpoint, *raw, into, pending);
    ASSERT_TRUE(seq.has_value());
    ASSERT_TRUE(raw->send(hostile(*seq)));

    auto got = pending->wait(kTimeout);
    ASSERT_FALSE(got.ok()) << "the receive took " << *got << " bytes from a hostile frame";
    EXPECT_EQ(got.status().code(), StatusCode::kProtocolError) << got.status().to_string();
    EXPECT_NE(got.status().message().find(fault), std::string::npos) << got.status().to_string();
    for (size_t i = 0; i < into.size(); ++i) {
      ASSERT_EQ(into.data()[i], std::byte{0xCD}) << "byte " << i << " of the receive changed";
    }
    EXPECT_EQ(large_pending->wait(kTimeout).status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(raw->closed_by_peer(kFrameWait)) << "the real side kept the connection";
    // Every later call says why the endpoint ended.
    EXPECT_EQ(endpoint->send(into, 1s).code(), StatusCode::kProtocolError);
    endpoint.reset();
    EXPECT_EQ(manager_->registered_count(), baseline_registered_)
        << "the cut-off endpoint left a registration behind";
    expect_manager_still_serves();
  }

  // A message the raw peer sends, well-formed, into a fresh receive
  // arrives whole.
  void expect_message_arrives(Endpoint& endpoint, RawEndpointPeer& raw, const std::string& text) {
    LocalMemory into = allocate(kReceiveBytes);
    std::optional<PendingReceive> pending;
    auto seq = post(endpoint, raw, into, pending);
    ASSERT_TRUE(seq.has_value());
    const std::span<const uint8_t> message(reinterpret_cast<const uint8_t*>(text.data()),
                                           text.size());
    ASSERT_TRUE(raw.send(raw_frame(RawFrame::kSentInline, RawPayload().u64(*seq).bytes(message))));
    auto got = pending->wait(kTimeout);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, text.size());
    EXPECT_EQ(std::memcmp(into.data(), text.data(), text.size()), 0);
  }

  // A fresh endpoint (the raw peer, well-behaved this time) delivers a
  // message, and no registration is left from the hostile one.
  void expect_manager_still_serves() {
    std::optional<RawEndpointPeer> raw;
    auto endpoint = connect(raw);
    ASSERT_TRUE(endpoint);
    expect_message_arrives(*endpoint, *raw, "fine");
    endpoint.reset();
    EXPECT_EQ(manager_->registered_count(), baseline_registered_);
  }

  std::unique_ptr<Manager> manager_;
  std::unique_ptr<EndpointListener> listener_;
  size_t baseline_registered_ = 0;
};

TEST_F(HostileEndpointTest, AFrameLongerThanTheLimitClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t) {
        RawPayload header;
        header.u32(1u << 20).u8(static_cast<uint8_t>(RawFrame::kSentInline));
        return header.get();
      },
      "endpoint frame of 1048576 bytes");
}

TEST_F(HostileEndpointTest, AnUnknownFrameTypeClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t) {
        RawPayload frame;
        frame.u32(0).u8(99);
        return frame.get();
      },
      "unknown endpoint frame type 99");
}

TEST_F(HostileEndpointTest, AnAnswerForAReceiveNobodyPostedClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        return raw_frame(RawFrame::kSentInline, RawPayload().u64(seq + 1000).u8('x'));
      },
      "which is not waiting");
}

// A receive only inline messages fit is never registered, whatever the
// peer asks.
TEST_F(HostileEndpointTest, AskingForTheHandleOfASmallReceiveClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        return raw_frame(RawFrame::kHandleWanted, RawPayload().u64(/*request id=*/1).u64(seq));
      },
      "which only an inline message fits");
}

TEST_F(HostileEndpointTest, AnInlineMessageLargerThanTheReceiveClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        const std::vector<uint8_t> too_much(kReceiveBytes + 1, 'x');
        return raw_frame(RawFrame::kSentInline, RawPayload().u64(seq).bytes(too_much));
      },
      "sent more than the receive holds");
}

TEST_F(HostileEndpointTest, ASentThatClaimsMoreThanTheReceiveClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        return raw_frame(RawFrame::kSent, RawPayload().u64(seq).u64(uint64_t{1} << 40));
      },
      "sent more than the receive holds");
}

TEST_F(HostileEndpointTest, AnAnswerCutShortClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) { return raw_frame(RawFrame::kSent, RawPayload().u64(seq).u16(7)); },
      "malformed endpoint answer");
}

TEST_F(HostileEndpointTest, ACreditWithAHandleThatDoesNotDecodeClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t) {
        const std::vector<uint8_t> garbage(40, 0xAB);
        return raw_frame(RawFrame::kPosted, RawPayload().u64(0).u64(1 << 20).blob(garbage));
      },
      "endpoint credit with a bad handle");
}

TEST_F(HostileEndpointTest, AReplyWithAnUnknownStatusCodeClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t) {
        return raw_frame(RawFrame::kLent, RawPayload().u64(0).u8(200).u64(0).blob(""));
      },
      "malformed endpoint reply");
}

TEST_F(HostileEndpointTest, ANotificationCutShortClosesTheEndpoint) {
  expect_cut_off([](uint64_t) { return raw_frame(RawFrame::kNotify, RawPayload().u32(7).u64(1)); },
                 "malformed endpoint notification");
}

TEST_F(HostileEndpointTest, AWithdrawalWithTrailingBytesClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        return raw_frame(RawFrame::kWithdrawn, RawPayload().u64(seq).u64(0).u8(1));
      },
      "malformed endpoint withdrawal");
}

TEST_F(HostileEndpointTest, APassedHandleThatDoesNotDecodeClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t) {
        const std::vector<uint8_t> garbage(12, 0x01);
        return raw_frame(RawFrame::kBuffer, RawPayload().blob(garbage));
      },
      "the peer passed a bad handle");
}

TEST_F(HostileEndpointTest, AMessagePartLargerThanTheReceiveClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        const std::vector<uint8_t> some(16, 'x');
        return raw_frame(RawFrame::kSentPart,
                         RawPayload().u64(seq).u64(kReceiveBytes + 1).bytes(some));
      },
      "sent more than the receive holds");
}

TEST_F(HostileEndpointTest, AMessagePartBeyondItsMessagesEndClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) {
        const std::vector<uint8_t> five(5, 'x');
        return raw_frame(RawFrame::kSentPart, RawPayload().u64(seq).u64(3).bytes(five));
      },
      "beyond the message's end");
}

TEST_F(HostileEndpointTest, AnEmptyMessagePartClosesTheEndpoint) {
  expect_cut_off(
      [](uint64_t seq) { return raw_frame(RawFrame::kSentPart, RawPayload().u64(seq).u64(8)); },
      "malformed endpoint message part");
}

// A first part that is fine, then one that lies: the endpoint closes, and
// the receive fails (its memory holds the first part: the peer sent that).
TEST_F(HostileEndpointTest, MessagePartsThatContradictThemselvesCloseTheEndpoint) {
  const std::vector<uint8_t> ten(10, 'p');
  const std::vector<std::pair<std::vector<uint8_t>, std::string>> lies = {
      {raw_frame(RawFrame::kSentPart, RawPayload().u64(0).u64(40).bytes(ten)), "disagree"},
      {raw_frame(RawFrame::kSentInline, RawPayload().u64(0).bytes(ten)), "amid"},
      {raw_frame(RawFrame::kSent, RawPayload().u64(0).u64(20)), "amid"},
  };
  for (const auto& [lie, fault] : lies) {
    SCOPED_TRACE("fault: " + fault);
    std::optional<RawEndpointPeer> raw;
    auto endpoint = connect(raw);
    ASSERT_TRUE(endpoint);
    LocalMemory into = allocate(kReceiveBytes);
    std::optional<PendingReceive> pending;
    auto seq = post(*endpoint, *raw, into, pending);
    ASSERT_EQ(seq, 0u);
    ASSERT_TRUE(raw->send(raw_frame(RawFrame::kSentPart, RawPayload().u64(0).u64(20).bytes(ten))));
    ASSERT_TRUE(raw->send(lie));
    auto got = pending->wait(kTimeout);
    ASSERT_FALSE(got.ok()) << "the receive took " << *got << " bytes from lying parts";
    EXPECT_EQ(got.status().code(), StatusCode::kProtocolError) << got.status().to_string();
    EXPECT_NE(got.status().message().find(fault), std::string::npos) << got.status().to_string();
    EXPECT_TRUE(raw->closed_by_peer(kFrameWait)) << "the real side kept the connection";
  }
  expect_manager_still_serves();
}

TEST_F(HostileEndpointTest, AMessageInPartsArrivesWhole) {
  std::optional<RawEndpointPeer> raw;
  auto endpoint = connect(raw);
  ASSERT_TRUE(endpoint);
  LocalMemory into = allocate(kReceiveBytes);
  std::memset(into.data(), 0xCD, into.size());
  std::optional<PendingReceive> pending;
  auto seq = post(*endpoint, *raw, into, pending);
  ASSERT_TRUE(seq.has_value());
  std::vector<uint8_t> message(50);
  for (size_t i = 0; i < message.size(); ++i)
    message[i] = static_cast<uint8_t>(i * 7 + 1);
  const std::span<const uint8_t> all(message);
  for (auto [at, n] : {std::pair<size_t, size_t>{0, 1}, {1, 30}, {31, 19}}) {
    ASSERT_TRUE(
        raw->send(raw_frame(RawFrame::kSentPart,
                            RawPayload().u64(*seq).u64(message.size()).bytes(all.subspan(at, n)))));
  }
  auto got = pending->wait(kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, message.size());
  EXPECT_EQ(std::memcmp(into.data(), message.data(), message.size()), 0);
  EXPECT_EQ(into.data()[message.size()], std::byte{0xCD}) << "the parts wrote past the message";
  expect_message_arrives(*endpoint, *raw, "and the next one too");
}

TEST_F(HostileEndpointTest, ASecondAnswerForOneReceiveClosesTheEndpoint) {
  std::optional<RawEndpointPeer> raw;
  auto endpoint = connect(raw);
  ASSERT_TRUE(endpoint);
  LocalMemory first = allocate(kReceiveBytes);
  LocalMemory second = allocate(kReceiveBytes);
  std::memset(second.data(), 0xCD, second.size());
  std::optional<PendingReceive> pending_first, pending_second;
  auto seq = post(*endpoint, *raw, first, pending_first);
  ASSERT_TRUE(seq.has_value());
  ASSERT_TRUE(post(*endpoint, *raw, second, pending_second).has_value());
  const uint8_t once[] = {'o', 'n', 'c', 'e'};
  auto answer = raw_frame(RawFrame::kSentInline, RawPayload().u64(*seq).bytes(once));
  ASSERT_TRUE(raw->send(answer));
  auto got = pending_first->wait(kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, sizeof once);
  ASSERT_TRUE(raw->send(answer));  // again: receive `seq` is not waiting any more
  auto late = pending_second->wait(kTimeout);
  EXPECT_EQ(late.status().code(), StatusCode::kProtocolError) << late.status().to_string();
  EXPECT_EQ(second.data()[0], std::byte{0xCD}) << "the repeated answer landed in the next receive";
  endpoint.reset();
  expect_manager_still_serves();
}

TEST_F(HostileEndpointTest, AnOfferThatGivesNoReasonsIsSaidSo) {
  auto raw = RawEndpointPeer::connect(listener_->address());
  ASSERT_TRUE(raw.has_value());
  ASSERT_TRUE(raw->send_hello(0x5eed));
  ASSERT_TRUE(
      raw->send(raw_frame(RawFrame::kChannelOffer, RawPayload().u8(0).blob("").u8(0).blob(""))));
  auto accepted = listener_->accept(kTimeout);
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  EXPECT_EQ((*accepted)->channel(),
            "tcp (shared memory: the peer: it gave no reason; RDMA: the peer: it gave no reason)");
}

// A shared-memory offer names the process whose file the accepting side is
// to open. Naming another process (here a child of the test, whose stdin
// is a pipe the accepting side could open) or a descriptor of the peer's
// own that is not this connection is refused before anything is opened:
// the endpoint goes over TCP and says why. (The offered file is fd 0 of the
// process named.)
TEST_F(HostileEndpointTest, AnOfferNamingAProcessThatIsNotThePeerIsRefusedUnopened) {
  auto manager = make_manager([](Config& c) { c.backends = {"memory", "tcp"}; });
  ASSERT_TRUE(manager);
  auto listener = manager->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  std::string error;
  auto bystander = Subprocess::spawn(RDMABUF_TEST_READER, {"--wait", "x", "1"}, {}, &error);
  ASSERT_NE(bystander, nullptr) << error;
  struct Lie {
    const char* what;
    uint32_t pid;
    int socket;  // -1: the raw peer's own descriptor of the connection
    const char* why;
  };
  const Lie lies[] = {
      {"another process", static_cast<uint32_t>(bystander->pid()), 0,
       "does not hold the other end of this connection"},
      {"the peer, with another descriptor", static_cast<uint32_t>(getpid()), 0,
       "does not hold the other end of this connection"},
      {"the peer, with no such descriptor", static_cast<uint32_t>(getpid()), 999999,
       "has no descriptor 999999"},
      // The truth about the process, and a file that is not rings: the
      // check passes, and the file is refused for what it is.
      {"the peer, truthfully", static_cast<uint32_t>(getpid()), -1,
       "is not an endpoint's shared rings"},
  };
  for (const Lie& lie : lies) {
    SCOPED_TRACE(lie.what);
    auto raw = RawEndpointPeer::connect((*listener)->address());
    ASSERT_TRUE(raw.has_value());
    ASSERT_TRUE(raw->send_hello(0x5eed));
    const auto socket = static_cast<uint32_t>(lie.socket < 0 ? raw->fd() : lie.socket);
    ASSERT_TRUE(raw->send(raw_frame(RawFrame::kChannelOffer, RawPayload()
                                                                 .u8(1)
                                                                 .u32(lie.pid)
                                                                 .u32(0)
                                                                 .u32(socket)
                                                                 .u64(pid_namespace_id())
                                                                 .u64(42)
                                                                 .blob(this_host_id())
                                                                 .u8(0)
                                                                 .blob("none"))));
    auto accepted = (*listener)->accept(kTimeout);
    ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
    EXPECT_EQ((*accepted)->channel().rfind("tcp (shared memory: this side: ", 0), 0u)
        << (*accepted)->channel();
    EXPECT_NE((*accepted)->channel().find(lie.why), std::string::npos) << (*accepted)->channel();
  }
}

TEST_F(HostileEndpointTest, AnAbsurdLoanIsRefusedAndTheEndpointGoesOn) {
  std::optional<RawEndpointPeer> raw;
  auto endpoint = connect(raw);
  ASSERT_TRUE(endpoint);
  for (uint64_t size : {uint64_t{1} << 62, ~uint64_t{0}}) {
    ASSERT_TRUE(
        raw->send(raw_frame(RawFrame::kLendRequest, RawPayload().u64(7).u64(size).u64(1000))));
    RawFrame type{};
    std::vector<uint8_t> reply;
    ASSERT_TRUE(raw->read_frame(type, reply, kFrameWait)) << "no answer to the loan";
    ASSERT_EQ(type, RawFrame::kLent);
    ASSERT_GE(reply.size(), 19u);
    EXPECT_EQ(read_u64_le(reply, 0), 7u) << "the answer's request id";
    EXPECT_EQ(reply[8], static_cast<uint8_t>(StatusCode::kResourceExhausted));
  }
  // A lease of 0 ms and a loan of 0 bytes are refused the same way.
  ASSERT_TRUE(raw->send(raw_frame(RawFrame::kLendRequest, RawPayload().u64(8).u64(0).u64(1000))));
  RawFrame type{};
  std::vector<uint8_t> reply;
  ASSERT_TRUE(raw->read_frame(type, reply, kFrameWait));
  ASSERT_EQ(type, RawFrame::kLent);
  EXPECT_EQ(reply[8], static_cast<uint8_t>(StatusCode::kInvalidArgument));
  EXPECT_EQ(manager_->registered_count(), baseline_registered_)
      << "a refused loan registered memory";
  // The endpoint goes on: a message still arrives.
  expect_message_arrives(*endpoint, *raw, "still");
}

// Requests from a peer that has gone by the time they are answered: each
// reply fails, which breaks the endpoint. The endpoint must not hold its
// own lock while it replies (it did, refusing a handle for a receive that
// is not open, and hung; found by fuzz_endpoint_frames).
TEST_F(HostileEndpointTest, RequestsFromAPeerThatHasGoneEndTheEndpointWithoutHanging) {
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::optional<RawEndpointPeer> raw;
    auto endpoint = connect(raw);
    ASSERT_TRUE(endpoint);
    std::vector<uint8_t> requests;
    for (uint64_t id = 1; id <= 64; ++id) {
      auto frame = raw_frame(RawFrame::kHandleWanted,
                             RawPayload().u64(id).u64(/*a receive nobody posted=*/1000 + id));
      requests.insert(requests.end(), frame.begin(), frame.end());
    }
    ASSERT_TRUE(raw->send(requests));
    raw->close();  // usually before the endpoint reads the requests
    std::this_thread::sleep_for(50ms);
    // Closing waits for the endpoint's server. On a thread of its own, so that
    // a hang fails the test instead of stopping it.
    auto done = std::make_shared<std::promise<void>>();
    auto closed = done->get_future();
    std::thread([endpoint = std::move(endpoint), done]() mutable {
      endpoint.reset();
      done->set_value();
    }).detach();
    ASSERT_EQ(closed.wait_for(kFrameWait), std::future_status::ready)
        << "the endpoint hung replying to a peer that had gone";
  }
  expect_manager_still_serves();
}

TEST_F(HostileEndpointTest, APeerThatStopsMidFrameEndsTheEndpointWithUnavailable) {
  std::optional<RawEndpointPeer> raw;
  auto endpoint = connect(raw);
  ASSERT_TRUE(endpoint);
  LocalMemory into = allocate(kReceiveBytes);
  std::optional<PendingReceive> pending;
  auto seq = post(*endpoint, *raw, into, pending);
  ASSERT_TRUE(seq.has_value());
  auto frame = raw_frame(RawFrame::kSentInline, RawPayload().u64(*seq).u32(0x11223344));
  frame.resize(frame.size() - 2);  // the last bytes never come
  ASSERT_TRUE(raw->send(frame));
  raw->shut_down_writes();
  auto got = pending->wait(kTimeout);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().to_string();
  endpoint.reset();
  expect_manager_still_serves();
}

// Loans the peer asks for while the endpoint closes: each is answered
// before the close or refused, and none stays registered (a loan made after
// the lease keeper stopped would never be reclaimed). The race is timing
// dependent, so it is run several times.
TEST_F(HostileEndpointTest, LoansAskedForAsTheEndpointClosesAreAllReclaimed) {
  constexpr int kRounds = 20;
  constexpr uint64_t kLoans = 64;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::optional<RawEndpointPeer> raw;
    auto endpoint = connect(raw);
    ASSERT_TRUE(endpoint);
    std::vector<uint8_t> requests;
    for (uint64_t id = 1; id <= kLoans; ++id) {
      auto frame = raw_frame(RawFrame::kLendRequest, RawPayload().u64(id).u64(4096).u64(60'000));
      requests.insert(requests.end(), frame.begin(), frame.end());
    }
    ASSERT_TRUE(raw->send(requests));
    RawFrame type{};
    std::vector<uint8_t> reply;
    ASSERT_TRUE(raw->read_frame(type, reply, kFrameWait)) << "no answer to the first loan";
    ASSERT_EQ(type, RawFrame::kLent);
    endpoint->close();  // while the endpoint's server answers the others
    endpoint.reset();
    ASSERT_EQ(manager_->registered_count(), baseline_registered_)
        << "memory lent as the endpoint closed stayed registered";
  }
}

}  // namespace
}  // namespace rdmabuf::testing
