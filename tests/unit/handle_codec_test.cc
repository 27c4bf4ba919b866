// RemoteBuffer: accessors, slices, and the versioned handle format, which
// must decode untrusted bytes safely (common/buffer.cc).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/buffer_access.h"
#include "common/crc32c.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/manager.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

using testing::handle_layout::kFlags;
using testing::handle_layout::kVersion;

detail::RemoteBufferFields sample_fields() {
  detail::RemoteBufferFields f;
  f.id = 0x1122334455667788ull;
  f.region_size = 123457;
  for (size_t i = 0; i < f.token.size(); ++i)
    f.token[i] = static_cast<uint8_t>(0xA0 + i);
  f.owner.manager_id = 0x0fedcba987654321ull;
  f.owner.address = "10.0.0.7:4242";
  f.owner.host_id = "3b5c1d0e-boot-id";
  f.owner.pid = 4321;
  f.contexts.push_back(BackendContext{"tcp", {}});
  std::vector<uint8_t> nic(100);
  for (size_t i = 0; i < nic.size(); ++i)
    nic[i] = static_cast<uint8_t>(i * 7);
  f.contexts.push_back(BackendContext{"nic", nic});
  f.contexts.push_back(
      BackendContext{"memory", std::vector<uint8_t>(RemoteBuffer::kMaxContextBytes, 0x5a)});
  return f;
}

RemoteBuffer sample() {
  auto h = detail::RemoteBufferAccess::make(sample_fields());
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return *h;
}

void expect_same(const RemoteBuffer& a, const RemoteBuffer& b) {
  ASSERT_TRUE(a.valid());
  ASSERT_TRUE(b.valid());
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.offset(), b.offset());
  EXPECT_EQ(a.region_size(), b.region_size());
  EXPECT_EQ(a.token(), b.token());
  EXPECT_EQ(a.owner().manager_id, b.owner().manager_id);
  EXPECT_EQ(a.owner().address, b.owner().address);
  EXPECT_EQ(a.owner().host_id, b.owner().host_id);
  EXPECT_EQ(a.owner().pid, b.owner().pid);
  ASSERT_EQ(a.contexts().size(), b.contexts().size());
  for (size_t i = 0; i < a.contexts().size(); ++i) {
    EXPECT_EQ(a.contexts()[i].backend, b.contexts()[i].backend);
    EXPECT_EQ(a.contexts()[i].data, b.contexts()[i].data);
  }
}

void expect_invalid(std::span<const uint8_t> bytes, const std::string& what) {
  auto r = RemoteBuffer::from_bytes(bytes);
  ASSERT_FALSE(r.ok()) << what << ": decoded";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
      << what << ": " << r.status().to_string();
  EXPECT_FALSE(r.status().message().empty()) << what;
}

TEST(HandleCodecTest, RoundTripsEveryField) {
  RemoteBuffer h = sample();
  EXPECT_EQ(h.id(), 0x1122334455667788ull);
  EXPECT_EQ(h.size(), 123457u);
  EXPECT_EQ(h.offset(), 0u);
  EXPECT_EQ(h.region_size(), 123457u);
  EXPECT_EQ(h.owner().pid, 4321u);
  ASSERT_NE(h.context("nic"), nullptr);
  EXPECT_EQ(h.context("nic")->data.size(), 100u);
  EXPECT_EQ(h.context("ibverbs"), nullptr);

  std::vector<uint8_t> bytes = h.to_bytes();
  ASSERT_GE(bytes.size(), 4u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "RBUF");
  auto back = RemoteBuffer::from_bytes(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(h, *back);
  EXPECT_EQ(back->to_bytes(), bytes) << "encoding is canonical";

  auto from_text = RemoteBuffer::from_text("  \t" + h.to_text() + "\n ");
  ASSERT_TRUE(from_text.ok()) << from_text.status().to_string();
  expect_same(h, *from_text);
}

TEST(HandleCodecTest, RoundTripsIpv6AndExtremeValues) {
  auto f = sample_fields();
  f.id = std::numeric_limits<uint64_t>::max();
  f.region_size = std::numeric_limits<uint64_t>::max();
  f.owner.address = "[fe80::1:2:3]:65535";
  f.owner.pid = std::numeric_limits<uint32_t>::max();
  f.owner.host_id = std::string(255, 'h');
  f.contexts.clear();
  for (size_t i = 0; i < RemoteBuffer::kMaxContexts; ++i)
    f.contexts.push_back(BackendContext{"b" + std::to_string(i), std::vector<uint8_t>(i, 1)});
  auto h = detail::RemoteBufferAccess::make(f);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto last = h->slice(f.region_size - 1, 1);
  ASSERT_TRUE(last.ok());
  auto back = RemoteBuffer::from_bytes(last->to_bytes());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(*last, *back);
}

TEST(HandleCodecTest, MakeRefusesFieldsTheFormatCannotCarry) {
  struct Case {
    const char* what;
    void (*mutate)(detail::RemoteBufferFields&);
  };
  const Case cases[] = {
      {"zero size", [](auto& f) { f.region_size = 0; }},
      {"bad address", [](auto& f) { f.owner.address = "no-port"; }},
      {"long address", [](auto& f) { f.owner.address = std::string(300, 'a') + ":1"; }},
      {"long host id", [](auto& f) { f.owner.host_id = std::string(256, 'h'); }},
      {"too many contexts",
       [](auto& f) {
         f.contexts.clear();
         for (int i = 0; i < 9; ++i)
           f.contexts.push_back(BackendContext{"b" + std::to_string(i), {}});
       }},
      {"context too large",
       [](auto& f) { f.contexts[1].data.resize(RemoteBuffer::kMaxContextBytes + 1); }},
      {"duplicate backend", [](auto& f) { f.contexts[1].backend = "tcp"; }},
      {"empty backend name", [](auto& f) { f.contexts[1].backend = ""; }},
      {"long backend name", [](auto& f) { f.contexts[1].backend = std::string(33, 'n'); }},
  };
  for (const Case& c : cases) {
    auto f = sample_fields();
    c.mutate(f);
    auto h = detail::RemoteBufferAccess::make(f);
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << c.what;
  }
}

TEST(HandleCodecTest, EmptyHandle) {
  RemoteBuffer h;
  EXPECT_FALSE(h.valid());
  EXPECT_EQ(h.id(), 0u);
  EXPECT_EQ(h.size(), 0u);
  EXPECT_EQ(h.region_size(), 0u);
  EXPECT_EQ(h.owner().manager_id, 0u);
  EXPECT_EQ(h.token(), Token{});
  EXPECT_TRUE(h.contexts().empty());
  EXPECT_EQ(h.context("tcp"), nullptr);
  EXPECT_TRUE(h.to_bytes().empty());
  EXPECT_EQ(h.to_text(), "");
  EXPECT_EQ(h.describe(), "an empty handle");
  EXPECT_EQ(h.slice(0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoteBuffer::from_text("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoteBuffer::from_bytes({}).status().code(), StatusCode::kInvalidArgument);
}

TEST(HandleCodecTest, SlicesAndSlicesOfSlices) {
  RemoteBuffer h = sample();
  auto s = h.slice(10, 1000);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->offset(), 10u);
  EXPECT_EQ(s->size(), 1000u);
  EXPECT_EQ(s->id(), h.id());
  EXPECT_EQ(s->region_size(), h.region_size());
  EXPECT_EQ(s->token(), h.token());
  EXPECT_NE(s->describe().find("[10, 1010)"), std::string::npos) << s->describe();

  auto ss = s->slice(5, 50);
  ASSERT_TRUE(ss.ok());
  EXPECT_EQ(ss->offset(), 15u);
  EXPECT_EQ(ss->size(), 50u);
  auto sss = ss->slice(50, 0);
  ASSERT_TRUE(sss.ok()) << "an empty slice at the end fits";
  EXPECT_EQ(sss->offset(), 65u);
  EXPECT_EQ(sss->size(), 0u);

  // Bounds are those of the view, not of the region.
  EXPECT_EQ(s->slice(0, 1001).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->slice(1001, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->slice(999, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ss->slice(1, 50).status().code(), StatusCode::kInvalidArgument);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(h.slice(kMax, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.slice(2, kMax).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.slice(0, h.size()).ok());
  EXPECT_TRUE(h.slice(h.size(), 0).ok());

  // Slices travel: offset and length are part of the bytes.
  auto back = RemoteBuffer::from_bytes(ss->to_bytes());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(*ss, *back);
  auto empty_back = RemoteBuffer::from_text(sss->to_text());
  ASSERT_TRUE(empty_back.ok()) << empty_back.status().to_string();
  EXPECT_EQ(empty_back->size(), 0u);
  EXPECT_EQ(empty_back->offset(), 65u);
}

TEST(HandleCodecTest, TruncatedAtEveryLength) {
  std::vector<uint8_t> bytes = sample().to_bytes();
  for (size_t n = 0; n < bytes.size(); ++n)
    expect_invalid(std::span<const uint8_t>(bytes.data(), n), "first " + std::to_string(n));
}

TEST(HandleCodecTest, TruncatedAndResealedAtEveryLength) {
  // Cut the fields short but keep a consistent length and checksum: the
  // decoder must notice the fields themselves are incomplete.
  std::vector<uint8_t> bytes = sample().to_bytes();
  for (size_t n = testing::handle_layout::kTotalLength + 2; n + 4 < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    cut.resize(n + 4);
    testing::reseal(cut);
    expect_invalid(cut, "resealed after " + std::to_string(n) + " bytes");
  }
}

TEST(HandleCodecTest, EverySingleBitFlip) {
  std::vector<uint8_t> bytes = sample().to_bytes();
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    std::vector<uint8_t> flipped = bytes;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    expect_invalid(flipped, "bit " + std::to_string(bit));
  }
}

TEST(HandleCodecTest, RandomGarbage) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> junk(rng() % 400);
    for (auto& b : junk)
      b = static_cast<uint8_t>(rng());
    if (i % 2 == 0 && junk.size() >= 8) {  // get past the magic and version checks
      std::memcpy(junk.data(), "RBUF\x01\x00", 6);
    }
    expect_invalid(junk, "garbage #" + std::to_string(i));
  }
}

TEST(HandleCodecTest, MutatedAndResealedNeverCrash) {
  // Random edits to a real handle with a valid checksum: the decoder's field
  // checks are all that stands between these bytes and the rest of the
  // library. Whatever it accepts must re-encode to exactly the same bytes.
  std::vector<uint8_t> bytes = sample().to_bytes();
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> m = bytes;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = 8 + rng() % (m.size() - 12);  // keep magic/version/flags/total; reseal fixes crc
      m[at] = static_cast<uint8_t>(rng());
    }
    testing::reseal(m);
    auto r = RemoteBuffer::from_bytes(m);
    if (r.ok()) {
      ++accepted;
      EXPECT_EQ(r->to_bytes(), m) << "edit #" << i;
      EXPECT_LE(r->offset(), r->region_size());
      EXPECT_LE(r->size(), r->region_size() - r->offset());
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(accepted, 0) << "edits to the token or id alone are valid handles";
}

TEST(HandleCodecTest, WrongVersion) {
  std::vector<uint8_t> bytes = sample().to_bytes();
  for (uint8_t v : {0, 2, 255}) {
    std::vector<uint8_t> m = bytes;
    m[kVersion] = v;
    testing::reseal(m);
    auto r = RemoteBuffer::from_bytes(m);
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("version"), std::string::npos) << r.status().to_string();
  }
}

TEST(HandleCodecTest, UnknownFlags) {
  std::vector<uint8_t> m = sample().to_bytes();
  m[kFlags] = 1;
  testing::reseal(m);
  expect_invalid(m, "flags");
}

TEST(HandleCodecTest, TrailingBytes) {
  std::vector<uint8_t> bytes = sample().to_bytes();
  // Appended after the checksum, without fixing anything.
  std::vector<uint8_t> a = bytes;
  a.push_back(0);
  expect_invalid(a, "one byte appended");
  // Inserted before the checksum, with the length and checksum fixed.
  for (size_t extra : {1, 3, 4, 100}) {
    std::vector<uint8_t> m(bytes.begin(), bytes.end() - 4);
    m.resize(m.size() + extra, 0xee);
    m.resize(m.size() + 4);
    testing::reseal(m);
    auto r = RemoteBuffer::from_bytes(m);
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << extra;
  }
}

TEST(HandleCodecTest, WrongMagicWrongLengthTooLong) {
  std::vector<uint8_t> bytes = sample().to_bytes();
  std::vector<uint8_t> m = bytes;
  m[0] = 'X';
  testing::reseal(m);
  expect_invalid(m, "magic");
  m = bytes;
  testing::poke<uint16_t>(m, testing::handle_layout::kTotalLength,
                          static_cast<uint16_t>(m.size() + 1));
  expect_invalid(m, "length field off by one");
  std::vector<uint8_t> huge(70000, 0);
  std::memcpy(huge.data(), "RBUF\x01", 5);
  expect_invalid(huge, "70000 bytes");
}

TEST(HandleCodecTest, InconsistentFieldsWithValidChecksum) {
  RemoteBuffer h = sample();
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  struct View {
    uint64_t region, offset, length;
  };
  for (View v : {View{0, 0, 0}, View{100, 50, 51}, View{100, 101, 0}, View{100, kMax, 2},
                 View{100, 2, kMax}, View{kMax, kMax, 1}}) {
    auto r = testing::with_view(h, v.region, v.offset, v.length);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
        << v.region << " " << v.offset << " " << v.length;
  }
  EXPECT_TRUE(testing::with_view(h, 100, 100, 0).ok());
  EXPECT_EQ(testing::with_address(h, "nohost").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(testing::with_address(h, "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::with_address(h, "127.0.0.1:1").ok());
}

// Offsets of the context list in sample()'s bytes.
size_t context_list_at(const std::vector<uint8_t>& bytes) {
  size_t at = testing::handle_layout::kAddress;
  at += 1 + bytes[at];  // address
  at += 1 + bytes[at];  // host id
  return at;            // the context count
}

TEST(HandleCodecTest, BadContextListWithValidChecksum) {
  std::vector<uint8_t> bytes = sample().to_bytes();
  const size_t count_at = context_list_at(bytes);
  ASSERT_EQ(bytes[count_at], 3);
  {
    std::vector<uint8_t> m = bytes;
    m[count_at] = 9;  // more than kMaxContexts
    testing::reseal(m);
    expect_invalid(m, "9 contexts");
  }
  {
    std::vector<uint8_t> m = bytes;
    m[count_at] = 2;  // fewer than present: the rest are trailing bytes
    testing::reseal(m);
    expect_invalid(m, "count 2 of 3");
  }
  {
    std::vector<uint8_t> m = bytes;
    m[count_at] = 4;  // more than present
    testing::reseal(m);
    expect_invalid(m, "count 4 of 3");
  }
  {
    // First context "tcp" (u8 3, "tcp", u16 0); second "nic": rename it "tcp".
    std::vector<uint8_t> m = bytes;
    size_t second = count_at + 1 + 1 + 3 + 2;
    ASSERT_EQ(std::string(m.begin() + static_cast<ptrdiff_t>(second + 1),
                          m.begin() + static_cast<ptrdiff_t>(second + 4)),
              "nic");
    std::memcpy(m.data() + second + 1, "tcp", 3);
    testing::reseal(m);
    expect_invalid(m, "duplicate backend");
  }
  {
    // The second context's data length set past kMaxContextBytes.
    std::vector<uint8_t> m = bytes;
    size_t len_at = count_at + 1 + 1 + 3 + 2 + 1 + 3;
    testing::poke<uint16_t>(m, len_at, RemoteBuffer::kMaxContextBytes + 1);
    testing::reseal(m);
    expect_invalid(m, "oversized context");
  }
  {
    // An empty backend name.
    std::vector<uint8_t> m = bytes;
    size_t second = count_at + 1 + 1 + 3 + 2;
    m.erase(m.begin() + static_cast<ptrdiff_t>(second + 1),
            m.begin() + static_cast<ptrdiff_t>(second + 4));
    m[second] = 0;
    testing::reseal(m);
    expect_invalid(m, "empty backend name");
  }
}

TEST(HandleCodecTest, FromTextRefusesNonBase64) {
  for (const char* bad : {"not a handle", "!!!!", "UkJVRg", "UkJVRgE=", "   ", "\x01"}) {
    auto r = RemoteBuffer::from_text(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  std::string text = sample().to_text();
  for (size_t i = 0; i < text.size(); i += 7) {
    std::string t = text;
    t[i] = t[i] == 'A' ? 'B' : 'A';
    EXPECT_EQ(RemoteBuffer::from_text(t).status().code(), StatusCode::kInvalidArgument) << i;
  }
  EXPECT_EQ(RemoteBuffer::from_text(text.substr(0, text.size() - 1)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoteBuffer::from_text(text + "A").status().code(), StatusCode::kInvalidArgument);
}

TEST(HandleCodecTest, ManagerMintedHandles) {
  Config config;
  auto manager = Manager::create(config);
  ASSERT_TRUE(manager.ok()) << manager.status().to_string();
  std::vector<std::byte> a(100), b(100);
  auto ha = (*manager)->register_buffer(LocalMemory::from_span(a));
  auto hb = (*manager)->register_buffer(LocalMemory::from_span(b));
  ASSERT_TRUE(ha.ok() && hb.ok());
  EXPECT_NE(ha->id(), hb->id());
  EXPECT_NE(ha->token(), hb->token()) << "tokens are random per buffer";
  EXPECT_NE(ha->token(), Token{});
  EXPECT_EQ(ha->owner().manager_id, (*manager)->identity().manager_id);
  EXPECT_EQ(ha->owner().address, (*manager)->address());
  EXPECT_EQ(ha->owner().pid, static_cast<uint32_t>(::getpid()));
  EXPECT_FALSE(ha->owner().host_id.empty());
  EXPECT_NE(ha->context("tcp"), nullptr);
  auto back = RemoteBuffer::from_text(ha->to_text());
  ASSERT_TRUE(back.ok());
  expect_same(*ha, *back);
  EXPECT_NE(ha->owner().to_string().find((*manager)->address()), std::string::npos);
}

}  // namespace
}  // namespace rdmabuf
