// Registrations of readers' memory over ibverbs (backends/ibverbs/device.h,
// LocalRegistrations): memory with a keepalive, and memory without one in a
// range given to remember_memory(), is registered once for many ops; other
// memory is registered per op; and memory that is unmapped and mapped again
// at the same address (new pages, other contents) is read into correctly
// whichever way it was identified, because a registration made for the old
// pages is never used for the new ones.
//
// Needs an RDMA device (scripts/softroce-vm runs it, as part of the ctest
// test ibverbs_in_softroce_vm); skipped with the reason elsewhere.
#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>

#include "tests/helpers/backend_detail.h"
#include "tests/helpers/sanitizer.h"
#include "tests/integration/ibverbs_pair.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

constexpr uint64_t kSize = 64 << 10;
constexpr std::byte kJunk{0xEE};

class IbverbsRegistrationTest : public IbverbsPairTest {
 protected:
  void SetUp() override { set_up(with_pattern(kSize, 51)); }

  uint64_t made() const {
    return std::stoull(backend_detail(*reader_, "ibverbs", "local registrations made"));
  }
  uint64_t reused() const {
    return std::stoull(backend_detail(*reader_, "ibverbs", "local registrations reused"));
  }

  // Reads the owner's buffer into `dst` and checks that it holds `seed`'s
  // pattern afterwards.
  void read_and_check(const LocalMemory& dst, uint64_t seed) {
    Transfer t = reader_->submit({Op::read(remote_, dst)}, kTimeout);
    Status s = t.wait();
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(t.op_backend(0), "ibverbs");
    ScopedIgnoreReads quiet;  // written by the NIC
    EXPECT_EQ(find_mismatch(std::span(dst.data(), kSize), seed), std::nullopt);
  }

  // Reads into `dst` three times, each checked; the registrations made.
  uint64_t registrations_for_three_reads(const LocalMemory& dst) {
    const uint64_t before = made();
    for (int i = 0; i < 3; ++i)
      read_and_check(dst, 51);
    return made() - before;
  }

  // Overwrites the owner's buffer with `seed`'s pattern (from memory with a
  // keepalive, which the cases below do not count on).
  void change_remote(uint64_t seed) {
    LocalMemory src = with_pattern(kSize, seed);
    Status s = reader_->submit({Op::write(remote_, src)}, kTimeout).wait();
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
};

// Anonymous memory, unmapped by the destructor.
struct Mapping {
  explicit Mapping(size_t bytes, void* at = nullptr) : size(bytes) {
    void* p = ::mmap(at, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
    if (data) std::memset(data, static_cast<int>(kJunk), bytes);
  }
  ~Mapping() { unmap(); }
  void unmap() {
    if (data) ::munmap(data, size);
    data = nullptr;
  }
  std::byte* data = nullptr;
  size_t size = 0;
};

TEST_F(IbverbsRegistrationTest, RememberedMemoryIsRegisteredOnceForAllOpsOnIt) {
  Mapping arena(4 * kSize);
  ASSERT_NE(arena.data, nullptr);
  ASSERT_TRUE(remember_memory(arena.data, arena.size).ok());
  const uint64_t made_before = made(), reused_before = reused();
  for (size_t i = 0; i < 12; ++i) {
    const size_t at = (i % 4) * (kSize / 2) + (i % 3);  // overlapping, unaligned
    read_and_check(LocalMemory(arena.data + at, kSize), 51);
  }
  EXPECT_EQ(made() - made_before, 1u) << "one registration of the whole remembered range";
  EXPECT_EQ(reused() - reused_before, 11u);

  // Forgotten: registered per op again.
  EXPECT_EQ(forget_memory(arena.data, arena.size), 1u);
  EXPECT_EQ(registrations_for_three_reads(LocalMemory(arena.data, kSize)), 3u);
}

TEST_F(IbverbsRegistrationTest, MemoryWithoutAKeepaliveOrARangeIsRegisteredPerOp) {
  Mapping plain(kSize);
  ASSERT_NE(plain.data, nullptr);
  EXPECT_EQ(registrations_for_three_reads(LocalMemory(plain.data, kSize)), 3u);
}

TEST_F(IbverbsRegistrationTest, MemoryWithAKeepaliveIsRegisteredOnceWhileItLives) {
  Mapping mapped(kSize);
  ASSERT_NE(mapped.data, nullptr);
  // An identity that owns nothing, as the Python package gives each storage.
  auto token = std::make_shared<const int>(0);
  EXPECT_EQ(registrations_for_three_reads(LocalMemory(mapped.data, kSize, token)), 1u);
}

// The case a registration cache must not get wrong: the reader's memory is
// read into, unmapped, and mapped again at the same address with other
// pages; a read into the new mapping must land there (a stale registration
// would put the bytes into the old pages, and leave the junk in sight).
TEST_F(IbverbsRegistrationTest, MemoryMappedAgainAtTheSameAddressIsReadCorrectly) {
  enum class Identity { kNone, kRemembered, kKeepalive };
  uint64_t seed = 51;
  for (Identity identity : {Identity::kNone, Identity::kRemembered, Identity::kKeepalive}) {
    SCOPED_TRACE(static_cast<int>(identity));
    auto first = std::make_unique<Mapping>(kSize);
    ASSERT_NE(first->data, nullptr);
    std::byte* const at = first->data;
    auto token = std::make_shared<const int>(1);
    auto memory_at = [&](std::byte* p) {
      return identity == Identity::kKeepalive ? LocalMemory(p, kSize, token)
                                              : LocalMemory(p, kSize);
    };
    const bool remembered = identity == Identity::kRemembered;
    if (remembered) {
      ASSERT_TRUE(remember_memory(at, kSize).ok());
    }
    read_and_check(memory_at(at), seed);

    // The memory goes, the way each kind of caller lets it go.
    if (remembered) {
      EXPECT_EQ(forget_memory(at, kSize), 1u);
    }
    token = std::make_shared<const int>(2);  // the old storage's identity dies with it
    first->unmap();
    Mapping second(kSize, at);
    ASSERT_EQ(second.data, at) << "could not map the same address again: " << std::strerror(errno);
    if (remembered) {
      ASSERT_TRUE(remember_memory(at, kSize).ok());
    }

    change_remote(++seed);
    read_and_check(memory_at(at), seed);
    if (remembered) {
      EXPECT_EQ(forget_memory(at, kSize), 1u);
    }
  }
}

}  // namespace
}  // namespace rdmabuf::testing
