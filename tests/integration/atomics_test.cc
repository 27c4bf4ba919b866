// Remote atomics (Op::fetch_add, Op::compare_and_swap) from many processes
// on one word, a lock built from compare-and-swap beside reads and writes
// carried by either transport, the refusals, and hostile peers that send
// malformed atomics. The owner is this process; the peers that act on its
// words are rdmabuf_test_peer processes.
#include <sys/socket.h>

#include <atomic>
#include <sstream>

#include "backends/tcp/protocol.h"
#include "common/socket.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/raw_tcp.h"
#include "tests/helpers/sanitizer.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

// The owner: a manager with every viable backend, and one registered page.
struct Owner {
  std::unique_ptr<Manager> manager;
  LocalMemory memory;
  RemoteBuffer handle;

  // `in_file`: the page is in a shared file (LocalMemory::allocate), which
  // same-host readers map; else private memory, which they cannot.
  static Owner make(bool in_file = true) {
    constexpr size_t size = 4096;
    Owner o;
    auto m = Manager::create(Config{});
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return o;
    o.manager = std::move(m).value();
    o.memory = in_file ? *LocalMemory::allocate(size) : *LocalMemory::allocate_private(size);
    std::memset(o.memory.data(), 0, size);
    auto h = o.manager->register_buffer(o.memory);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) o.handle = *h;
    return o;
  }
  // Word `i` (8 bytes at 8 * i).
  RemoteBuffer word(size_t i) const { return *handle.slice(8 * i, 8); }
  // Peers' writes landed through the manager's threads, in an order the
  // sockets and pipes gave, which ThreadSanitizer cannot see (sanitizer.h).
  uint64_t value(size_t i) const {
    ScopedIgnoreReads quiet;
    return std::atomic_ref<uint64_t>(reinterpret_cast<uint64_t*>(memory.data())[i]).load();
  }
};

// Runs `ops` in one transfer with `m`; its status.
Status run(Manager& m, std::vector<Op> ops, Transfer* out = nullptr) {
  Transfer t = m.submit(std::move(ops), kTimeout);
  Status st = t.wait();
  if (out) *out = std::move(t);
  return st;
}

uint64_t word_at(const LocalMemory& m, size_t i = 0) {
  uint64_t v;
  std::memcpy(&v, m.data() + 8 * i, sizeof v);
  return v;
}

// Sends `line` to every peer at once, then collects their answers.
std::vector<std::string> ask_all(std::vector<std::unique_ptr<TestPeer>>& peers,
                                 const std::vector<std::string>& lines) {
  for (size_t i = 0; i < peers.size(); ++i)
    EXPECT_TRUE(peers[i]->process().write_line(lines[i]));
  std::vector<std::string> answers;
  for (auto& peer : peers)
    answers.push_back(peer->process().read_line(std::chrono::seconds(170)).value_or("(no answer)"));
  return answers;
}

// `n` peers; with `every_other_tcp`, peers 1, 3, ... use tcp only.
std::vector<std::unique_ptr<TestPeer>> start_peers(size_t n, bool every_other_tcp) {
  std::vector<std::unique_ptr<TestPeer>> peers;
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::string> env;
    if (every_other_tcp && i % 2 == 1) env.push_back("RDMABUF_BACKENDS=tcp");
    peers.push_back(start_peer({}, env));
    if (!peers.back()) return {};
  }
  return peers;
}

TEST(AtomicsTest, EightProcessesAddingToOneCounterEndAtExactlyTheirSum) {
  constexpr uint64_t kProcesses = 8, kAdds = 10000;
  Owner owner = Owner::make();
  ASSERT_NE(owner.manager, nullptr);
  // Half of them apply their atomics with their own CPU on the owner's
  // memory, which they map (the memory transport); the other half ask the
  // owner's manager to (tcp): both on one word at once.
  auto peers = start_peers(kProcesses, /*every_other_tcp=*/true);
  ASSERT_EQ(peers.size(), kProcesses);
  // Batches of 100 over tcp (each process's adds run on its several
  // connections at once, besides the other processes'), one add at a time
  // over memory, so that both kinds run about as long.
  std::vector<std::string> lines;
  for (uint64_t p = 0; p < kProcesses; ++p) {
    lines.push_back("add " + owner.word(3).to_text() + " " + std::to_string(kAdds) +
                    (p % 2 == 1 ? " 100" : " 1"));
  }
  std::vector<std::string> answers = ask_all(peers, lines);
  uint64_t sum = 0, sum_of_squares = 0;
  for (size_t p = 0; p < answers.size(); ++p) {
    std::istringstream in(answers[p]);
    std::string word, backend;
    uint64_t s = 0, sq = 0;
    ASSERT_TRUE(in >> word >> s >> sq >> backend && word == "added") << answers[p];
    EXPECT_EQ(backend, p % 2 == 1 ? "tcp" : "memory") << "peer " << p;
    sum += s;
    sum_of_squares += sq;
  }
  constexpr uint64_t kTotal = kProcesses * kAdds;
  EXPECT_EQ(owner.value(3), kTotal);
  // Every previous value 0..kTotal-1 came back exactly once (their sum and
  // the sum of their squares say so, short of a coincidence).
  uint64_t want_sum = 0, want_squares = 0;
  for (uint64_t v = 0; v < kTotal; ++v) {
    want_sum += v;
    want_squares += v * v;
  }
  EXPECT_EQ(sum, want_sum);
  EXPECT_EQ(sum_of_squares, want_squares);
  EXPECT_EQ(owner.value(2), 0u);  // its neighbours untouched
  EXPECT_EQ(owner.value(4), 0u);
}

// The peers' reads and writes of the protected word go over the memory
// transport (same host) or tcp, and so do their atomics: applied by their
// own CPU on the owner's buffer, which they map, or by the owner's manager.
class LockTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LockTest, ALockBuiltFromCompareAndSwapKeepsACriticalSectionExclusive) {
  constexpr uint64_t kProcesses = 4, kRounds = 250;
  Owner owner = Owner::make();
  ASSERT_NE(owner.manager, nullptr);
  // "mixed": peers 1 and 3 use tcp only.
  auto over_tcp = [](uint64_t peer) {
    return GetParam() == "tcp" || (GetParam() == "mixed" && peer % 2 == 1);
  };
  std::vector<std::unique_ptr<TestPeer>> peers;
  for (uint64_t i = 0; i < kProcesses; ++i) {
    std::vector<std::string> env;
    if (over_tcp(i)) env.push_back("RDMABUF_BACKENDS=tcp");
    peers.push_back(start_peer({}, env));
    ASSERT_NE(peers.back(), nullptr);
  }
  std::vector<std::string> lines;
  for (uint64_t i = 0; i < kProcesses; ++i) {
    lines.push_back("locked-add " + owner.word(0).to_text() + " " + owner.word(1).to_text() + " " +
                    std::to_string(kRounds) + " " + std::to_string(i + 1));
  }
  std::vector<std::string> answers = ask_all(peers, lines);
  for (uint64_t i = 0; i < kProcesses; ++i)
    EXPECT_EQ(answers[i], over_tcp(i) ? "ok tcp" : "ok memory") << "peer " << i;
  // A read-modify-write by plain reads and writes loses updates unless the
  // lock kept every other process out while it ran.
  EXPECT_EQ(owner.value(1), kProcesses * kRounds);
  EXPECT_EQ(owner.value(0), 0u) << "the lock is free at the end";
}

INSTANTIATE_TEST_SUITE_P(PeersOver, LockTest, ::testing::Values("memory", "tcp", "mixed"));

// Each case: whether the reader uses tcp only, whether the owner's page is
// in a shared file, and the backend that then applies the atomics.
struct AtomicsCase {
  bool tcp_only;
  bool in_file;
  std::string backend;
};

class AtomicsResultsTest : public ::testing::TestWithParam<AtomicsCase> {};

TEST_P(AtomicsResultsTest, ResultsRefusalsAndBatches) {
  const AtomicsCase& c = GetParam();
  Owner owner = Owner::make(c.in_file);
  ASSERT_NE(owner.manager, nullptr);
  {
    std::unique_ptr<Manager> reader =
        c.tcp_only ? make_manager() : std::move(Manager::create(Config{})).value();
    ASSERT_NE(reader, nullptr);
    LocalMemory previous = *LocalMemory::allocate(64);

    // fetch-add returns the previous value and wraps.
    ASSERT_TRUE(run(*reader, {Op::fetch_add(owner.word(0), previous, 5)}).ok());
    EXPECT_EQ(word_at(previous), 0u);
    Transfer t;
    ASSERT_TRUE(run(*reader, {Op::fetch_add(owner.word(0), previous, ~uint64_t{0})}, &t).ok());
    EXPECT_EQ(word_at(previous), 5u);
    EXPECT_EQ(owner.value(0), 4u);
    EXPECT_EQ(t.op_backend(0), c.backend);
    if (!c.tcp_only && !c.in_file) {  // the memory transport says why not
      EXPECT_NE(t.op_note(0).find("memory: atomics need the owner's buffer mapped here"),
                std::string::npos)
          << t.op_note(0);
    }

    // compare-and-swap: stores only on a match; returns the previous value either way.
    ASSERT_TRUE(run(*reader, {Op::compare_and_swap(owner.word(0), previous, 7, 99)}).ok());
    EXPECT_EQ(word_at(previous), 4u);
    EXPECT_EQ(owner.value(0), 4u);
    ASSERT_TRUE(run(*reader, {Op::compare_and_swap(owner.word(0), previous, 4, 99)}).ok());
    EXPECT_EQ(word_at(previous), 4u);
    EXPECT_EQ(owner.value(0), 99u);

    // A batch mixing atomics with a write and a read of the same page, in
    // order on one word: each atomic sees the one before it.
    LocalMemory out = *LocalMemory::allocate(64);
    std::vector<Op> ops;
    for (size_t i = 0; i < 4; ++i)
      ops.push_back(Op::fetch_add(owner.word(1), *previous.slice(8 * i, 8), 10));
    ops.push_back(Op::read(*owner.handle.slice(0, 8), out));
    ASSERT_TRUE(run(*reader, std::move(ops)).ok());
    std::vector<uint64_t> seen;
    for (size_t i = 0; i < 4; ++i)
      seen.push_back(word_at(previous, i));
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<uint64_t>{0, 10, 20, 30}));
    EXPECT_EQ(owner.value(1), 40u);
    EXPECT_EQ(word_at(out), 99u);

    // Refused before a byte moves, each with InvalidArgument: not 8 bytes,
    // misaligned, a local range too small, and the word beside it untouched.
    auto refused = [&](Op op, const std::string& says) {
      Status st = run(*reader, {std::move(op)});
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find(says), std::string::npos) << st.to_string();
    };
    refused(Op::fetch_add(*owner.handle.slice(8, 16), previous, 1), "one 8-byte word");
    refused(Op::fetch_add(*owner.handle.slice(12, 8), previous, 1), "not 8-byte aligned");
    refused(Op::compare_and_swap(owner.word(1), *previous.slice(0, 4), 40, 0), "cannot hold");
    EXPECT_EQ(owner.value(1), 40u);

    // A forged token beside genuine atomics in one batch: refused alone.
    auto forged = with_altered_token(owner.word(1));
    ASSERT_TRUE(forged.ok()) << forged.status().to_string();
    ops.clear();
    ops.push_back(Op::fetch_add(owner.word(1), *previous.slice(0, 8), 1));
    ops.push_back(Op::fetch_add(*forged, *previous.slice(8, 8), 1000));
    ops.push_back(Op::fetch_add(owner.word(1), *previous.slice(16, 8), 1));
    Transfer batch = reader->submit(std::move(ops), kTimeout);
    batch.wait().ignore();
    EXPECT_TRUE(batch.op_status(0).ok()) << batch.op_status(0).to_string();
    EXPECT_EQ(batch.op_status(1).code(), StatusCode::kPermissionDenied)
        << batch.op_status(1).to_string();
    EXPECT_TRUE(batch.op_status(2).ok()) << batch.op_status(2).to_string();
    EXPECT_EQ(owner.value(1), 42u);
  }
}

INSTANTIATE_TEST_SUITE_P(Readers, AtomicsResultsTest,
                         ::testing::Values(AtomicsCase{true, true, "tcp"},
                                           AtomicsCase{false, true, "memory"},
                                           AtomicsCase{false, false, "tcp"}),
                         [](const ::testing::TestParamInfo<AtomicsCase>& param) {
                           return std::string(param.param.tcp_only ? "tcp_only" : "every_backend") +
                                  (param.param.in_file ? "_shared_file" : "_private_memory");
                         });

TEST(AtomicsTest, AWordMisalignedInTheOwnersMemoryIsRefused) {
  Owner owner = Owner::make();
  ASSERT_NE(owner.manager, nullptr);
  // A buffer that starts 4 bytes into the page: its offset 0 is aligned for
  // the reader, not in the owner's memory.
  auto handle = owner.manager->register_buffer(*owner.memory.slice(4, 64));
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  // Refused by the owner's manager (tcp), and by a reader that maps it (memory).
  for (bool tcp_only : {true, false}) {
    SCOPED_TRACE(tcp_only ? "tcp only" : "every backend");
    auto reader = tcp_only ? make_manager() : std::move(Manager::create(Config{})).value();
    ASSERT_NE(reader, nullptr);
    LocalMemory previous = *LocalMemory::allocate(8);
    Transfer t;
    Status st = run(*reader, {Op::fetch_add(*handle->slice(0, 8), previous, 1)}, &t);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("not 8-byte aligned in its"), std::string::npos) << st.to_string();
    EXPECT_EQ(t.op_backend(0), tcp_only ? "tcp" : "memory");
    EXPECT_EQ(owner.value(0), 0u);
    EXPECT_EQ(owner.value(1), 0u);
    // Released: NotFound, as for reads.
    if (!tcp_only) {
      ASSERT_TRUE(owner.manager->release(*handle).ok());
      st = run(*reader, {Op::fetch_add(*handle->slice(8, 8), previous, 1)});
      EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
    }
  }
}

// What a raw peer's malformed atomic gets: the connection dropped, or a
// refusal; either way the word is unchanged and the owner serves on.
class HostileAtomics {
 public:
  explicit HostileAtomics(const RemoteBuffer& buffer)
      : buffer_(buffer), fd_(data_connection_to(buffer, Clock::now() + kTimeout)) {}
  bool connected() const { return fd_.valid(); }

  // Sends a header and `operand_bytes` of the two operands.
  bool send(tcp::RequestKind kind, uint64_t offset, uint64_t length, uint64_t first,
            uint64_t second, size_t operand_bytes = tcp::kAtomicOperandBytes) {
    tcp::RequestHeader h = request_on(buffer_, kind, ++id_, offset, length);
    uint8_t frame[sizeof h + tcp::kAtomicOperandBytes];
    std::memcpy(frame, &h, sizeof h);
    std::memcpy(frame + sizeof h, &first, 8);
    std::memcpy(frame + sizeof h + 8, &second, 8);
    return send_exact(fd_.get(), frame, sizeof h + operand_bytes, Clock::now() + kTimeout).ok();
  }
  // The next reply's status and payload; nullopt when the owner hung up.
  std::optional<std::pair<StatusCode, uint64_t>> reply() {
    tcp::ResponseHeader r{};
    if (!recv_exact(fd_.get(), &r, sizeof r, Clock::now() + kTimeout).ok()) return std::nullopt;
    uint64_t value = 0;
    if (r.payload == 8 && !recv_exact(fd_.get(), &value, 8, Clock::now() + kTimeout).ok()) {
      return std::nullopt;
    }
    return std::make_pair(static_cast<StatusCode>(r.status), value);
  }
  void close() { fd_.reset(); }

 private:
  RemoteBuffer buffer_;
  Fd fd_;
  uint64_t id_ = 0;
};

TEST(AtomicsTest, HostilePeersSendingMalformedAtomicsChangeNothingAndTheOwnerServesOn) {
  using tcp::RequestKind;
  Owner owner = Owner::make();
  ASSERT_NE(owner.manager, nullptr);
  owner.memory.data()[24] = std::byte{7};  // word 3 holds 7
  {  // An atomic on 16 bytes: a protocol error; the connection goes.
    HostileAtomics peer(owner.handle);
    ASSERT_TRUE(peer.connected());
    ASSERT_TRUE(peer.send(RequestKind::kFetchAdd, 24, 16, 1, 0));
    EXPECT_EQ(peer.reply(), std::nullopt);
  }
  {  // A fetch-add with a second operand: a protocol error.
    HostileAtomics peer(owner.handle);
    ASSERT_TRUE(peer.send(RequestKind::kFetchAdd, 24, 8, 1, 5));
    EXPECT_EQ(peer.reply(), std::nullopt);
  }
  {  // Misaligned, out of bounds, a forged region size: refused, and the
     // connection serves on; then a good one.
    HostileAtomics peer(owner.handle);
    ASSERT_TRUE(peer.send(RequestKind::kCompareAndSwap, 20, 8, 7, 1));
    EXPECT_EQ(peer.reply(),
              std::make_optional(std::make_pair(StatusCode::kInvalidArgument, uint64_t{0})));
    ASSERT_TRUE(peer.send(RequestKind::kFetchAdd, 4096, 8, 1, 0));
    EXPECT_EQ(peer.reply(),
              std::make_optional(std::make_pair(StatusCode::kInvalidArgument, uint64_t{0})));
    ASSERT_TRUE(peer.send(RequestKind::kFetchAdd, 24, 8, 1, 0));
    EXPECT_EQ(peer.reply(), std::make_optional(std::make_pair(StatusCode::kOk, uint64_t{7})));
  }
  {  // Operands cut short, then gone: nothing applied.
    HostileAtomics peer(owner.handle);
    ASSERT_TRUE(peer.send(RequestKind::kFetchAdd, 24, 8, 100, 0, 8));
    peer.close();
  }
  // The owner serves a genuine reader on, and the word holds 7 + 1.
  auto reader = make_manager();
  ASSERT_NE(reader, nullptr);
  LocalMemory previous = *LocalMemory::allocate(8);
  ASSERT_TRUE(run(*reader, {Op::fetch_add(owner.word(3), previous, 1)}).ok());
  EXPECT_EQ(word_at(previous), 8u);
  EXPECT_EQ(owner.value(3), 9u);
}

}  // namespace
}  // namespace rdmabuf::testing
