// Hostile peers that send the tcp owner malformed scattered requests (kinds
// 5 and 6 of backends/tcp/protocol.h): a broken list drops the connection,
// a range out of bounds is refused with its payload discarded, and either
// way the buffer is unchanged and the owner serves on.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <vector>

#include "backends/tcp/protocol.h"
#include "common/socket.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/raw_tcp.h"
#include "tests/helpers/sanitizer.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

constexpr size_t kSize = 64 << 10;
constexpr uint64_t kSeed = 21;

struct Reply {
  StatusCode status;
  std::vector<uint8_t> payload;
};

// A raw peer on one data connection to the owner of `buffer`.
class RawScatter {
 public:
  explicit RawScatter(const RemoteBuffer& buffer)
      : buffer_(buffer), fd_(data_connection_to(buffer, Clock::now() + kTimeout)) {}
  bool connected() const { return fd_.valid(); }

  // Sends a scattered request: its header (`count` ranges and `length`
  // bytes as given, right or wrong), `list_bytes` of its list (all of it by
  // default) and `payload`.
  bool send(tcp::RequestKind kind, uint64_t count, uint64_t length,
            const std::vector<tcp::WireRange>& ranges, const std::vector<uint8_t>& payload = {},
            std::optional<size_t> list_bytes = std::nullopt, uint64_t region_size = 0) {
    tcp::RequestHeader h = request_on(buffer_, kind, ++id_, count, length);
    if (region_size) h.region_size = region_size;
    std::vector<uint8_t> frame(sizeof h);
    std::memcpy(frame.data(), &h, sizeof h);
    const size_t list = list_bytes.value_or(ranges.size() * sizeof(tcp::WireRange));
    const auto* bytes = reinterpret_cast<const uint8_t*>(ranges.data());
    frame.insert(frame.end(), bytes, bytes + list);
    frame.insert(frame.end(), payload.begin(), payload.end());
    return send_exact(fd_.get(), frame.data(), frame.size(), Clock::now() + kTimeout).ok();
  }
  // A well-formed one: the header says what the list does.
  bool send(tcp::RequestKind kind, const std::vector<tcp::WireRange>& ranges,
            const std::vector<uint8_t>& payload = {}) {
    uint64_t length = 0;
    for (const tcp::WireRange& r : ranges)
      length += r.length;
    return send(kind, ranges.size(), length, ranges, payload);
  }
  // The next reply; nullopt when the owner hung up.
  std::optional<Reply> reply() {
    tcp::ResponseHeader r{};
    if (!recv_exact(fd_.get(), &r, sizeof r, Clock::now() + kTimeout).ok()) return std::nullopt;
    Reply out{static_cast<StatusCode>(r.status), std::vector<uint8_t>(r.payload)};
    if (r.payload > 0 &&
        !recv_exact(fd_.get(), out.payload.data(), r.payload, Clock::now() + kTimeout).ok()) {
      return std::nullopt;
    }
    return out;
  }
  void close() { fd_.reset(); }

 private:
  RemoteBuffer buffer_;
  Fd fd_;
  uint64_t id_ = 0;
};

struct Owner {
  std::unique_ptr<Manager> manager;
  LocalMemory memory;
  RemoteBuffer handle;

  static Owner make() {
    Owner o;
    Config c;
    c.backends = {"tcp"};
    auto m = Manager::create(c);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return o;
    o.manager = std::move(m).value();
    o.memory = *LocalMemory::allocate(kSize);
    fill_pattern(o.memory.span(), kSeed);
    auto h = o.manager->register_buffer(o.memory);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) o.handle = *h;
    return o;
  }
  // Written by the owner's threads in an order sockets gave (sanitizer.h).
  std::optional<size_t> first_change() const {
    ScopedIgnoreReads quiet;
    return find_mismatch(memory.span(), kSeed);
  }
};

TEST(ScatteredTest, MalformedListsDropTheConnectionAndChangeNothing) {
  using tcp::RequestKind;
  Owner owner = Owner::make();
  ASSERT_NE(owner.manager, nullptr);
  const std::vector<uint8_t> ones(100, 1);
  struct Case {
    const char* what;
    RequestKind kind;
    uint64_t count;
    uint64_t length;
    std::vector<tcp::WireRange> ranges;
  };
  const Case cases[] = {
      {"no ranges", RequestKind::kReadRanges, 0, 100, {}},
      {"more ranges than a request may carry", RequestKind::kReadRanges, 4097, 100, {}},
      {"an empty range", RequestKind::kWriteRanges, 2, 100, {{0, 100}, {200, 0}}},
      {"lengths short of the header's", RequestKind::kWriteRanges, 2, 100, {{0, 50}, {200, 40}}},
      {"lengths past the header's", RequestKind::kWriteRanges, 2, 100, {{0, 50}, {200, 60}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RawScatter peer(owner.handle);
    ASSERT_TRUE(peer.connected());
    std::vector<tcp::WireRange> ranges = c.ranges;
    ranges.resize(std::max<size_t>(ranges.size(), std::min<uint64_t>(c.count, 4097)),
                  tcp::WireRange{0, 1});
    ASSERT_TRUE(peer.send(c.kind, c.count, c.length, ranges,
                          c.kind == RequestKind::kWriteRanges ? ones : std::vector<uint8_t>{}));
    EXPECT_EQ(peer.reply(), std::nullopt) << "the owner answered a broken request";
  }
  {  // A list cut short, then the peer gone: nothing applied.
    RawScatter peer(owner.handle);
    ASSERT_TRUE(peer.send(RequestKind::kWriteRanges, 3, 30, {{0, 10}, {100, 10}, {200, 10}}, {},
                          2 * sizeof(tcp::WireRange)));
    peer.close();
  }
  EXPECT_EQ(owner.first_change(), std::nullopt);
}

TEST(ScatteredTest, RangesOutOfBoundsAreRefusedAndTheConnectionServesOn) {
  using tcp::RequestKind;
  Owner owner = Owner::make();
  ASSERT_NE(owner.manager, nullptr);
  RawScatter peer(owner.handle);
  ASSERT_TRUE(peer.connected());
  const std::vector<uint8_t> payload(300, 0xEE);
  // One range of three past the end: refused, its payload discarded.
  ASSERT_TRUE(
      peer.send(RequestKind::kWriteRanges, {{0, 100}, {kSize - 50, 100}, {500, 100}}, payload));
  auto r = peer.reply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, StatusCode::kInvalidArgument);
  EXPECT_TRUE(r->payload.empty());
  // Wrapping around 2^64; a forged region size.
  ASSERT_TRUE(peer.send(RequestKind::kReadRanges, {{~uint64_t{0} - 10, 20}}));
  r = peer.reply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, StatusCode::kInvalidArgument);
  ASSERT_TRUE(peer.send(RequestKind::kReadRanges, 1, 10, {{0, 10}}, {}, std::nullopt, 2 * kSize));
  r = peer.reply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, StatusCode::kInvalidArgument);
  EXPECT_EQ(owner.first_change(), std::nullopt) << "a refused write landed";
  // The stream is still framed: a good scattered read returns its ranges'
  // bytes in list order, and a good scattered write lands.
  ASSERT_TRUE(peer.send(RequestKind::kReadRanges, {{1000, 16}, {10, 8}, {kSize - 4, 4}}));
  r = peer.reply();
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, StatusCode::kOk);
  ASSERT_EQ(r->payload.size(), 28u);
  const std::span<const std::byte> got(reinterpret_cast<const std::byte*>(r->payload.data()), 28);
  EXPECT_EQ(find_mismatch(got.first(16), kSeed, 1000), std::nullopt);
  EXPECT_EQ(find_mismatch(got.subspan(16, 8), kSeed, 10), std::nullopt);
  EXPECT_EQ(find_mismatch(got.subspan(24, 4), kSeed, kSize - 4), std::nullopt);
  ASSERT_TRUE(peer.send(RequestKind::kWriteRanges, {{2000, 3}, {100, 2}}, {9, 9, 9, 8, 8}));
  r = peer.reply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, StatusCode::kOk);
  {
    ScopedIgnoreReads quiet;
    const auto* m = reinterpret_cast<const uint8_t*>(owner.memory.data());
    EXPECT_EQ(std::vector<uint8_t>(m + 2000, m + 2003), std::vector<uint8_t>({9, 9, 9}));
    EXPECT_EQ(std::vector<uint8_t>(m + 100, m + 102), std::vector<uint8_t>({8, 8}));
  }
  // A genuine reader is served on.
  auto reader = make_manager();
  ASSERT_NE(reader, nullptr);
  LocalMemory dst = *LocalMemory::allocate(64);
  Transfer t = reader->submit({Op::read_ranges(owner.handle, dst, {{5000, 0, 32}, {7000, 32, 32}})},
                              kTimeout);
  ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
  EXPECT_EQ(find_mismatch(dst.span().first(32), kSeed, 5000), std::nullopt);
  EXPECT_EQ(find_mismatch(dst.span().subspan(32), kSeed, 7000), std::nullopt);
}

}  // namespace
}  // namespace rdmabuf::testing
