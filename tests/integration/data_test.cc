// Multi-process data tests: this process reads from and writes into
// buffers owned by real rdmabuf_test_peer processes, over real sockets, and
// both sides verify the bytes.
#include <atomic>
#include <random>
#include <thread>

#include "common/crc32c.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

class SizeTest : public ::testing::TestWithParam<uint64_t> {};

// Read the peer's buffer, write a new pattern into it; checksums on both
// sides and a byte-exact check where the data ends up.
TEST_P(SizeTest, ReadAndWriteVerifiedOnBothSides) {
  const uint64_t size = GetParam();
  auto peer = start_peer({{size, 7}});
  ASSERT_NE(peer, nullptr);
  auto reader = make_manager();
  ASSERT_NE(reader, nullptr);

  LocalMemory dst = allocate(size);
  Status s = reader->read_into(peer->handle(0), dst, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_mismatch(dst.span(), 7), std::nullopt);
  EXPECT_EQ(crc_line(dst.data(), size), peer->crc(0, 0, size));

  LocalMemory src = with_pattern(size, 8);
  s = reader->write_from(peer->handle(0), src, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer->check(0, 0, size, 8, 0), "ok");
  EXPECT_EQ(peer->crc(0, 0, size), crc_line(src.data(), size));
  expect_clean_exit(*peer);
}

std::string size_name(const ::testing::TestParamInfo<uint64_t>& info) {
  const uint64_t v = info.param;
  if (v >= (1 << 20)) return std::to_string(v >> 20) + "MiB";
  if (v >= (1 << 10)) return std::to_string(v >> 10) + "KiB";
  return std::to_string(v) + "B";
}

INSTANTIATE_TEST_SUITE_P(Sizes, SizeTest,
                         ::testing::Values(uint64_t{1}, uint64_t{4} << 10, uint64_t{1} << 20,
                                           uint64_t{64} << 20, uint64_t{256} << 20),
                         size_name);

TEST(DataTest, UnalignedOffsetsAndSlices) {
  constexpr uint64_t kSize = (1 << 20) + 13;
  auto peer = start_peer({{kSize, 9}});
  ASSERT_NE(peer, nullptr);
  auto reader = make_manager([](Config& c) { c.chunk_size = 64 << 10; });
  ASSERT_NE(reader, nullptr);
  LocalMemory model = with_pattern(kSize, 9);  // what the peer's buffer should hold

  struct Case {
    uint64_t remote_offset, local_offset, length;
  };
  const Case cases[] = {
      {1, 1, 1},           {3, 7, 4093},      {4095, 1, 4097},           {65535, 3, 65537},
      {100001, 5, 300007}, {kSize - 1, 0, 1}, {kSize - 70001, 9, 70001}, {0, 11, kSize}};
  uint64_t seed = 50;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.remote_offset) + "+" + std::to_string(c.length) + " local@" +
                 std::to_string(c.local_offset));
    LocalMemory dst = with_sentinel(c.local_offset + c.length + 5);
    Status s = reader->read_into(slice(peer->handle(0), c.remote_offset, c.length),
                                 slice(dst, c.local_offset, c.length), kTimeout);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(find_not(dst.span().subspan(0, c.local_offset), kSentinel), std::nullopt);
    EXPECT_EQ(std::memcmp(dst.data() + c.local_offset, model.data() + c.remote_offset, c.length),
              0);
    EXPECT_EQ(find_not(dst.span().subspan(c.local_offset + c.length), kSentinel), std::nullopt);

    ++seed;
    LocalMemory src =
        with_pattern(c.local_offset + c.length, seed, c.remote_offset - c.local_offset);
    s = reader->write_from(slice(peer->handle(0), c.remote_offset, c.length),
                           slice(src, c.local_offset, c.length), kTimeout);
    ASSERT_TRUE(s.ok()) << s.to_string();
    std::memcpy(model.data() + c.remote_offset, src.data() + c.local_offset, c.length);
    EXPECT_EQ(peer->check(0, c.remote_offset, c.length, seed, c.remote_offset), "ok");
    ASSERT_EQ(peer->crc(0, 0, kSize), crc_line(model.data(), kSize)) << "bytes outside moved";
  }
  // Slices of slices, through the text form.
  RemoteBuffer nested = slice(slice(peer->handle(0), 1000, 500000), 77, 123457);
  auto decoded = RemoteBuffer::from_text(nested.to_text());
  ASSERT_TRUE(decoded.ok());
  LocalMemory dst = allocate(123457);
  ASSERT_TRUE(reader->read_into(*decoded, dst, kTimeout).ok());
  EXPECT_EQ(std::memcmp(dst.data(), model.data() + 1077, 123457), 0);
  expect_clean_exit(*peer);
}

// 4 threads x 1000 ops against one peer, each thread in its own region,
// writes checked by reading them back; then the peer checks every region.
TEST(DataTest, ManyConcurrentOps) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 1000;
  constexpr uint64_t kRegion = 256 << 10;
  auto peer = start_peer({{kThreads * kRegion, 3}});
  ASSERT_NE(peer, nullptr);
  auto reader = make_manager([](Config& c) { c.tcp_streams = 3; });
  ASSERT_NE(reader, nullptr);
  std::vector<LocalMemory> models;
  for (int t = 0; t < kThreads; ++t)
    models.push_back(with_pattern(kRegion, 3, static_cast<uint64_t>(t) * kRegion));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      RemoteBuffer region = slice(peer->handle(0), static_cast<uint64_t>(t) * kRegion, kRegion);
      LocalMemory& model = models[static_cast<size_t>(t)];
      for (int i = 0; i < kOpsPerThread; i += 2) {
        const uint64_t len = 1 + rng() % 8192;
        const uint64_t off = rng() % (kRegion - len + 1);
        const uint64_t seed =
            10000 + static_cast<uint64_t>(t) * kOpsPerThread + static_cast<uint64_t>(i);
        LocalMemory src = with_pattern(len, seed);
        Status w = reader->write_from(slice(region, off, len), src, kTimeout);
        std::memcpy(model.data() + off, src.data(), len);
        // Read back a window around the write, in one batch with a read of
        // another random range.
        const uint64_t lo = off > 100 ? off - 100 : 0;
        const uint64_t hi = std::min(kRegion, off + len + 100);
        const uint64_t off2 = rng() % (kRegion - 64);
        LocalMemory back = allocate(hi - lo);
        LocalMemory back2 = allocate(64);
        std::vector<Op> ops;
        ops.push_back(Op::read(slice(region, lo, hi - lo), back));
        ops.push_back(Op::read(slice(region, off2, 64), back2));
        Transfer tr = reader->submit(std::move(ops), kTimeout);
        Status r = tr.wait();
        bool ok = w.ok() && r.ok() && std::memcmp(back.data(), model.data() + lo, hi - lo) == 0 &&
                  std::memcmp(back2.data(), model.data() + off2, 64) == 0;
        if (!ok) {
          failures.fetch_add(1);
          ADD_FAILURE() << "thread " << t << " op " << i << ": " << w.to_string() << " / "
                        << r.to_string();
          return;
        }
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(peer->crc(0, static_cast<uint64_t>(t) * kRegion, kRegion),
              crc_line(models[static_cast<size_t>(t)].data(), kRegion))
        << "region " << t;
  }
  expect_clean_exit(*peer);
}

// 8 peer processes at once: one batch across all of them, then a thread per
// peer hammering it.
TEST(DataTest, ManyPeers) {
  constexpr int kPeers = 8;
  constexpr uint64_t kSize = 2 << 20;
  std::vector<std::unique_ptr<TestPeer>> peers;
  for (int p = 0; p < kPeers; ++p) {
    peers.push_back(start_peer({{kSize, 1000 + static_cast<uint64_t>(p)}}));
    ASSERT_NE(peers.back(), nullptr);
  }
  auto reader = make_manager();
  ASSERT_NE(reader, nullptr);

  std::vector<LocalMemory> reads, writes;
  std::vector<Op> ops;
  for (int p = 0; p < kPeers; ++p) {
    reads.push_back(allocate(kSize / 2));
    ops.push_back(Op::read(slice(peers[p]->handle(0), 0, kSize / 2), reads.back()));
    writes.push_back(with_pattern(kSize / 2, 2000 + static_cast<uint64_t>(p), kSize / 2));
    ops.push_back(Op::write(slice(peers[p]->handle(0), kSize / 2, kSize / 2), writes.back()));
  }
  Transfer t = reader->submit(std::move(ops), kTimeout);
  ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
  for (int p = 0; p < kPeers; ++p) {
    EXPECT_EQ(find_mismatch(reads[p].span(), 1000 + static_cast<uint64_t>(p)), std::nullopt) << p;
    EXPECT_EQ(peers[p]->check(0, 0, kSize / 2, 1000 + static_cast<uint64_t>(p), 0), "ok") << p;
    EXPECT_EQ(peers[p]->check(0, kSize / 2, kSize / 2, 2000 + static_cast<uint64_t>(p), kSize / 2),
              "ok")
        << p;
  }

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kPeers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < 40; ++i) {
        const uint64_t off = static_cast<uint64_t>(i) * 4099;
        const uint64_t len = 1 + static_cast<uint64_t>(i) * 1000;
        LocalMemory dst = allocate(len);
        Status s = reader->read_into(slice(peers[p]->handle(0), off, len), dst, kTimeout);
        if (!s.ok() || find_mismatch(dst.span(), 1000 + static_cast<uint64_t>(p), off)) {
          failures.fetch_add(1);
          ADD_FAILURE() << "peer " << p << " read " << i << ": " << s.to_string();
          return;
        }
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(failures.load(), 0);
  for (auto& peer : peers)
    expect_clean_exit(*peer);
}

}  // namespace
}  // namespace rdmabuf::testing
