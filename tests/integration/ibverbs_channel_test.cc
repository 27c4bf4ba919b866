// The ibverbs backend's message channel (MessageChannel over verbs
// SEND/RECV, backends/ibverbs/message_channel.h) on real verbs, two
// channels of one process connected to each other: bytes in order across
// receives, a writer held back by the reader's posted receives and let go
// as it reads (learning their count from a read, or from the reader's
// own SENDs), a sleeping reader woken by its completion channel, bad
// addresses and sizes refused, a peer that is gone, and a probe answered
// only while the peer lives; and an endpoint handshake whose peer answers
// the RDMA channel with lies, refusals or a queue pair it cannot reach, or
// leaves while the listener reads through it.
//
// The endpoint tests (conformance, */ibverbs) run the whole endpoint over
// this channel; these pin the channel's own contract. Skipped, with the
// reason, where ibverbs is not viable; scripts/softroce-vm runs them
// (filter Ibverbs*).
#include <poll.h>

#include <future>
#include <numeric>
#include <optional>
#include <thread>

#include "common/event_loop.h"
#include "core/backend_table.h"
#include "tests/helpers/raw_endpoint.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

// The receives each side of a channel keeps posted, as its address says
// (docs/wire-format.md): a writer may post that many SENDs before any is read.
constexpr size_t kPostedReceives = 32;

class IbverbsChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const BackendFactory* factory = nullptr;
    for (const BackendFactory& f : backend_factories()) {
      if (std::string_view(f.name) == "ibverbs") factory = &f;
    }
    if (factory == nullptr) GTEST_SKIP() << "ibverbs is not viable here: it was not built";
    env_.config.backends = {"ibverbs"};
    env_.loops = &loops_;
    auto backend = factory->create(env_);
    if (!backend.ok()) {
      GTEST_SKIP() << "ibverbs is not viable here: " << backend.status().message();
    }
    backend_ = std::move(backend).value();
    auto a = backend_->open_message_channel();
    auto b = backend_->open_message_channel();
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << " " << b.status().to_string();
    a_ = std::move(a).value();
    b_ = std::move(b).value();
    ASSERT_TRUE(a_->connect(b_->address()).ok());
    ASSERT_TRUE(b_->connect(a_->address()).ok());
  }

  void TearDown() override {
    a_.reset();
    b_.reset();
    if (backend_) backend_->shutdown();
  }

  // The address of a channel that is gone: well-formed, and no queue pair
  // answers at it.
  std::vector<uint8_t> vanished_address() {
    auto channel = backend_->open_message_channel();
    EXPECT_TRUE(channel.ok()) << channel.status().to_string();
    return channel.ok() ? (*channel)->address() : std::vector<uint8_t>();
  }

  // `address` (a channel's address()) as another version's channel would
  // give it: its receives of another size (the address's last field).
  static std::vector<uint8_t> with_other_receive_size(std::vector<uint8_t> address) {
    address.back() ^= 1;
    return address;
  }

  // Whether an endpoint's channel() says its frames took TCP because the
  // read through the RDMA channel went unanswered: by its deadline
  // (Soft-RoCE never gives up on a queue pair that is gone), or failed
  // (a real NIC's retries ran out).
  static bool fell_back_unanswered(const std::string& channel) {
    const std::string prefix = "tcp (shared memory: the peer: a raw test peer; RDMA: this side: ";
    return channel.rfind(prefix, 0) == 0 &&
           (channel.find("the peer's queue pair did not answer a read in time") !=
                std::string::npos ||
            channel.find("cannot reach the peer's queue pair") != std::string::npos);
  }

  // Plays a peer connecting to a listener that is accepting: its hello and
  // an offer of RDMA alone, then the listener's hello and answer (which
  // must take RDMA), then `ready`. Whether all of it went so.
  static bool offer_rdma_then(RawEndpointPeer& raw, const RawPayload& ready) {
    RawFrame type{};
    std::vector<uint8_t> answer;
    return raw.send_hello(0x5eed) &&
           raw.send(raw_frame(RawFrame::kChannelOffer,
                              RawPayload().u8(0).blob("a raw test peer").u8(1).blob(""))) &&
           raw.read_frame(type, answer, 10s) && type == RawFrame::kHello &&
           raw.read_frame(type, answer, 10s) && type == RawFrame::kChannelAnswer &&
           !answer.empty() && answer[0] == static_cast<uint8_t>(2) &&  // RDMA taken
           raw.send(raw_frame(RawFrame::kChannelReady, ready));
  }

  // A peer of `listener` (which is accepting) whose RDMA channel names a
  // queue pair that is gone: once this returns, the listener's read
  // through it is under way, and goes unanswered.
  std::optional<RawEndpointPeer> peer_whose_channel_is_read(EndpointListener& listener) {
    auto raw = RawEndpointPeer::connect(listener.address());
    EXPECT_TRUE(raw.has_value());
    if (!raw.has_value()) return raw;
    EXPECT_TRUE(offer_rdma_then(*raw, RawPayload().u8(1).blob(vanished_address())));
    std::this_thread::sleep_for(200ms);  // the listener reads it and starts its read
    return raw;
  }

  // Writes `bytes` from a_, waiting (up to 10 s) while it has no room.
  Result<bool> write_waiting(std::span<const uint8_t> bytes) {
    const auto until = Clock::now() + 10s;
    while (true) {
      auto wrote = a_->write_whole(bytes, {});
      if (!wrote.ok() || *wrote || Clock::now() >= until) return wrote;
      std::this_thread::yield();
    }
  }

  // Writes `frame` from a_ until a write is refused (at most 1000 times):
  // how many were taken.
  Result<size_t> write_until_refused(std::span<const uint8_t> frame) {
    size_t accepted = 0;
    for (int i = 0; i < 1000; ++i) {
      RDMABUF_ASSIGN_OR_RETURN(const bool wrote, a_->write_whole(frame, {}));
      if (!wrote) break;
      ++accepted;
    }
    return accepted;
  }
  // Reads exactly `size` bytes at b_ (up to 10 s): what came.
  std::vector<uint8_t> read_exactly(size_t size) {
    std::vector<uint8_t> out(size);
    size_t got = 0;
    const auto until = Clock::now() + 10s;
    while (got < size && Clock::now() < until) {
      auto n = b_->read_some(out.data() + got, size - got);
      if (!n.ok()) break;
      got += *n;
    }
    out.resize(got);
    return out;
  }

  SharedLoops loops_{1, std::chrono::microseconds(0)};  // outlives backend_
  BackendEnv env_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MessageChannel> a_, b_;
};

std::vector<uint8_t> counting(size_t size, uint8_t from) {
  std::vector<uint8_t> bytes(size);
  std::iota(bytes.begin(), bytes.end(), from);
  return bytes;
}

// Writes of every size, many more than the receives posted, arrive whole
// and in order, whether read in place (peek/consume) or copied out, and
// pieces of one write arrive back to back.
TEST_F(IbverbsChannelTest, BytesArriveInOrderAcrossReceives) {
  const std::vector<size_t> sizes = {1,     13,    4096,  16383, 16384, 16385,
                                     16895, 16896, 16897, 40000, 100,   70000};
  std::vector<uint8_t> sent;
  std::thread writer([&] {
    for (int round = 0; round < 8; ++round) {
      for (size_t size : sizes) {
        const auto head = counting(5, static_cast<uint8_t>(round));
        const auto body = counting(size, static_cast<uint8_t>(size));
        const std::span<const uint8_t> pieces[] = {body};
        const auto until = Clock::now() + 10s;
        Result<bool> wrote = false;
        while (Clock::now() < until) {
          wrote = a_->write_whole(head, pieces);
          if (!wrote.ok() || *wrote) break;
          std::this_thread::yield();
        }
        ASSERT_TRUE(wrote.ok() && *wrote) << wrote.status().to_string();
        sent.insert(sent.end(), head.begin(), head.end());
        sent.insert(sent.end(), body.begin(), body.end());
      }
    }
  });
  size_t total = 0;
  for (size_t size : sizes)
    total += 5 + size;
  total *= 8;
  std::vector<uint8_t> got;
  const auto until = Clock::now() + 30s;
  bool in_place = false;
  while (got.size() < total && Clock::now() < until) {
    in_place = !in_place;  // both ways of reading, in turn
    if (in_place) {
      auto view = b_->peek();
      ASSERT_TRUE(view.ok()) << view.status().to_string();
      const size_t n = std::min<size_t>(view->size(), 3000);
      got.insert(got.end(), view->begin(), view->begin() + n);
      b_->consume(n);
    } else {
      uint8_t buffer[7000];
      auto n = b_->read_some(buffer, sizeof buffer);
      ASSERT_TRUE(n.ok()) << n.status().to_string();
      got.insert(got.end(), buffer, buffer + *n);
    }
  }
  writer.join();
  ASSERT_EQ(got.size(), total);
  EXPECT_TRUE(got == sent) << "the bytes came out of order or changed";
  EXPECT_FALSE(b_->has_incoming());
}

// A write of a unit's worth and the slack (MessageChannel::write_unit)
// travels as one SEND: it lies in one receive, and one peek shows all of
// it. A byte more takes a second SEND, after a first that is full.
TEST_F(IbverbsChannelTest, AWriteUnitAndItsSlackTravelInOneSend) {
  const size_t unit = a_->write_unit();
  ASSERT_GT(unit, 0u);
  const size_t most = unit + MessageChannel::kWriteUnitSlack;
  for (const size_t size : {most, most + 1}) {
    const auto bytes = counting(size, static_cast<uint8_t>(size));
    auto wrote = write_waiting(bytes);
    ASSERT_TRUE(wrote.ok() && *wrote) << wrote.status().to_string();
    std::vector<size_t> pieces;  // the spans peek() showed, in turn
    std::vector<uint8_t> got;
    const auto until = Clock::now() + 10s;
    while (got.size() < size && Clock::now() < until) {
      auto view = b_->peek();
      ASSERT_TRUE(view.ok()) << view.status().to_string();
      if (view->empty()) {
        std::this_thread::yield();
        continue;
      }
      pieces.push_back(view->size());
      got.insert(got.end(), view->begin(), view->end());
      b_->consume(view->size());
    }
    ASSERT_EQ(got, bytes) << "a write of " << size << " bytes";
    const std::vector<size_t> sends =
        size == most ? std::vector<size_t>{most} : std::vector<size_t>{most, 1};
    EXPECT_EQ(pieces, sends) << "a write of " << size << " bytes";
  }
}

// A writer that the reader does not keep up with is refused (false, no
// byte taken) once the reader's posted receives are used; as the reader
// reads, the writer goes on. Nothing is lost or doubled.
TEST_F(IbverbsChannelTest, AWriterWaitsForTheReadersReceives) {
  const auto frame = counting(16384, 7);  // one receive each
  auto taken = write_until_refused(frame);
  ASSERT_TRUE(taken.ok()) << taken.status().to_string();
  const size_t accepted = *taken;
  EXPECT_EQ(accepted, kPostedReceives) << "not stopped at the receives the reader posted";
  // At least one write of capacity() bytes fits in what the reader posts.
  EXPECT_GE(accepted, a_->capacity() / frame.size());
  // Still refused while the reader reads nothing.
  std::this_thread::sleep_for(50ms);
  auto again = a_->write_whole(frame, {});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  // The reader takes half (its receives are posted again a few at a time,
  // fewer than that); the writer, once it has read the reader's count
  // again, gets room for two more.
  const size_t half = accepted / 2;
  std::vector<uint8_t> frames;
  for (size_t i = 0; i < half; ++i)
    frames.insert(frames.end(), frame.begin(), frame.end());
  EXPECT_EQ(read_exactly(frames.size()), frames);
  for (int i = 0; i < 2; ++i) {
    auto more = write_waiting(frame);
    ASSERT_TRUE(more.ok() && *more) << "no room came back: " << more.status().to_string();
  }
  const size_t left = accepted - half + 2;  // the rest, and the two
  const auto rest = read_exactly(left * frame.size());
  ASSERT_EQ(rest.size(), left * frame.size());
  for (size_t i = 0; i < left; ++i) {
    ASSERT_TRUE(std::equal(frame.begin(), frame.end(), rest.begin() + i * frame.size()))
        << "frame " << i << " changed";
  }
  EXPECT_FALSE(b_->has_incoming());
}

// Each SEND carries its writer's count of receives posted: a writer that
// ran out of the peer's receives gets room back as soon as it reads a
// SEND the peer wrote after reading, with no credit read of its own (one
// would leave this first write refused while it is under way).
TEST_F(IbverbsChannelTest, AWriterLearnsTheReadersReceivesFromItsSends) {
  const auto frame = counting(16384, 3);  // one receive each
  auto accepted = write_until_refused(frame);
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  ASSERT_EQ(*accepted, kPostedReceives) << "not stopped at the receives the reader posted";
  // The refused write asked for the reader's count: let that read finish
  // (it answers before the reader reads, so it brings no room).
  const auto until = Clock::now() + 10s;
  Result<bool> answered = false;
  while (answered.ok() && !*answered && Clock::now() < until)
    answered = a_->probe_answered();
  ASSERT_TRUE(answered.ok() && *answered) << "the credit read was not answered";
  std::vector<uint8_t> frames;
  for (size_t i = 0; i < *accepted; ++i)
    frames.insert(frames.end(), frame.begin(), frame.end());
  ASSERT_EQ(read_exactly(frames.size()), frames);  // every receive posted again
  const auto reply = counting(8, 200);
  auto sent = b_->write_whole(reply, {});
  ASSERT_TRUE(sent.ok() && *sent) << sent.status().to_string();
  std::vector<uint8_t> got(reply.size());
  size_t have = 0;
  while (have < got.size() && Clock::now() < until) {
    auto n = a_->read_some(got.data() + have, got.size() - have);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    have += *n;
  }
  ASSERT_EQ(got, reply);
  auto again = a_->write_whole(frame, {});
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_TRUE(*again) << "the count the reader's SEND carried gave the writer no room";
  EXPECT_EQ(read_exactly(frame.size()), frame);
}

// A reader with nothing to read arms its wakeup and sleeps on its fd,
// which becomes readable when bytes land, not before.
TEST_F(IbverbsChannelTest, ASleepingReaderIsWokenWhenBytesLand) {
  ASSERT_TRUE(b_->arm_wakeup()) << "nothing was written, yet bytes came";
  pollfd watched{b_->wakeup_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&watched, 1, 100), 0) << "woken with nothing written";
  const auto bytes = counting(100, 1);
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    auto wrote = write_waiting(bytes);
    EXPECT_TRUE(wrote.ok() && *wrote);
  });
  EXPECT_EQ(::poll(&watched, 1, 10000), 1) << "not woken when bytes landed";
  writer.join();
  EXPECT_TRUE(b_->take_wakeups());
  EXPECT_FALSE(b_->take_wakeups()) << "one landing, one wakeup";
  EXPECT_TRUE(b_->has_incoming());
  EXPECT_EQ(read_exactly(bytes.size()), bytes);
  // Armed with bytes waiting: no sleep.
  ASSERT_TRUE(write_waiting(bytes).ok());
  const auto until = Clock::now() + 10s;
  while (!b_->has_incoming() && Clock::now() < until)
    std::this_thread::yield();
  EXPECT_FALSE(b_->arm_wakeup()) << "armed to sleep with bytes waiting";
}

// Malformed addresses and oversized writes are refused, with no effect.
TEST_F(IbverbsChannelTest, BadAddressesAndSizesAreRefused) {
  auto other = backend_->open_message_channel();
  ASSERT_TRUE(other.ok());
  std::vector<uint8_t> address = (*other)->address();
  EXPECT_EQ((*other)->connect(std::span(address).first(address.size() - 1)).code(),
            StatusCode::kProtocolError);
  std::vector<uint8_t> longer = address;
  longer.push_back(0);
  EXPECT_EQ((*other)->connect(longer).code(), StatusCode::kProtocolError);
  auto refused = (*other)->connect(with_other_receive_size(address));
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("receives of"), std::string::npos) << refused.message();
  std::vector<uint8_t> too_much(a_->capacity() + 1);
  EXPECT_EQ(a_->write_whole(too_much, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(b_->has_incoming());
}

// A probe is a read the peer's NIC answers: it is answered while the
// peer's channel lives, and not once it is gone (Soft-RoCE never says the
// queue pair is gone: the probe gives up at its deadline).
TEST_F(IbverbsChannelTest, AProbeIsAnsweredWhileThePeerLives) {
  // Whether `channel`'s probe is answered within `limit`.
  auto answered_within = [](MessageChannel& channel, std::chrono::milliseconds limit) {
    EXPECT_TRUE(channel.start_probe().ok());
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      auto answered = channel.probe_answered();
      EXPECT_TRUE(answered.ok()) << answered.status().to_string();
      if (!answered.ok() || *answered) return answered.ok();
      std::this_thread::yield();
    }
    return false;
  };
  EXPECT_TRUE(answered_within(*a_, 10s));
  EXPECT_TRUE(answered_within(*b_, 10s));
  b_.reset();
  EXPECT_FALSE(answered_within(*a_, 300ms)) << "a peer that is gone answered";
}

// A peer whose channel is gone takes nothing: the writer stops at the
// receives it had posted, drain() gives up at its limit, and the channel
// closes with its SENDs unanswered. (Its SENDs would fail once the NIC's
// retries run out; Soft-RoCE does not give up on a queue pair that is
// gone, so that is not waited for here. Endpoints learn of a dead peer
// from their TCP connection.)
TEST_F(IbverbsChannelTest, AGonePeerTakesNothingAndDoesNotHoldTheWriter) {
  b_.reset();
  const auto bytes = counting(64, 0);
  size_t accepted = 0;
  for (int i = 0; i < 100; ++i) {
    auto wrote = a_->write_whole(bytes, {});
    ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
    if (*wrote) ++accepted;
  }
  EXPECT_EQ(accepted, kPostedReceives) << "one SEND per receive the peer had posted";
  const auto start = Clock::now();
  a_->drain(200ms);
  EXPECT_LT(Clock::now() - start, 5s) << "drain() went past its limit";
  a_.reset();  // with SENDs in flight
}

// The endpoint handshake over RDMA, played by hand against a real
// listener whose manager has ibverbs only: the answer takes RDMA and
// carries an address; a peer that then sends a malformed address is
// dropped (ProtocolError, the listener goes on); one whose channel is
// another version's (receives of another size), and one that says it
// cannot connect, get frames over TCP with the reason.
TEST_F(IbverbsChannelTest, AHandshakeThatLiesAboutItsChannelIsRefused) {
  auto manager = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
  ASSERT_TRUE(manager);
  auto listener = manager->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  // Hello and an offer of RDMA only, accepted meanwhile (the listener
  // answers inside accept()); the answer must take RDMA. Then `ready`.
  auto handshake = [&](const RawPayload& ready) -> Result<std::unique_ptr<Endpoint>> {
    auto raw = RawEndpointPeer::connect((*listener)->address());
    if (!raw.has_value()) return Internal("cannot connect");
    auto accepted = std::async(std::launch::async, [&] { return (*listener)->accept(5s); });
    EXPECT_TRUE(offer_rdma_then(*raw, ready));
    auto endpoint = accepted.get();
    if (!endpoint.ok()) {
      EXPECT_TRUE(raw->closed_by_peer(10s)) << "refused, yet not closed";
    }
    return endpoint;
  };
  // A well-formed address of a queue pair that is gone: the listener's
  // read through the channel goes unanswered, and frames take TCP.
  auto unreachable = handshake(RawPayload().u8(1).blob(vanished_address()));
  ASSERT_TRUE(unreachable.ok()) << unreachable.status().to_string();
  EXPECT_TRUE(fell_back_unanswered((*unreachable)->channel())) << (*unreachable)->channel();
  auto lied = handshake(RawPayload().u8(1).blob("not an address"));
  EXPECT_FALSE(lied.ok()) << "a malformed address was taken";
  // Another version's channel (its receives of another size): TCP, saying so.
  const std::vector<uint8_t> gone = vanished_address();
  ASSERT_FALSE(gone.empty());
  auto other_version = handshake(RawPayload().u8(1).blob(with_other_receive_size(gone)));
  ASSERT_TRUE(other_version.ok()) << other_version.status().to_string();
  const std::string channel = (*other_version)->channel();
  EXPECT_EQ(channel.rfind("tcp (", 0), 0u) << channel;
  EXPECT_NE(channel.find("the peer's ibverbs channel posts 32 receives of"), std::string::npos)
      << channel;
  auto refused = handshake(RawPayload().u8(0).blob("no queue pair for you"));
  ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  EXPECT_EQ((*refused)->channel(),
            "tcp (shared memory: the peer: a raw test peer; RDMA: the peer: no queue pair for "
            "you)");
}

// While the listener waits for its read through one peer's RDMA channel
// (here a queue pair that is gone, which never answers), it serves the
// other handshakes: the read has no descriptor to block on.
TEST_F(IbverbsChannelTest, AnUnansweredReadHoldsUpNoOtherHandshake) {
  auto manager = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
  ASSERT_TRUE(manager);
  auto listener = manager->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto first = std::async(std::launch::async, [&] { return (*listener)->accept(10s); });
  auto stuck = peer_whose_channel_is_read(**listener);
  ASSERT_TRUE(stuck.has_value());
  const auto start = Clock::now();
  auto quick = RawEndpointPeer::start((*listener)->address(), 0x5eee);
  ASSERT_TRUE(quick.has_value());
  auto served = first.get();
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  EXPECT_LT(Clock::now() - start, 2s) << "held up by the other handshake's read";
  EXPECT_EQ((*served)->channel(),
            "tcp (shared memory: the peer: a raw test peer; RDMA: the peer: a raw test peer)");
  auto late = (*listener)->accept(10s);
  ASSERT_TRUE(late.ok()) << late.status().to_string();
  EXPECT_TRUE(fell_back_unanswered((*late)->channel())) << (*late)->channel();
  RawFrame type{};
  std::vector<uint8_t> answer;
  ASSERT_TRUE(stuck->read_frame(type, answer, 10s) && type == RawFrame::kChannelReady);
  EXPECT_TRUE(!answer.empty() && answer[0] == 0) << "the listener took a channel it cannot reach";
}

// A peer that leaves while the listener reads through its RDMA channel is
// dropped then: the listener hands out no endpoint over the dead
// connection (not even once the read's 3 s are up), and serves the next
// handshake meanwhile.
TEST_F(IbverbsChannelTest, APeerThatLeavesWhileItsChannelIsReadIsDropped) {
  auto manager = make_manager([](Config& c) { c.backends = {"ibverbs"}; });
  ASSERT_TRUE(manager);
  auto listener = manager->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto first = std::async(std::launch::async, [&] { return (*listener)->accept(10s); });
  auto leaving = peer_whose_channel_is_read(**listener);
  ASSERT_TRUE(leaving.has_value());
  leaving.reset();  // gone mid-read
  const auto start = Clock::now();
  auto next = RawEndpointPeer::start((*listener)->address(), 0x5eee);
  ASSERT_TRUE(next.has_value());
  auto served = first.get();
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  EXPECT_LT(Clock::now() - start, 2s) << "held up by the departed peer's read";
  EXPECT_EQ((*served)->channel(),
            "tcp (shared memory: the peer: a raw test peer; RDMA: the peer: a raw test peer)")
      << "the endpoint handed out is not the next peer's";
  auto none = (*listener)->accept(4s);
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded)
      << (none.ok() ? "an endpoint over the departed peer's connection: " + (*none)->channel()
                    : none.status().to_string());
}

}  // namespace
}  // namespace rdmabuf::testing
