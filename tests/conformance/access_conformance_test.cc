// The conformance suite, access part: what a handle lets a peer reach, and
// when it stops reaching it. Every op is checked on its own, whatever batch
// it rides in; and a released buffer's memory goes only once no backend can
// touch it (fixture.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/conformance/fixture.h"
#include "tests/helpers/forge.h"

namespace rdmabuf::conformance {
namespace {

using namespace std::chrono_literals;
using testing::count_pattern_words;
using testing::fill_pattern;
using testing::find_mismatch;
using testing::find_not;

// The owner's allocation: `kRegistered` bytes it registers, followed by as
// many it never registers (a secret a forged handle must not reach).
constexpr size_t kRegistered = 4096;
constexpr uint64_t kRegisteredSeed = 41;
constexpr uint64_t kSecretSeed = 42;

struct HalfRegistered {
  LocalMemory whole;  // 2 * kRegistered bytes
  RemoteBuffer handle;
};

// The handles a forger makes from a genuine one, and what the owner says.
struct Forgery {
  const char* what;
  RemoteBuffer handle;
  StatusCode code;
};

std::vector<Forgery> forgeries_of(const RemoteBuffer& genuine) {
  auto token = testing::with_altered_token(genuine, 3, 0x40);
  auto bigger = testing::with_view(genuine, 2 * kRegistered, 0, kRegistered);
  auto past_end = testing::with_view(genuine, 2 * kRegistered, kRegistered, kRegistered);
  EXPECT_TRUE(token.ok() && bigger.ok() && past_end.ok());
  if (!token.ok() || !bigger.ok() || !past_end.ok()) return {};
  return {
      {"an altered token", *token, StatusCode::kPermissionDenied},
      {"an altered size", *bigger, StatusCode::kInvalidArgument},
      {"a range past the end", *past_end, StatusCode::kInvalidArgument},
  };
}

class AccessTest : public ConformanceTest {
 protected:
  HalfRegistered own_half() {
    HalfRegistered h;
    h.whole = allocate(2 * kRegistered);
    fill_pattern(h.whole.span().subspan(0, kRegistered), kRegisteredSeed);
    fill_pattern(h.whole.span().subspan(kRegistered), kSecretSeed);
    auto registered = owner_->register_buffer(slice(h.whole, 0, kRegistered));
    EXPECT_TRUE(registered.ok()) << registered.status().to_string();
    if (registered.ok()) h.handle = *registered;
    return h;
  }

  // The secret half is as it was, and no byte of it is in `read`.
  void expect_secret_kept(const HalfRegistered& h, std::span<const std::byte> read) {
    std::vector<std::byte> now = snapshot(h.whole);
    EXPECT_EQ(find_mismatch(std::span(now).subspan(kRegistered), kSecretSeed), std::nullopt)
        << "a write landed in memory the owner never registered";
    EXPECT_EQ(count_pattern_words(read, kSecretSeed), 0u)
        << "a read brought back memory the owner never registered";
  }
};

// A forged op rides in one batch with genuine ops on the same buffer, before,
// between and after them: it fails with the owner's reason, the genuine ops
// succeed, and not one byte the owner did not register is read or written.
TEST_P(AccessTest, AForgedOpBesideGenuineOnesMovesNothing) {
  HalfRegistered h = own_half();
  for (const Forgery& forged : forgeries_of(h.handle)) {
    SCOPED_TRACE(forged.what);
    // Reads: genuine, forged, genuine, in one batch.
    LocalMemory before = with_sentinel(kRegistered);
    LocalMemory stolen = with_sentinel(kRegistered);
    LocalMemory after = with_sentinel(kRegistered);
    std::vector<Op> reads;
    reads.push_back(Op::read(h.handle, before));
    reads.push_back(Op::read(forged.handle, stolen));
    reads.push_back(Op::read(h.handle, after));
    Transfer t = reader_->submit(std::move(reads), kTimeout);
    t.wait().ignore();
    EXPECT_TRUE(t.op_status(0).ok()) << t.op_status(0).to_string();
    EXPECT_EQ(t.op_status(1).code(), forged.code) << t.op_status(1).to_string();
    EXPECT_TRUE(t.op_status(2).ok()) << t.op_status(2).to_string();
    EXPECT_EQ(find_mismatch(before.span(), kRegisteredSeed), std::nullopt);
    EXPECT_EQ(find_mismatch(after.span(), kRegisteredSeed), std::nullopt);
    EXPECT_EQ(find_not(stolen.span(), kSentinel), std::nullopt) << "a refused read landed";
    expect_secret_kept(h, stolen.span());

    // Writes: the forged one first and last, genuine ones between; the
    // genuine writes carry the registered pattern back (the owner's memory
    // stays as it was unless a forged write lands).
    LocalMemory genuine = with_pattern(kRegistered, kRegisteredSeed);
    LocalMemory hostile = with_pattern(kRegistered, 99);
    std::vector<Op> writes;
    writes.push_back(Op::write(forged.handle, hostile));
    writes.push_back(Op::write(h.handle, genuine));
    writes.push_back(Op::write(forged.handle, hostile));
    writes.push_back(Op::write(h.handle, genuine));
    t = reader_->submit(std::move(writes), kTimeout);
    t.wait().ignore();
    EXPECT_EQ(t.op_status(0).code(), forged.code) << t.op_status(0).to_string();
    EXPECT_TRUE(t.op_status(1).ok()) << t.op_status(1).to_string();
    EXPECT_EQ(t.op_status(2).code(), forged.code) << t.op_status(2).to_string();
    EXPECT_TRUE(t.op_status(3).ok()) << t.op_status(3).to_string();
    std::vector<std::byte> now = snapshot(h.whole);
    EXPECT_EQ(find_mismatch(std::span(now).subspan(0, kRegistered), kRegisteredSeed), std::nullopt)
        << "a refused write landed";
    EXPECT_EQ(count_pattern_words(now, 99), 0u) << "a refused write landed";
    expect_secret_kept(h, {});
  }
}

// Memory whose keepalive, as the library drops it, tries the buffer through
// the reader: by then every backend must have stopped serving it, so the
// read and the write fail and move nothing.
struct Probe {
  Manager* reader = nullptr;
  RemoteBuffer handle;
  std::atomic<bool> ran{false};
  Status read, write;
  bool read_landed = false;
};

LocalMemory probing_memory(size_t size, uint64_t seed, std::shared_ptr<Probe> probe) {
  auto* bytes = static_cast<std::byte*>(std::aligned_alloc(4096, size));
  fill_pattern(std::span(bytes, size), seed);
  std::shared_ptr<const void> keepalive(bytes, [probe, size](const std::byte* p) {
    // Runs as the library lets go of the memory: nothing may reach it now.
    LocalMemory into = testing::filled_of(MemoryKind::kHost, size, kSentinel);
    probe->read = probe->reader->read_into(probe->handle, into, 5s);
    probe->read_landed = find_not(into.span(), kSentinel).has_value();
    LocalMemory from = testing::with_pattern_of(MemoryKind::kHost, size, 77);
    probe->write = probe->reader->write_from(probe->handle, from, 5s);
    probe->ran.store(true);
    std::free(const_cast<std::byte*>(p));
  });
  return LocalMemory(bytes, size, std::move(keepalive));
}

void expect_unreachable(const Probe& probe, const char* when) {
  SCOPED_TRACE(when);
  ASSERT_TRUE(probe.ran.load()) << "the keepalive was not dropped";
  EXPECT_FALSE(probe.read.ok()) << "a read was served from memory being freed";
  EXPECT_FALSE(probe.read_landed) << "bytes came back from memory being freed";
  EXPECT_FALSE(probe.write.ok()) << "a write was served into memory being freed";
}

TEST_P(AccessTest, ReleaseLetsTheMemoryGoOnlyOnceNoBackendServesIt) {
  constexpr size_t kSize = 4096;
  auto probe = std::make_shared<Probe>();
  probe->reader = reader_.get();
  auto handle = owner_->register_buffer(probing_memory(kSize, 51, probe));
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  probe->handle = *handle;
  // Served before the release, over this backend.
  LocalMemory warm = allocate(kSize);
  ASSERT_TRUE(reader_->read_into(*handle, warm, kTimeout).ok());
  EXPECT_EQ(find_mismatch(warm.span(), 51), std::nullopt);

  ASSERT_TRUE(owner_->release(*handle).ok());
  expect_unreachable(*probe, "release()");
  EXPECT_EQ(probe->read.code(), StatusCode::kNotFound) << probe->read.to_string();
  EXPECT_EQ(probe->write.code(), StatusCode::kNotFound) << probe->write.to_string();
}

TEST_P(AccessTest, ShutdownLetsTheMemoryGoOnlyOnceNoBackendServesIt) {
  constexpr size_t kSize = 4096;
  auto probe = std::make_shared<Probe>();
  probe->reader = reader_.get();
  auto handle = owner_->register_buffer(probing_memory(kSize, 52, probe));
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  probe->handle = *handle;
  LocalMemory warm = allocate(kSize);
  ASSERT_TRUE(reader_->read_into(*handle, warm, kTimeout).ok());
  owner_->shutdown();
  expect_unreachable(*probe, "shutdown()");
}

INSTANTIATE_TEST_SUITE_P(Backends, AccessTest, ::testing::ValuesIn(backends_under_test()),
                         backend_name);

}  // namespace
}  // namespace rdmabuf::conformance
