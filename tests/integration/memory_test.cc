// Same-host transfers against real owner processes: releases racing copies
// (for the memory backend, where no thread of the owner takes part, and for
// tcp), and the fallback to TCP, with its reason, where the kernel refuses
// cross-memory attach.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/crc32c.h"
#include "tests/helpers/backend_detail.h"
#include "tests/helpers/process.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

// True (with the reason in *why) when this process reaches `peer`'s buffer
// 0 over `backend`; the route is checked with one real read.
bool routes_over(Manager& reader, TestPeer& peer, const std::string& backend, std::string* why) {
  LocalMemory probe = allocate(1);
  Transfer t = reader.submit({Op::read(slice(peer.handle(0), 0, 1), probe)}, kTimeout);
  Status st = t.wait();
  if (!st.ok()) {
    *why = st.to_string();
    return false;
  }
  if (t.op_backend(0) != backend) {
    *why = "ops go over " + std::string(t.op_backend(0)) + ": " + t.op_note(0);
    return false;
  }
  return true;
}

// One reader/writer thread's view of its ops around a release.
struct Outcome {
  Clock::time_point started;
  StatusCode code;
};

// Each test runs over the memory transport twice, with the owner's buffers
// in memory from LocalMemory::allocate (a shared file: readers map it) and
// in private memory (copied through the kernel), and over tcp.
class ReleaseRaceTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string backend() const {
    return GetParam() == "memory_private_host" ? "memory" : GetParam();
  }
  // The environment of the owner process.
  std::vector<std::string> peer_env() const {
    if (GetParam() == "memory_private_host") return {"RDMABUF_TEST_PRIVATE_HOST=1"};
    return {};
  }

  // An owner process and a reader in this one, whose ops reach it over
  // backend() (else the test is skipped, saying why).
  void SetUp() override {
    peer_ = start_peer({{4096, 1}}, peer_env());
    ASSERT_NE(peer_, nullptr);
    reader_ = make_manager([&](Config& c) { c.backends = {backend()}; });
    ASSERT_NE(reader_, nullptr);
    std::string why;
    if (!routes_over(*reader_, *peer_, backend(), &why)) GTEST_SKIP() << why;
  }

  std::unique_ptr<TestPeer> peer_;
  std::unique_ptr<Manager> reader_;
};

// Waits (up to kTimeout) until `outcomes` (under `mu`) holds an op that
// started after `released`: ops under way at the release may take long on
// a loaded machine, and the test needs one that started after it.
void await_an_op_started_after(Clock::time_point released, std::mutex& mu,
                               const std::vector<Outcome>& outcomes) {
  for (auto until = Clock::now() + kTimeout; Clock::now() < until;) {
    {
      std::lock_guard lock(mu);
      if (std::any_of(outcomes.begin(), outcomes.end(),
                      [&](const Outcome& o) { return o.started > released; })) {
        return;
      }
    }
    std::this_thread::sleep_for(1ms);
  }
}

// Writers hammer a buffer while its owner releases it. Once release() has
// returned in the owner, the buffer's bytes never change again (the owner
// checks, from the moment release() returns), and every op that starts
// after that fails with NotFound. Every write carries a stamp of its own,
// so a write that lands late cannot go unnoticed by repeating old bytes.
TEST_P(ReleaseRaceTest, WritesNeverLandAfterReleaseReturned) {
  constexpr uint64_t kSize = 4 << 20;
  constexpr uint64_t kPart = 1 << 20;  // one writer's range: a large op
  auto& peer = peer_;
  auto& reader = reader_;

  std::atomic<uint64_t> stamp{1};
  for (int round = 0; round < 16; ++round) {
    int index = peer->register_buffer(kSize, 500 + static_cast<uint64_t>(round));
    ASSERT_GE(index, 0);
    const RemoteBuffer handle = peer->handle(static_cast<size_t>(index));
    std::atomic<bool> stop{false};
    std::atomic<int> landed{0};
    std::mutex mu;
    std::vector<Outcome> outcomes;
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
          Status st = reader->write_from(remote, src, kTimeout);
          if (st.ok()) landed++;
          std::lock_guard lock(mu);
          outcomes.push_back({started, st.code()});
        }
      });
    }
    // Release mid-stream: once writes are landing (slow builds take longer).
    for (auto until = Clock::now() + kTimeout; landed.load() < 3 && Clock::now() < until;) {
      std::this_thread::sleep_for(1ms);
    }
    std::string watched = peer->command("release-watch " + std::to_string(index) + " 50");
    const auto released = Clock::now();  // the owner's release() had returned by now
    std::this_thread::sleep_for(20ms);   // writes that start now must be refused
    await_an_op_started_after(released, mu, outcomes);
    stop = true;
    for (auto& t : writers)
      t.join();
    EXPECT_EQ(watched, "stable") << "round " << round
                                 << ": bytes landed in the buffer after release() returned";
    int ok = 0, refused_after = 0;
    for (const Outcome& o : outcomes) {
      ok += o.code == StatusCode::kOk;
      if (o.started > released) {
        EXPECT_EQ(o.code, StatusCode::kNotFound) << "round " << round;
        ++refused_after;
      } else {
        EXPECT_TRUE(o.code == StatusCode::kOk || o.code == StatusCode::kNotFound)
            << "round " << round << ": " << status_code_name(o.code);
      }
    }
    EXPECT_GT(ok, 0) << "round " << round << ": no write landed before the release";
    EXPECT_GT(refused_after, 0) << "round " << round << ": no write tried after the release";
  }
  expect_clean_exit(*peer);
}

// Readers hammer a buffer while its owner releases it: reads that start
// after release() returned fail with NotFound; none returns stale bytes.
TEST_P(ReleaseRaceTest, ReadsAfterReleaseReturnedAreNotFound) {
  constexpr uint64_t kSize = 256 << 10;
  auto& peer = peer_;
  auto& reader = reader_;

  for (int round = 0; round < 8; ++round) {
    const uint64_t seed = 700 + static_cast<uint64_t>(round);
    int index = peer->register_buffer(kSize, seed);
    ASSERT_GE(index, 0);
    const RemoteBuffer handle = peer->handle(static_cast<size_t>(index));
    std::atomic<bool> stop{false};
    std::atomic<int> served{0};
    std::mutex mu;
    std::vector<Outcome> outcomes;
    std::vector<std::thread> readers;
    for (int r = 0; r < 3; ++r) {
      readers.emplace_back([&] {
        LocalMemory dst = allocate(kSize);
        while (!stop.load()) {
          auto started = Clock::now();
          Status st = reader->read_into(handle, dst, kTimeout);
          if (st.ok()) {
            served++;
            EXPECT_EQ(find_mismatch(dst.span(), seed), std::nullopt);
          }
          std::lock_guard lock(mu);
          outcomes.push_back({started, st.code()});
        }
      });
    }
    for (auto until = Clock::now() + kTimeout; served.load() < 3 && Clock::now() < until;) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(peer->release(static_cast<size_t>(index)), "ok");
    const auto released = Clock::now();
    std::this_thread::sleep_for(40ms);
    await_an_op_started_after(released, mu, outcomes);
    stop = true;
    for (auto& t : readers)
      t.join();
    int refused_after = 0;
    for (const Outcome& o : outcomes) {
      if (o.started > released) {
        EXPECT_EQ(o.code, StatusCode::kNotFound) << "round " << round;
        ++refused_after;
      }
    }
    EXPECT_GT(refused_after, 0) << "round " << round;
  }
  expect_clean_exit(*peer);
}

// Readers and writers in processes of their own, each repeating its op
// until one fails, while the owner releases the buffer: once release() has
// returned the buffer's bytes never change, and every process's stream
// ends in NotFound.
TEST_P(ReleaseRaceTest, ReleaseAmidReadersAndWritersInOtherProcesses) {
  constexpr uint64_t kHalf = 1 << 20;
  auto& peer = peer_;

  for (int round = 0; round < 3; ++round) {
    int index = peer->register_buffer(2 * kHalf, 900 + static_cast<uint64_t>(round));
    ASSERT_GE(index, 0);
    const std::string text = peer->handle_text(static_cast<size_t>(index));
    // Large and small ops, reads and writes (writers fill with their byte),
    // each on bytes of its own: overlapping ops from several peers leave
    // the bytes undefined, and over tcp the owner's threads would race on
    // them (ThreadSanitizer says so).
    auto at = [](uint64_t offset) { return std::to_string(offset); };
    const std::vector<std::vector<std::string>> roles = {
        {"--write", "a1", "--wait", "--loop", "--offset", at(0), text, at(kHalf)},
        {"--write", "b2", "--wait", "--loop", "--offset", at(kHalf), text, "4096"},
        {"--wait", "--loop", "--offset", at(kHalf + 8192), text, at(kHalf - 8192)},
        {"--wait", "--loop", "--offset", at(kHalf + 4096), text, "64"},
    };
    std::vector<std::unique_ptr<Subprocess>> children;
    for (const auto& args : roles) {
      std::string error;
      auto child =
          Subprocess::spawn(RDMABUF_TEST_READER, args, {"RDMABUF_BACKENDS=" + backend()}, &error);
      ASSERT_NE(child, nullptr) << error;
      ASSERT_EQ(child->read_line(60s).value_or("(nothing)"), "ready");
      children.push_back(std::move(child));
    }
    for (auto& child : children)
      ASSERT_TRUE(child->write_line("go"));
    std::this_thread::sleep_for(100ms);  // the streams are under way
    EXPECT_EQ(peer->command("release-watch " + std::to_string(index) + " 100"), "stable")
        << "round " << round << ": bytes landed in the buffer after release() returned";
    for (size_t c = 0; c < children.size(); ++c) {
      auto status = children[c]->read_line(60s).value_or("(nothing)");
      auto backend_line = children[c]->read_line(10s).value_or("(nothing)");
      EXPECT_TRUE(status.starts_with("status NotFound"))
          << "round " << round << ", process " << c << ": " << status;
      EXPECT_EQ(backend_line, "backend " + backend()) << "round " << round << ", process " << c;
      children[c]->wait(10s);
    }
  }
  expect_clean_exit(*peer);
}

std::string param_name(const ::testing::TestParamInfo<std::string>& param) {
  return param.param;
}

INSTANTIATE_TEST_SUITE_P(Backends, ReleaseRaceTest,
                         ::testing::Values(std::string("memory"),
                                           std::string("memory_private_host"), std::string("tcp")),
                         param_name);

// Two managers in this process, an owner and a reader, over memory only.
class MemoryMappingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_ = make_manager([](Config& c) { c.backends = {"memory"}; });
    reader_ = make_manager([](Config& c) { c.backends = {"memory"}; });
    ASSERT_NE(owner_, nullptr);
    ASSERT_NE(reader_, nullptr);
    if (backend_detail(*reader_, "memory", "owner files mapped").starts_with("<")) {
      GTEST_SKIP() << "the memory backend is not viable here";
    }
  }

  std::unique_ptr<Manager> owner_;
  std::unique_ptr<Manager> reader_;
};

// A reader maps a buffer in a shared file once; the same pages released and
// registered again (an endpoint's receive buffers, a pool) take the mapping
// back; private memory is never mapped.
TEST_F(MemoryMappingTest, MemoryRegisteredAgainReusesTheReadersMapping) {
  auto& owner = owner_;
  auto& reader = reader_;
  auto counts = [&] {
    return backend_detail(*reader, "memory", "owner files mapped") + " mapped, " +
           backend_detail(*reader, "memory", "owner file mappings reused") + " reused";
  };
  LocalMemory shared = with_pattern(1 << 20, 41);
  LocalMemory dst = allocate(1 << 20);
  for (int round = 0; round < 5; ++round) {
    auto handle = owner->register_buffer(shared);
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    ASSERT_TRUE(reader->read_into(*handle, dst, kTimeout).ok());
    EXPECT_EQ(find_mismatch(dst.span(), 41), std::nullopt);
    ASSERT_TRUE(owner->release(*handle).ok());
  }
  EXPECT_EQ(counts(), "1 mapped, 4 reused");

  LocalMemory private_memory = LocalMemory::allocate_private(1 << 20).value();
  fill_pattern(private_memory.span(), 42);
  auto handle = owner->register_buffer(private_memory);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(reader->read_into(*handle, dst, kTimeout).ok());
  EXPECT_EQ(find_mismatch(dst.span(), 42), std::nullopt);
  EXPECT_EQ(counts(), "1 mapped, 4 reused") << "private memory is copied through the kernel";
}

// A buffer in a file the reader cannot map (sealed against writes through
// new mappings) is copied through the kernel: reads and writes work.
TEST_F(MemoryMappingTest, AFileTheReaderCannotMapIsCopiedThroughTheKernel) {
  constexpr size_t kSize = 256 << 10;
  auto& owner = owner_;
  auto& reader = reader_;
  const int fd = ::memfd_create("unmappable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kSize), 0);
  void* at = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(at, MAP_FAILED);
  std::shared_ptr<const void> mapping(at,
                                      [](const void* p) { ::munmap(const_cast<void*>(p), kSize); });
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0) {
    ::close(fd);
    GTEST_SKIP() << "F_SEAL_FUTURE_WRITE: " << std::strerror(errno);
  }
  LocalMemory memory(at, kSize, mapping);
  fill_pattern(memory.span(), 43);
  auto handle = owner->register_buffer(memory);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  LocalMemory dst = allocate(kSize);
  ASSERT_TRUE(reader->read_into(*handle, dst, kTimeout).ok());
  EXPECT_EQ(find_mismatch(dst.span(), 43), std::nullopt);
  LocalMemory src = with_pattern(kSize, 44);
  ASSERT_TRUE(reader->write_from(*handle, src, kTimeout).ok());
  EXPECT_EQ(find_mismatch(memory.span(), 44), std::nullopt);
  EXPECT_EQ(backend_detail(*reader, "memory", "owner files mapped"), "0");
  ASSERT_TRUE(owner->release(*handle).ok());
  ::close(fd);
}

// What rdmabuf_test_reader printed.
struct ReaderReport {
  std::string status, backend, note, crc;
};

ReaderReport run_reader(const std::string& handle_text, uint64_t length,
                        std::vector<std::string> env, const std::string& wrapper = {}) {
  ReaderReport report;
  std::string error;
  std::string path = RDMABUF_TEST_READER;
  std::vector<std::string> args = {handle_text, std::to_string(length)};
  if (!wrapper.empty()) {  // e.g. run the reader under unshare(1)
    args.insert(args.begin(), path);
    args.insert(args.begin(), "--fork");
    args.insert(args.begin(), "--pid");
    path = wrapper;
  }
  auto child = Subprocess::spawn(path, args, env, &error);
  if (!child) {
    ADD_FAILURE() << error;
    return report;
  }
  for (std::string* field : {&report.status, &report.backend, &report.note, &report.crc}) {
    auto line = child->read_line(60s);
    if (!line) break;
    size_t space = line->find(' ');
    *field = space == std::string::npos ? "" : line->substr(space + 1);
  }
  child->wait(10s);
  return report;
}

std::string expected_crc(uint64_t size, uint64_t seed) {
  LocalMemory m = with_pattern(size, seed);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc32c(m.data(), size));
  return buf;
}

// An owner that other processes may not attach to (another user as root;
// a non-dumpable owner otherwise): the read goes over tcp, and says why.
TEST(MemoryFallbackTest, RefusedAttachFallsBackToTcpWithTheReason) {
  constexpr uint64_t kSize = 64 << 10;
  const bool root = geteuid() == 0;
  std::vector<std::string> peer_env;
  if (!root) peer_env.push_back("RDMABUF_TEST_NONDUMPABLE=1");
  auto peer = start_peer({{kSize, 81}}, peer_env);
  ASSERT_NE(peer, nullptr);

  // The control: a reader with the same credentials, and an owner that allows it.
  auto open_peer = start_peer({{kSize, 82}});
  ASSERT_NE(open_peer, nullptr);
  ReaderReport control = run_reader(open_peer->handle_text(0), kSize, {});
  ASSERT_EQ(control.status, "OK");
  if (control.backend != "memory") {
    GTEST_SKIP() << "the memory backend cannot reach even an open owner here: " << control.note;
  }
  EXPECT_EQ(control.note, "");
  EXPECT_EQ(control.crc, expected_crc(kSize, 82));

  std::vector<std::string> reader_env;
  if (root) reader_env.push_back("RDMABUF_TEST_UID=65534");  // nobody
  ReaderReport refused = run_reader(peer->handle_text(0), kSize, reader_env);
  EXPECT_EQ(refused.status, "OK");
  EXPECT_EQ(refused.backend, "tcp");
  EXPECT_NE(refused.note.find("memory: "), std::string::npos)
      << "the reason for not using the memory backend is recorded: " << refused.note;
  EXPECT_EQ(refused.crc, expected_crc(kSize, 81)) << "the bytes came over tcp";
  expect_clean_exit(*peer);
  expect_clean_exit(*open_peer);
}

// A reader in another PID namespace (another container, as far as pids go)
// cannot address the owner by pid: it uses tcp and records why.
TEST(MemoryFallbackTest, AnotherPidNamespaceFallsBackToTcp) {
  constexpr uint64_t kSize = 16 << 10;
  if (geteuid() != 0) GTEST_SKIP() << "creating a PID namespace needs root here";
  if (::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "unshare(1) is not installed";
  auto peer = start_peer({{kSize, 83}});
  ASSERT_NE(peer, nullptr);
  ReaderReport report = run_reader(peer->handle_text(0), kSize, {}, "/usr/bin/unshare");
  if (report.status.empty()) GTEST_SKIP() << "unshare --pid failed here";
  EXPECT_EQ(report.status, "OK");
  EXPECT_EQ(report.backend, "tcp");
  EXPECT_NE(report.note.find("PID namespace"), std::string::npos) << report.note;
  EXPECT_EQ(report.crc, expected_crc(kSize, 83));
  expect_clean_exit(*peer);
}

}  // namespace
}  // namespace rdmabuf::testing
