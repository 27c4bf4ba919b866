// Multi-process tests of the ibverbs backend on real verbs: queue pairs set
// up lazily and concurrently, owners that restart, die or stop, requests
// that fail inside a batch, ops cut into many work requests, deadlines that
// pass while the NIC moves bytes, released and forged handles, and the
// fallback to tcp when a queue pair cannot be set up.
//
// Every manager here, in this process and in the rdmabuf_test_peer owners,
// enables ibverbs only (or ibverbs and tcp where the fallback is the point):
// the processes share a host, where the memory backend would win. Where
// ibverbs is not viable (no RDMA device) every test is skipped with the
// reason. To run them without an RDMA NIC, in a VM with Soft-RoCE:
//
//   scripts/softroce-vm -- build/tests/integration_tests --gtest_filter='Ibverbs*'
//
// (scripts/test.sh runs them so, as the ctest test ibverbs_in_softroce_vm).
//
// Soft-RoCE under emulation is slow (~50x): sizes stay in KiB to a few MiB.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <latch>
#include <mutex>
#include <sstream>
#include <thread>

#include "tests/helpers/backend_detail.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/sanitizer.h"
#include "tests/integration/ibverbs_pair.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

// The environment of owner processes: ibverbs only.
const std::vector<std::string> kIbOnly = {"RDMABUF_BACKENDS=ibverbs"};

using IbverbsTest = IbverbsOnlyTest;
using IbverbsFailureTest = IbverbsTest;
using IbverbsTimeoutTest = IbverbsTest;
using IbverbsFallbackTest = IbverbsTest;

// A manager in this process that uses ibverbs only.
std::unique_ptr<Manager> ib_manager(const std::function<void(Config&)>& tweak = {}) {
  return make_manager([&](Config& c) {
    c.backends = {"ibverbs"};
    if (tweak) tweak(c);
  });
}

std::vector<Op> ops_of(Op op) {
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  return ops;
}

// One op, waited for; its status, and through `backend` the backend that
// carried it.
Status run_op(Manager& m, Op op, std::chrono::milliseconds timeout, std::string* backend = nullptr,
              std::string* note = nullptr) {
  Transfer t = m.submit(ops_of(std::move(op)), timeout);
  Status s = t.wait();
  if (backend) *backend = std::string(t.op_backend(0));
  if (note) *note = t.op_note(0);
  return s;
}

std::vector<std::byte> copy_of(const LocalMemory& m) {
  ScopedIgnoreReads quiet;  // written by the NIC
  return std::vector<std::byte>(m.data(), m.data() + m.size());
}

int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// A detail of the peer's ibverbs backend ("handshakes served", ...).
std::string ib_detail(TestPeer& peer, const std::string& key) {
  std::string reply = peer.command("detail ibverbs " + key);
  return reply.rfind("detail ", 0) == 0 ? reply.substr(7) : "<" + reply + ">";
}

std::string ib_detail(const Manager& m, const std::string& key) {
  return backend_detail(m, "ibverbs", key);
}

// Polls `get` until it returns `want` or `timeout` passes; the last value.
std::string eventually(const std::function<std::string()>& get, const std::string& want,
                       std::chrono::milliseconds timeout = 10s) {
  const auto until = Clock::now() + timeout;
  std::string got = get();
  while (got != want && Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    got = get();
  }
  return got;
}

// "handle J TEXT" from the peer (register, alias) as J and the handle.
std::optional<std::pair<size_t, RemoteBuffer>> parse_handle_line(const std::string& line) {
  std::istringstream in(line);
  std::string word, text;
  size_t index = 0;
  if (!(in >> word >> index >> text) || word != "handle") return std::nullopt;
  auto handle = RemoteBuffer::from_text(text);
  if (!handle.ok()) return std::nullopt;
  return std::make_pair(index, *handle);
}

std::string crc_of(const LocalMemory& m) {
  ScopedIgnoreReads quiet;
  return crc_line(m.data(), m.size());
}

// --- queue pairs ------------------------------------------------------------

// Many threads of a fresh reader submit their first ops to one owner at the
// same instant: they all succeed, over one queue pair, set up by exactly one
// handshake. Once the reader's manager is gone, the owner lets go of its
// side of the pair.
TEST_F(IbverbsTest, ConcurrentFirstOpsConvergeOnOneQueuePair) {
  constexpr uint64_t kSize = 256 << 10;
  constexpr int kThreads = 16;
  constexpr uint64_t kLength = 16 << 10;
  auto peer = start_peer({{kSize, 11}, {kSize, 12}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  EXPECT_EQ(ib_detail(*peer, "handshakes served"), "0");
  EXPECT_EQ(ib_detail(*peer, "owner-side queue pairs"), "0");

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto reader = ib_manager();
    ASSERT_NE(reader, nullptr);
    std::latch go(kThreads);
    std::vector<Status> statuses(kThreads);
    std::vector<std::string> backends(kThreads);
    std::vector<LocalMemory> dsts;
    for (int i = 0; i < kThreads; ++i)
      dsts.push_back(with_sentinel(kLength));
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        const uint64_t offset = static_cast<uint64_t>(i) * kLength;
        Op op = Op::read(slice(peer->handle(i % 2), offset, kLength), dsts[i]);
        go.arrive_and_wait();
        statuses[i] = run_op(*reader, std::move(op), kTimeout, &backends[i]);
      });
    }
    for (auto& t : threads)
      t.join();
    for (int i = 0; i < kThreads; ++i) {
      EXPECT_TRUE(statuses[i].ok()) << "thread " << i << ": " << statuses[i].to_string();
      EXPECT_EQ(backends[i], "ibverbs") << "thread " << i;
      ScopedIgnoreReads quiet;
      EXPECT_EQ(find_mismatch(dsts[i].span(), 11 + static_cast<uint64_t>(i % 2),
                              static_cast<uint64_t>(i) * kLength),
                std::nullopt)
          << "thread " << i;
    }
    EXPECT_EQ(ib_detail(*peer, "handshakes served"), std::to_string(round + 1))
        << "concurrent first ops must share one queue pair";
    EXPECT_EQ(ib_detail(*peer, "owner-side queue pairs"), "1");
    reader.reset();
    EXPECT_EQ(eventually([&] { return ib_detail(*peer, "owner-side queue pairs"); }, "0"), "0")
        << "the owner keeps a queue pair of a reader that is gone";
  }
  expect_clean_exit(*peer);
}

// This process and the peer each own a buffer and read (then write) the
// other's at the same moment: both set up a queue pair towards the other at
// once, each serving the other's handshake meanwhile. No deadlock, the
// right bytes. A fresh manager each round, so that every round sets up both
// pairs anew. Finally the peer dies, and this process lets go of the pair
// it served for it.
TEST_F(IbverbsTest, BothSidesSetUpQueuePairsAtOnce) {
  constexpr uint64_t kSize = 128 << 10;
  auto peer = start_peer({{kSize, 21}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  std::unique_ptr<Manager> self;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const uint64_t seed = 100 + static_cast<uint64_t>(round) * 10;
    // The previous round wrote over the peer's buffer.
    ASSERT_EQ(peer->command("fill 0 21"), "ok");
    self = ib_manager();
    ASSERT_NE(self, nullptr);
    LocalMemory mine = with_pattern(kSize, seed);
    auto handle = self->register_buffer(mine);
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    const std::string text = handle->to_text();

    auto theirs = std::async(std::launch::async, [&] { return peer->command("read " + text); });
    LocalMemory dst = with_sentinel(kSize);
    std::string backend;
    Status s = run_op(*self, Op::read(peer->handle(0), dst), kTimeout, &backend);
    ASSERT_EQ(theirs.wait_for(90s), std::future_status::ready) << "the peer's read hangs";
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(backend, "ibverbs");
    EXPECT_EQ(find_mismatch(dst.span(), 21), std::nullopt);
    EXPECT_EQ(theirs.get(), crc_of(mine) + " ibverbs");

    // Writes both ways at once: the peer writes pattern seed + 1 over
    // `mine`, this process seed + 2 over the peer's buffer.
    auto their_write = std::async(std::launch::async, [&] {
      return peer->command("write " + text + " " + std::to_string(seed + 1));
    });
    LocalMemory src = with_pattern(kSize, seed + 2);
    s = run_op(*self, Op::write(peer->handle(0), src), kTimeout, &backend);
    ASSERT_EQ(their_write.wait_for(90s), std::future_status::ready) << "the peer's write hangs";
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(backend, "ibverbs");
    EXPECT_EQ(their_write.get(), "ok ibverbs");
    {
      ScopedIgnoreReads quiet;
      EXPECT_EQ(find_mismatch(mine.span(), seed + 1), std::nullopt);
    }
    EXPECT_EQ(peer->check(0, 0, kSize, seed + 2, 0), "ok");
    EXPECT_EQ(ib_detail(*self, "handshakes served"), "1");
    EXPECT_EQ(ib_detail(*peer, "handshakes served"), std::to_string(round + 1));
    if (round < 3) {
      ASSERT_TRUE(self->release(*handle).ok());
    }
  }
  // The reader of this process's last buffer dies: its side of the pair
  // goes with it, and this process lets go of its own.
  EXPECT_EQ(ib_detail(*self, "owner-side queue pairs"), "1");
  peer->process().kill_and_reap();
  EXPECT_EQ(eventually([&] { return ib_detail(*self, "owner-side queue pairs"); }, "0"), "0");
}

// --- one op, many work requests -----------------------------------------------

// With 4 KiB work requests, a 4 MiB op is 1024 of them: more than a queue
// pair holds at once (512) and than one post takes (32). Whole buffers and
// unaligned slices at both ends, reads and writes; local memory without a
// keepalive (registered per use) too.
TEST_F(IbverbsTest, OneOpOfManyWorkRequests) {
  constexpr uint64_t kSize = 4 << 20;
  auto peer = start_peer({{kSize, 31}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager([](Config& c) { c.ib_max_message = 4 << 10; });
  ASSERT_NE(reader, nullptr);
  const RemoteBuffer& h = peer->handle(0);

  LocalMemory dst = with_sentinel(kSize);
  std::string backend;
  Status s = run_op(*reader, Op::read(h, dst), kTimeout, &backend);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(backend, "ibverbs");
  EXPECT_EQ(find_mismatch(dst.span(), 31), std::nullopt);

  // Unaligned: remote [1000, 1000 + n) into local [7, 7 + n).
  constexpr uint64_t kOdd = (3 << 20) + 123;
  LocalMemory big = with_sentinel(kOdd + 100);
  s = run_op(*reader, Op::read(slice(h, 1000, kOdd), slice(big, 7, kOdd)), kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_not(std::span(big.data(), 7), kSentinel), std::nullopt);
  EXPECT_EQ(find_mismatch(std::span(big.data() + 7, kOdd), 31, 1000), std::nullopt);
  EXPECT_EQ(find_not(std::span(big.data() + 7 + kOdd, 93), kSentinel), std::nullopt);

  // A write of the whole buffer, then an unaligned one inside it.
  LocalMemory src = with_pattern(kSize, 32);
  s = run_op(*reader, Op::write(h, src), kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer->check(0, 0, kSize, 32, 0), "ok");
  constexpr uint64_t kAt = 4097, kLen = (2 << 20) + 5;
  LocalMemory odd_src = with_pattern(kLen + 3, 33);
  s = run_op(*reader, Op::write(slice(h, kAt, kLen), slice(odd_src, 3, kLen)), kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer->check(0, 0, kAt, 32, 0), "ok");
  EXPECT_EQ(peer->check(0, kAt, kLen, 33, 3), "ok");
  EXPECT_EQ(peer->check(0, kAt + kLen, kSize - kAt - kLen, 32, kAt + kLen), "ok");

  // Memory the library cannot see the lifetime of: registered per use.
  std::vector<std::byte> plain(kSize, kSentinel);
  s = run_op(*reader, Op::read(h, LocalMemory(plain.data(), plain.size())), kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_mismatch(std::span(plain.data(), kAt), 32), std::nullopt);
  EXPECT_EQ(find_mismatch(std::span(plain.data() + kAt, kLen), 33, 3), std::nullopt);
  expect_clean_exit(*peer);
}

// --- failures inside a batch ------------------------------------------------

// A copy of `h` whose ibverbs address lies past the buffer (everything else
// genuine, so the owner grants it a key and only the NIC can refuse it: the
// key opens the buffer's range alone).
RemoteBuffer with_bad_address(const RemoteBuffer& h) {
  auto ctx = ibverbs_context(h);
  EXPECT_TRUE(ctx.has_value()) << "the handle has no ibverbs context";
  if (!ctx) return RemoteBuffer();
  IbverbsContext bad = *ctx;
  bad.addr += h.region_size() + (1 << 20);
  auto forged = with_ibverbs_context(h, bad);
  EXPECT_TRUE(forged.ok()) << forged.status().to_string();
  return forged.ok() ? *forged : RemoteBuffer();
}

// [good, bad, good] with the bad op at every position, as reads and as
// writes: the bad op fails with PermissionDenied and its destination stays
// untouched; the good ops, whose requests the failure flushed from the
// queue pair, are posted again and succeed with the right bytes. Each op is
// one work request here.
TEST_F(IbverbsFailureTest, BadAddressFailsAloneInABatch) {
  constexpr uint64_t kSize = 256 << 10;
  auto peer = start_peer({{kSize, 41}, {kSize, 42}, {kSize, 43}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager();
  ASSERT_NE(reader, nullptr);
  const RemoteBuffer bad = with_bad_address(peer->handle(1));
  ASSERT_TRUE(bad.valid());
  {
    // A warm pair on which every handle is validated: the bad op reaches the NIC.
    LocalMemory warm = allocate(kSize);
    for (size_t i = 0; i < 3; ++i)
      ASSERT_TRUE(reader->read_into(peer->handle(i), warm, kTimeout).ok());
  }

  for (size_t pos = 0; pos < 3; ++pos) {
    SCOPED_TRACE("reads, the bad one at " + std::to_string(pos));
    std::vector<LocalMemory> dsts;
    std::vector<Op> ops;
    for (size_t i = 0; i < 3; ++i) {
      dsts.push_back(with_sentinel(kSize));
      ops.push_back(Op::read(i == pos ? bad : peer->handle(i == 0 ? 0 : 2), dsts.back()));
    }
    Transfer t = reader->submit(std::move(ops), kTimeout);
    Status s = t.wait();
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.to_string();
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(t.op_backend(i), "ibverbs") << i;
      if (i == pos) {
        EXPECT_EQ(t.op_status(i).code(), StatusCode::kPermissionDenied)
            << t.op_status(i).to_string();
        EXPECT_EQ(find_not(dsts[i].span(), kSentinel), std::nullopt) << "the refused read landed";
      } else {
        EXPECT_TRUE(t.op_status(i).ok()) << i << ": " << t.op_status(i).to_string();
        EXPECT_EQ(find_mismatch(dsts[i].span(), i == 0 ? 41 : 43), std::nullopt) << i;
      }
    }
  }

  for (size_t pos = 0; pos < 3; ++pos) {
    SCOPED_TRACE("writes, the bad one at " + std::to_string(pos));
    const uint64_t seed = 50 + pos * 5;
    // The good ops write buffers 0 and 2, in that order.
    size_t target[3] = {};
    for (size_t i = 0, good = 0; i < 3; ++i) {
      if (i != pos) target[i] = good++ == 0 ? 0 : 2;
    }
    std::vector<LocalMemory> srcs;
    std::vector<Op> ops;
    for (size_t i = 0; i < 3; ++i) {
      srcs.push_back(with_pattern(kSize, seed + i));
      ops.push_back(Op::write(i == pos ? bad : peer->handle(target[i]), srcs.back()));
    }
    Transfer t = reader->submit(std::move(ops), kTimeout);
    Status s = t.wait();
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.to_string();
    for (size_t i = 0; i < 3; ++i) {
      if (i == pos) {
        EXPECT_EQ(t.op_status(i).code(), StatusCode::kPermissionDenied)
            << t.op_status(i).to_string();
      } else {
        EXPECT_TRUE(t.op_status(i).ok()) << i << ": " << t.op_status(i).to_string();
      }
    }
    EXPECT_EQ(peer->check_original(1), "ok") << "the refused write landed";
    for (size_t i = 0; i < 3; ++i) {
      if (i != pos) {
        EXPECT_EQ(peer->check(target[i], 0, kSize, seed + i, 0), "ok") << i;
      }
    }
  }

  // The handle and its owner are fine afterwards.
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(peer->handle(1), dst, kTimeout).ok());
  EXPECT_EQ(find_mismatch(dst.span(), 42), std::nullopt);
  expect_clean_exit(*peer);
}

// The same with small work requests, so that each op is many of them: the
// bad op's first request fails and takes the whole op with it (its other
// requests are not posted again, to fail and flush the next queue pair);
// the good ops, flushed, are posted again and succeed.
TEST_F(IbverbsFailureTest, BadAddressOpOfManyWorkRequestsFailsAloneInABatch) {
  constexpr uint64_t kSize = 256 << 10;
  auto peer = start_peer({{kSize, 44}, {kSize, 45}, {kSize, 46}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager([](Config& c) { c.ib_max_message = 16 << 10; });  // 16 per op
  ASSERT_NE(reader, nullptr);
  const RemoteBuffer bad = with_bad_address(peer->handle(1));
  ASSERT_TRUE(bad.valid());
  {
    LocalMemory warm = allocate(kSize);
    for (size_t i = 0; i < 3; ++i)
      ASSERT_TRUE(reader->read_into(peer->handle(i), warm, kTimeout).ok());
  }
  for (size_t pos = 0; pos < 3; ++pos) {
    SCOPED_TRACE("the bad read at " + std::to_string(pos));
    std::vector<LocalMemory> dsts;
    std::vector<Op> ops;
    for (size_t i = 0; i < 3; ++i) {
      dsts.push_back(with_sentinel(kSize));
      ops.push_back(Op::read(i == pos ? bad : peer->handle(i == 0 ? 0 : 2), dsts.back()));
    }
    Transfer t = reader->submit(std::move(ops), kTimeout);
    t.wait().ignore();
    for (size_t i = 0; i < 3; ++i) {
      if (i == pos) {
        EXPECT_EQ(t.op_status(i).code(), StatusCode::kPermissionDenied)
            << t.op_status(i).to_string();
        EXPECT_EQ(find_not(dsts[i].span(), kSentinel), std::nullopt) << "the refused read landed";
      } else {
        EXPECT_TRUE(t.op_status(i).ok()) << i << ": " << t.op_status(i).to_string();
        EXPECT_EQ(find_mismatch(dsts[i].span(), i == 0 ? 44 : 46), std::nullopt) << i;
      }
    }
  }
  expect_clean_exit(*peer);
}

// --- deadlines while the NIC moves bytes --------------------------------------

// A read whose deadline passes while its work requests are in flight:
// wait() returns DeadlineExceeded, and from then on not one byte lands in
// the destination (the queue pair was drained before wait() returned). The
// next op on the same manager uses a fresh queue pair and succeeds. The
// timeout adapts to how fast this machine moves the bytes, so that the
// deadline falls mid-transfer. Meanwhile another thread reads through the
// same queue pair: its requests, flushed by the other transfer's
// cancellation, are posted again, and every one of its reads succeeds.
TEST_F(IbverbsTimeoutTest, ReadDeadlinePassingMidTransferLeavesTheDestinationAlone) {
  constexpr uint64_t kSize = 4 << 20;
  constexpr uint64_t kOther = 256 << 10;
  auto peer = start_peer({{kSize, 61}, {kOther, 62}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager([](Config& c) { c.ib_max_message = 64 << 10; });
  ASSERT_NE(reader, nullptr);
  const RemoteBuffer& h = peer->handle(0);
  LocalMemory warm = allocate(kSize);
  auto took = timed([&] { ASSERT_TRUE(reader->read_into(h, warm, kTimeout).ok()); });
  took = timed([&] { ASSERT_TRUE(reader->read_into(h, warm, kTimeout).ok()); });
  auto timeout = std::max<std::chrono::microseconds>(
      std::chrono::duration_cast<std::chrono::microseconds>(took) / 3, 500us);

  std::atomic<bool> stop{false};
  std::atomic<int> innocent_ok{0}, innocent_bad{0};
  std::thread innocent([&] {
    LocalMemory dst = allocate(kOther);
    while (!stop.load()) {
      Status s = reader->read_into(peer->handle(1), dst, kTimeout);
      if (s.ok() && !find_mismatch(dst.span(), 62)) {
        innocent_ok++;
      } else {
        innocent_bad++;
        ADD_FAILURE() << "a read of another transfer failed: " << s.to_string();
      }
    }
  });

  int mid_flight = 0, rounds = 0;
  for (; rounds < 16 && mid_flight < 3; ++rounds) {
    LocalMemory dst = with_sentinel(kSize);
    Transfer t = reader->submit(ops_of(Op::read(h, dst)),
                                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    Status s;
    auto waited = timed([&] { s = t.wait(); });
    if (s.ok()) {  // finished in time: try a shorter deadline
      timeout = std::max<std::chrono::microseconds>(timeout / 2, 500us);
      continue;
    }
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
    EXPECT_LT(waited, timeout + 5s) << "wait() overran its deadline";
    std::vector<std::byte> snapshot = copy_of(dst);
    std::this_thread::sleep_for(100ms);
    {
      ScopedIgnoreReads quiet;
      EXPECT_TRUE(std::memcmp(dst.data(), snapshot.data(), kSize) == 0)
          << "bytes landed after wait() returned DeadlineExceeded";
    }
    // What landed before the deadline is the right bytes, where they belong.
    size_t landed = 0;
    for (size_t at = 0; at < kSize; at += 64 << 10) {
      std::span<const std::byte> piece(snapshot.data() + at, 64 << 10);
      if (!find_not(piece, kSentinel)) continue;
      ++landed;
      EXPECT_EQ(find_mismatch(piece, 61, at), std::nullopt) << "piece at " << at;
    }
    if (landed > 0 && landed < kSize / (64 << 10)) {
      ++mid_flight;
    } else if (landed == 0) {  // cancelled before a byte moved: a longer deadline
      timeout = timeout * 3 / 2;
    }
    // A fresh op on the same manager works.
    LocalMemory again = allocate(64 << 10);
    Status fresh = reader->read_into(slice(h, 4096, 64 << 10), again, kTimeout);
    ASSERT_TRUE(fresh.ok()) << fresh.to_string();
    EXPECT_EQ(find_mismatch(again.span(), 61, 4096), std::nullopt);
  }
  stop = true;
  innocent.join();
  EXPECT_GE(mid_flight, 1) << "no deadline passed mid-transfer in " << rounds
                           << " rounds (last timeout " << timeout.count() << " us)";
  EXPECT_GT(innocent_ok.load(), 0);
  EXPECT_EQ(innocent_bad.load(), 0);
  LocalMemory whole = allocate(kSize);
  ASSERT_TRUE(reader->read_into(h, whole, kTimeout).ok());
  EXPECT_EQ(find_mismatch(whole.span(), 61), std::nullopt);
  expect_clean_exit(*peer);
}

// A write whose deadline passes mid-transfer: once wait() returned, the
// library never reads the source again. The caller refills the source with
// another pattern at once; none of its words reach the owner.
TEST_F(IbverbsTimeoutTest, WriteDeadlinePassingMidTransferNeverReadsTheSourceAgain) {
  constexpr uint64_t kSize = 4 << 20;
  auto peer = start_peer({{kSize, 71}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager([](Config& c) { c.ib_max_message = 64 << 10; });
  ASSERT_NE(reader, nullptr);
  const RemoteBuffer& h = peer->handle(0);
  LocalMemory src = with_pattern(kSize, 72);
  auto took = timed([&] { ASSERT_TRUE(reader->write_from(h, src, kTimeout).ok()); });
  took = timed([&] { ASSERT_TRUE(reader->write_from(h, src, kTimeout).ok()); });
  auto timeout = std::max<std::chrono::microseconds>(
      std::chrono::duration_cast<std::chrono::microseconds>(took) / 3, 500us);

  int mid_flight = 0, rounds = 0;
  for (; rounds < 16 && mid_flight < 3; ++rounds) {
    const uint64_t a = 1000 + static_cast<uint64_t>(rounds) * 2, b = a + 1;
    ASSERT_EQ(peer->command("fill 0 71"), "ok");
    fill_pattern(src.span(), a);
    Transfer t = reader->submit(ops_of(Op::write(h, src)),
                                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    Status s;
    auto waited = timed([&] { s = t.wait(); });
    if (s.ok()) {
      timeout = std::max<std::chrono::microseconds>(timeout / 2, 500us);
      continue;
    }
    fill_pattern(src.span(), b);  // the caller reuses its memory at once
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
    EXPECT_LT(waited, timeout + 5s) << "wait() overran its deadline";
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(peer->words(0, 0, kSize, b, 0), 0u)
        << "the library read the source after the write timed out";
    const uint64_t landed = peer->words(0, 0, kSize, a, 0);
    if (landed > 0 && landed < kSize / 8) {
      ++mid_flight;
    } else if (landed == 0) {
      timeout = timeout * 3 / 2;
    }
  }
  EXPECT_GE(mid_flight, 1) << "no deadline passed mid-transfer in " << rounds
                           << " rounds (last timeout " << timeout.count() << " us)";
  LocalMemory fresh = with_pattern(kSize, 79);
  Status s = reader->write_from(h, fresh, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer->check(0, 0, kSize, 79, 0), "ok");
  expect_clean_exit(*peer);
}

// --- owners that go away ----------------------------------------------------

// Owner A is killed; B starts on A's port. Reads and writes through A's
// handles fail (Unavailable while nothing listens, NotFound once B does),
// never touch this process's memory or B's, and B's handle works on the same
// reader manager: a fresh queue pair to the new owner.
TEST_F(IbverbsFailureTest, RestartedOwnerRefusesOldHandlesAndNewOnesWork) {
  constexpr uint64_t kSize = 256 << 10;
  auto first = start_peer({{kSize, 81}}, kIbOnly);
  ASSERT_NE(first, nullptr);
  auto reader = ib_manager();
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(first->handle(0), dst, kTimeout).ok());
  const RemoteBuffer old_handle = first->handle(0);
  const std::string address = first->address();

  first->process().kill_and_reap();
  LocalMemory probe = with_sentinel(kSize);
  Status s;
  auto took = timed([&] { s = reader->read_into(old_handle, probe, 10s); });
  EXPECT_TRUE(s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kNotFound)
      << s.to_string();
  EXPECT_LT(took, 9s) << "the failure waited for the timeout";
  EXPECT_EQ(find_not(probe.span(), kSentinel), std::nullopt);

  auto second = restart_peer_at(address, {{kSize, 82}}, kIbOnly);
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(second->address(), address);
  EXPECT_EQ(second->handle(0).id(), old_handle.id()) << "the same id, a different manager";

  // A handshake refused by the new owner (another manager id) is
  // remembered for a backoff; meanwhile can_reach() reports it, and with no
  // other transport the op fails with that refusal's code (NotFound), not
  // with "no transport in common" (FailedPrecondition, which says "change
  // the configuration"). Over tcp every one of these reads is NotFound too
  // (FailureTest.RestartedPeerRefusesOldHandles).
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("attempt " + std::to_string(i));
    s = reader->read_into(old_handle, probe, 10s);
    EXPECT_TRUE(s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnavailable)
        << s.to_string();
    EXPECT_EQ(find_not(probe.span(), kSentinel), std::nullopt) << "served the new process's bytes";
    LocalMemory src = with_pattern(kSize, 83);
    s = reader->write_from(old_handle, src, 10s);
    EXPECT_TRUE(s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnavailable)
        << s.to_string();
    EXPECT_EQ(second->check_original(0), "ok") << "an old handle wrote the new process's memory";
  }

  std::string backend;
  s = run_op(*reader, Op::read(second->handle(0), dst), kTimeout, &backend);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(backend, "ibverbs");
  EXPECT_EQ(find_mismatch(dst.span(), 82), std::nullopt);
  EXPECT_EQ(ib_detail(*second, "handshakes served"), "1");
  expect_clean_exit(*second);
}

// An owner killed while reads stream from it: the read in flight fails with
// Unavailable well before its timeout (the NIC gives up on the dead queue
// pair), no wrong byte is reported as read, and another owner is unaffected.
TEST_F(IbverbsFailureTest, OwnerKilledMidTransfer) {
  constexpr uint64_t kSize = 2 << 20;
  auto victim = start_peer({{kSize, 91}}, kIbOnly);
  ASSERT_NE(victim, nullptr);
  auto bystander = start_peer({{kSize, 92}}, kIbOnly);
  ASSERT_NE(bystander, nullptr);
  auto reader = ib_manager([](Config& c) { c.ib_max_message = 64 << 10; });
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(victim->handle(0), dst, kTimeout).ok());

  std::atomic<bool> killed{false};
  auto reads = std::async(std::launch::async, [&] {
    LocalMemory mine = allocate(kSize);
    // One read that starts after the kill (the owner reaped) must fail.
    for (int i = 0; i < 10000; ++i) {
      const bool after_kill = killed.load();
      Status s = reader->read_into(victim->handle(0), mine, kTimeout);
      if (!s.ok()) return std::make_pair(s, Clock::now());
      if (find_mismatch(mine.span(), 91)) {
        return std::make_pair(Internal("a read reported OK with wrong bytes"), Clock::now());
      }
      if (after_kill) break;
    }
    return std::make_pair(Status(), Clock::now());
  });
  std::this_thread::sleep_for(300ms);
  const auto killed_at = Clock::now();
  victim->process().kill_and_reap();
  killed = true;
  ASSERT_EQ(reads.wait_for(kTimeout + 10s), std::future_status::ready) << "the read hangs";
  auto [status, failed_at] = reads.get();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
  EXPECT_LT(failed_at - killed_at, 10s) << "the failure waited for the timeout";

  LocalMemory small = with_sentinel(4096);
  Status s;
  auto took = timed([&] { s = reader->read_into(slice(victim->handle(0), 0, 4096), small, 10s); });
  EXPECT_NE(s.code(), StatusCode::kOk);
  EXPECT_LT(took, 9s);
  EXPECT_EQ(find_not(small.span(), kSentinel), std::nullopt);
  LocalMemory other = allocate(kSize);
  ASSERT_TRUE(reader->read_into(bystander->handle(0), other, kTimeout).ok());
  EXPECT_EQ(find_mismatch(other.span(), 92), std::nullopt);
  expect_clean_exit(*bystander);
}

// A stopped owner (SIGSTOP) still serves RDMA: its NIC reads and writes its
// registered memory without its CPU. Only its control channel (handshakes,
// handle validation) waits for it. A question to a stopped owner must not
// hold up other ops' deadlines, and must not leave the control channel out
// of step once the owner resumes.
TEST_F(IbverbsFailureTest, StoppedOwnerDoesNotHoldUpDeadlinesOrDesyncValidation) {
  constexpr uint64_t kSize = 64 << 10;
  auto peer = start_peer({{kSize, 101}, {kSize, 102}, {kSize, 103}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager();
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(peer->handle(0), dst, kTimeout).ok());  // validated

  ASSERT_TRUE(peer->process().stop());
  // One-sided: a validated handle reads and writes while the owner is stopped.
  LocalMemory d0 = with_sentinel(kSize);
  Status s = reader->read_into(peer->handle(0), d0, kTimeout);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_mismatch(d0.span(), 101), std::nullopt);

  // Op 1's handle is new to the queue pair, so the owner is asked about it
  // first; the question waits for the stopped owner, but aside: the pair's
  // thread goes on completing op 0, and wait() returns at the deadline.
  std::vector<Op> ops;
  LocalMemory a = with_sentinel(kSize), b = with_sentinel(kSize);
  ops.push_back(Op::read(peer->handle(0), a));  // validated: the NIC serves it
  ops.push_back(Op::read(peer->handle(1), b));  // never seen: asks the stopped owner
  Transfer t = reader->submit(std::move(ops), 1s);
  auto waited = timed([&] { s = t.wait(); });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_LT(waited, 3s) << "wait() returned " << ms(waited) << " ms after a deadline of 1 s";
  EXPECT_EQ(find_not(b.span(), kSentinel), std::nullopt);

  // Still stopped, long enough for any question to it to time out.
  std::this_thread::sleep_for(std::chrono::seconds(11) - std::min<Clock::duration>(waited, 11s));
  ASSERT_TRUE(peer->process().resume());

  // The question was never answered (the owner was stopped for longer than
  // the 10 s an answer may take): the queue pair and its control connection
  // were reset, so no late answer can be taken for the answer to a later
  // question. Every buffer reads right once the owner resumes.
  for (size_t i : {1, 2, 0}) {
    SCOPED_TRACE("buffer " + std::to_string(i));
    LocalMemory d = with_sentinel(kSize);
    s = reader->read_into(peer->handle(i), d, kTimeout);
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(find_mismatch(d.span(), 101 + i), std::nullopt);
  }
  expect_clean_exit(*peer);
}

// --- released and forged handles ----------------------------------------------

// A buffer released by its owner: over ibverbs the NIC refuses its key (the
// registration is gone), and the backend asks the owner why, so a read
// through a handle used before reports NotFound as over every transport; a
// handle this reader never used is refused by the owner at validation. The
// destination and the owner's bytes stay untouched; other buffers of the
// owner keep working.
TEST_F(IbverbsFailureTest, ReleasedBufferIsNotFound) {
  constexpr uint64_t kSize = 256 << 10;
  auto peer = start_peer({{kSize, 111}, {kSize, 112}, {kSize, 113}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager();
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(peer->handle(0), dst, kTimeout).ok());
  ASSERT_TRUE(reader->read_into(peer->handle(1), dst, kTimeout).ok());

  // Used before (validated on this pair): the NIC refuses, the owner explains.
  ASSERT_EQ(peer->release(0), "ok");
  for (int i = 0; i < 2; ++i) {
    LocalMemory probe = with_sentinel(kSize);
    Status s = reader->read_into(peer->handle(0), probe, kTimeout);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
    EXPECT_EQ(find_not(probe.span(), kSentinel), std::nullopt);
    LocalMemory src = with_pattern(kSize, 114);
    s = reader->write_from(peer->handle(0), src, kTimeout);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
    EXPECT_EQ(peer->check_original(0), "ok") << "a write to a released buffer landed";
  }
  // Never used here: the owner refuses it when asked.
  ASSERT_EQ(peer->release(2), "ok");
  LocalMemory probe = with_sentinel(kSize);
  Status s = reader->read_into(peer->handle(2), probe, kTimeout);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_EQ(find_not(probe.span(), kSentinel), std::nullopt);

  // The buffer still registered is fine.
  s = reader->read_into(peer->handle(1), dst, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_mismatch(dst.span(), 112), std::nullopt);
  expect_clean_exit(*peer);
}

// The owner registers the same memory twice (two buffers, two handles, one
// range) and releases one of them. Every access through the released
// handle must fail with NotFound, as Manager::release promises, even though
// the other buffer keeps the memory registered.
TEST_F(IbverbsFailureTest, ReleasedBufferSharingItsMemoryWithALiveOneIsNotFound) {
  constexpr uint64_t kSize = 64 << 10;
  auto peer = start_peer({{kSize, 121}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto alias = parse_handle_line(peer->command("alias 0"));
  ASSERT_TRUE(alias.has_value());
  const auto [alias_index, alias_handle] = *alias;
  auto reader = ib_manager();
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(alias_handle, dst, kTimeout).ok());
  EXPECT_EQ(find_mismatch(dst.span(), 121), std::nullopt);

  ASSERT_EQ(peer->release(alias_index), "ok");
  // Every buffer has a registration (a key) of its own, even when another
  // buffer covers the same range: release revokes exactly its key, so a
  // handle validated before its release is refused by the NIC (and the
  // owner, asked why, says NotFound), while its twin goes on working.
  LocalMemory probe = with_sentinel(kSize);
  Status s = reader->read_into(alias_handle, probe, kTimeout);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_EQ(find_not(probe.span(), kSentinel), std::nullopt) << "a released handle was read";
  LocalMemory src = with_pattern(kSize, 122);
  s = reader->write_from(alias_handle, src, kTimeout);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_EQ(peer->check_original(0), "ok") << "a released handle wrote the owner's memory";

  // The live buffer still works.
  s = reader->read_into(peer->handle(0), dst, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_clean_exit(*peer);
}

// Handles forged where the NIC cannot tell: a token or a buffer size the
// owner never minted (the address is genuine). The owner refuses them when
// the reader asks for access: PermissionDenied for the token,
// InvalidArgument for a size, NotFound for an id; not a byte moves, in
// either direction. The genuine handle keeps working on the same pair,
// before and after. A forged address in the ibverbs context, outside the
// registration, is refused by the NIC.
TEST_F(IbverbsFailureTest, ForgedHandlesAreRefusedBeforeAByteMoves) {
  constexpr uint64_t kSize = 128 << 10;
  auto peer = start_peer({{kSize, 131}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto reader = ib_manager([](Config& c) { c.ib_max_message = 16 << 10; });
  ASSERT_NE(reader, nullptr);
  const RemoteBuffer& h = peer->handle(0);
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(h, dst, kTimeout).ok());

  auto token = with_altered_token(h, 3);
  auto bigger = with_view(h, 2 * kSize, 0, 2 * kSize);  // many work requests
  auto inside = with_view(h, 2 * kSize, 0, kSize);      // only in-bounds bytes
  auto other_id = with_id(h, h.id() + 1000);
  ASSERT_TRUE(token.ok() && bigger.ok() && inside.ok() && other_id.ok());
  auto ctx = ibverbs_context(h);
  ASSERT_TRUE(ctx.has_value());
  IbverbsContext shifted = *ctx;
  shifted.addr += kSize;  // right after the registration
  auto outside = with_ibverbs_context(h, shifted);
  ASSERT_TRUE(outside.ok());
  struct Case {
    const char* what;
    RemoteBuffer handle;
    StatusCode code;
  };
  const Case cases[] = {
      {"altered token", *token, StatusCode::kPermissionDenied},
      {"twice the size", *bigger, StatusCode::kInvalidArgument},
      {"a larger size, in-bounds view", *inside, StatusCode::kInvalidArgument},
      {"unknown id", *other_id, StatusCode::kNotFound},
      {"address outside the registration", *outside, StatusCode::kPermissionDenied},
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.what) + ", pass " + std::to_string(pass));
      LocalMemory probe = with_sentinel(c.handle.size());
      Status s = reader->read_into(c.handle, probe, kTimeout);
      EXPECT_EQ(s.code(), c.code) << s.to_string();
      EXPECT_EQ(find_not(probe.span(), kSentinel), std::nullopt) << "a refused read landed";
      LocalMemory src = with_pattern(c.handle.size(), 132);
      s = reader->write_from(c.handle, src, kTimeout);
      EXPECT_EQ(s.code(), c.code) << s.to_string();
      EXPECT_EQ(peer->check_original(0), "ok") << "a refused write landed";
      // The genuine handle, same id, on the same pair.
      LocalMemory good = with_sentinel(kSize);
      s = reader->read_into(h, good, kTimeout);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(find_mismatch(good.span(), 131), std::nullopt);
    }
  }
  expect_clean_exit(*peer);
}

// Writers hammer a buffer over ibverbs while its owner releases it: once
// release() has returned in the owner, the buffer's bytes never change
// again (the NIC refuses the key), and every write that starts after that
// fails with NotFound. Each write carries a stamp of its own.
TEST_F(IbverbsFailureTest, WritesNeverLandAfterReleaseReturned) {
  constexpr uint64_t kSize = 192 << 10;
  constexpr uint64_t kPart = 64 << 10;
  auto peer = start_peer({{4096, 1}}, kIbOnly);
  ASSERT_NE(peer, nullptr);
  auto writer = ib_manager([](Config& c) { c.ib_max_message = 16 << 10; });
  ASSERT_NE(writer, nullptr);
  std::atomic<uint64_t> stamp{1};
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    int index = peer->register_buffer(kSize, 140 + static_cast<uint64_t>(round));
    ASSERT_GE(index, 0);
    const RemoteBuffer handle = peer->handle(static_cast<size_t>(index));
    std::atomic<bool> stop{false};
    std::atomic<int> landed{0};
    std::mutex mu;
    std::vector<std::pair<Clock::time_point, Status>> outcomes;
    std::vector<std::thread> writers;
    for (int w = 0; w < 3; ++w) {
      writers.emplace_back([&, w] {
        LocalMemory src = allocate(kPart);
        auto remote = slice(handle, static_cast<uint64_t>(w) * kPart, kPart);
        auto* words = reinterpret_cast<uint64_t*>(src.data());
        while (!stop.load()) {
          const uint64_t mine = stamp.fetch_add(1);
          std::fill(words, words + kPart / 8, mine);
          auto started = Clock::now();
          Status st = writer->write_from(remote, src, kTimeout);
          if (st.ok()) landed++;
          std::lock_guard lock(mu);
          outcomes.emplace_back(started, st);
        }
      });
    }
    for (auto until = Clock::now() + kTimeout; landed.load() < 3 && Clock::now() < until;) {
      std::this_thread::sleep_for(1ms);
    }
    std::string watched = peer->command("release-watch " + std::to_string(index) + " 100");
    const auto released = Clock::now();
    // Until a write that started after release() returned has finished
    // (slow machines, sanitizers and emulated CPUs take their time).
    auto finished_after_release = [&] {
      std::lock_guard lock(mu);
      return std::any_of(outcomes.begin(), outcomes.end(),
                         [&](const auto& o) { return o.first > released; });
    };
    for (auto until = Clock::now() + kTimeout; !finished_after_release() && Clock::now() < until;) {
      std::this_thread::sleep_for(10ms);
    }
    stop = true;
    for (auto& t : writers)
      t.join();
    EXPECT_EQ(watched, "stable") << "bytes landed in the buffer after release() returned";
    int ok = 0, refused_after = 0;
    for (const auto& [started, st] : outcomes) {
      ok += st.ok();
      if (started > released) {
        EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
        ++refused_after;
      } else {
        EXPECT_TRUE(st.ok() || st.code() == StatusCode::kNotFound) << st.to_string();
      }
    }
    EXPECT_GT(ok, 0);
    EXPECT_GT(refused_after, 0);
  }
  expect_clean_exit(*peer);
}

// --- fallback -----------------------------------------------------------------

// An owner that offers ibverbs and tcp, and a handle whose ibverbs context
// names a device the owner does not have: the owner refuses the queue pair.
// A reader that allows ibverbs and tcp reads over tcp, with the reason in
// op_note, every time (the queue pair is retried after a backoff, and
// refused again); a handle whose ibverbs context does not even parse goes
// over tcp too. The genuine handle still goes over ibverbs. With the tcp
// fallback disabled, the same reads fail with FailedPrecondition.
TEST_F(IbverbsFallbackTest, RefusedQueuePairFallsBackToTcpWithTheReason) {
  constexpr uint64_t kSize = 64 << 10;
  auto peer = start_peer({{kSize, 151}}, {"RDMABUF_BACKENDS=ibverbs,tcp"});
  ASSERT_NE(peer, nullptr);
  const RemoteBuffer& h = peer->handle(0);
  ASSERT_NE(h.context("tcp"), nullptr);
  auto ctx = ibverbs_context(h);
  ASSERT_TRUE(ctx.has_value());
  IbverbsContext elsewhere = *ctx;
  elsewhere.device = "nosuchdev0";
  auto refused = with_ibverbs_context(h, elsewhere);
  ASSERT_TRUE(refused.ok());
  auto malformed = with_context_data(h, "ibverbs", {1, 0, 0});
  ASSERT_TRUE(malformed.ok());

  auto reader = make_manager([](Config& c) { c.backends = {"ibverbs", "tcp"}; });
  ASSERT_NE(reader, nullptr);
  std::string backend, note;
  LocalMemory dst = with_sentinel(kSize);
  Status s = run_op(*reader, Op::read(h, dst), kTimeout, &backend, &note);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(backend, "ibverbs");
  EXPECT_EQ(note, "");

  // The op that runs into the refused handshake is handed on to tcp (it
  // has not started), with the refusal as its note; so are the ops during
  // the backoff that follows, and those that run into the next refused
  // attempt after it. None fails.
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE("read " + std::to_string(i));
    LocalMemory probe = with_sentinel(kSize);
    s = run_op(*reader, Op::read(*refused, probe), kTimeout, &backend, &note);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (s.ok()) {
      EXPECT_EQ(backend, "tcp");
      EXPECT_NE(note.find("ibverbs: "), std::string::npos) << note;
      EXPECT_NE(note.find("nosuchdev0"), std::string::npos) << note;
      EXPECT_EQ(find_mismatch(probe.span(), 151), std::nullopt);
    }
    std::this_thread::sleep_for(70ms);  // past a backoff now and then
  }
  LocalMemory probe = with_sentinel(kSize);
  s = run_op(*reader, Op::read(*malformed, probe), kTimeout, &backend, &note);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(backend, "tcp");
  EXPECT_NE(note.find("ibverbs: malformed"), std::string::npos) << note;
  EXPECT_EQ(find_mismatch(probe.span(), 151), std::nullopt);
  s = run_op(*reader, Op::read(h, dst), kTimeout, &backend, &note);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(backend, "ibverbs") << "the genuine handle's queue pair is unaffected";

  auto strict = make_manager([](Config& c) {
    c.backends = {"ibverbs", "tcp"};
    c.allow_tcp_fallback = false;
  });
  ASSERT_NE(strict, nullptr);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("strict read " + std::to_string(i));
    LocalMemory p = with_sentinel(kSize);
    s = run_op(*strict, Op::read(*refused, p), kTimeout);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_NE(s.message().find("nosuchdev0"), std::string::npos) << s.to_string();
    EXPECT_EQ(find_not(p.span(), kSentinel), std::nullopt);
  }
  LocalMemory p = with_sentinel(kSize);
  s = run_op(*strict, Op::read(*malformed, p), kTimeout);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_NE(s.message().find("fallback"), std::string::npos) << s.to_string();
  s = run_op(*strict, Op::read(h, p), kTimeout, &backend);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(backend, "ibverbs");
  expect_clean_exit(*peer);
}

}  // namespace
}  // namespace rdmabuf::testing
