// The small common helpers: strings, base64url, CRC-32C, WireReader/Writer,
// host/port parsing.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/base64.h"
#include "common/crc32c.h"
#include "common/socket.h"
#include "common/strings.h"
#include "common/wire.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

TEST(StringsTest, Trim) {
  EXPECT_EQ(trim(""), "");
  EXPECT_EQ(trim("   "), "");
  EXPECT_EQ(trim(" \t a b \n"), "a b");
  EXPECT_EQ(trim("x"), "x");
}

TEST(StringsTest, SplitList) {
  EXPECT_EQ(split_list(""), std::vector<std::string>{});
  EXPECT_EQ(split_list(" , ,"), std::vector<std::string>{});
  EXPECT_EQ(split_list("tcp"), std::vector<std::string>{"tcp"});
  EXPECT_EQ(split_list(" a, b ,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split_list("a;b", ';'), (std::vector<std::string>{"a", "b"}));
}

TEST(StringsTest, ParseBool) {
  for (const char* t : {"1", "true", "TRUE", "yes", "On", " on "})
    EXPECT_EQ(parse_bool(t), std::optional<bool>(true)) << t;
  for (const char* f : {"0", "false", "No", "OFF"})
    EXPECT_EQ(parse_bool(f), std::optional<bool>(false)) << f;
  for (const char* bad : {"", "2", "y", "truthy", "o n"})
    EXPECT_EQ(parse_bool(bad), std::nullopt) << bad;
}

TEST(StringsTest, ParseInt) {
  EXPECT_EQ(parse_int("42", 0, 100), std::optional<int64_t>(42));
  EXPECT_EQ(parse_int(" 42 ", 0, 100), std::optional<int64_t>(42));
  EXPECT_EQ(parse_int("-3", -5, 5), std::optional<int64_t>(-3));
  EXPECT_EQ(parse_int("0", 0, 0), std::optional<int64_t>(0));
  EXPECT_EQ(parse_int("101", 0, 100), std::nullopt);
  EXPECT_EQ(parse_int("-1", 0, 100), std::nullopt);
  EXPECT_EQ(parse_int("", 0, 100), std::nullopt);
  EXPECT_EQ(parse_int("1e3", 0, 10000), std::nullopt);
  EXPECT_EQ(parse_int("12abc", 0, 100), std::nullopt);
  EXPECT_EQ(parse_int("+5", 0, 100), std::nullopt);
  EXPECT_EQ(parse_int("99999999999999999999", 0, std::numeric_limits<int64_t>::max()),
            std::nullopt);
  EXPECT_EQ(parse_int("9223372036854775807", 0, std::numeric_limits<int64_t>::max()),
            std::optional<int64_t>(std::numeric_limits<int64_t>::max()));
}

TEST(StringsTest, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(4096), "4 KiB");
  EXPECT_EQ(format_bytes(size_t{1} << 20), "1 MiB");
  EXPECT_EQ(format_bytes(size_t{3} << 30), "3 GiB");
  EXPECT_EQ(format_bytes(uint64_t{5} << 40), "5 TiB");
  EXPECT_EQ(format_bytes(uint64_t{2048} << 40), "2048 TiB");
  EXPECT_FALSE(format_bytes(std::numeric_limits<uint64_t>::max()).empty());
}

TEST(StringsTest, HexId) {
  EXPECT_EQ(hex_id(0), "0000000000000000");
  EXPECT_EQ(hex_id(0x1a2b), "0000000000001a2b");
  EXPECT_EQ(hex_id(~uint64_t{0}), "ffffffffffffffff");
}

std::vector<uint8_t> bytes_of(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(Base64Test, Rfc4648Vectors) {
  // RFC 4648 section 10, without the padding (base64url is unpadded here).
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},           {"f", "Zg"},          {"fo", "Zm8"},          {"foo", "Zm9v"},
      {"foob", "Zm9vYg"}, {"fooba", "Zm9vYmE"}, {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64url_encode(bytes_of(plain)), encoded) << plain;
    auto decoded = base64url_decode(encoded);
    ASSERT_TRUE(decoded.has_value()) << encoded;
    EXPECT_EQ(*decoded, bytes_of(plain)) << encoded;
  }
}

TEST(Base64Test, UsesTheUrlAlphabet) {
  std::vector<uint8_t> b = {0xfb, 0xff, 0xbf};
  EXPECT_EQ(base64url_encode(b), "-_-_");
  auto d = base64url_decode("-_-_");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, b);
}

TEST(Base64Test, RefusesInvalidText) {
  // "Zh" and "Zm9" have possible lengths but non-zero padding bits:
  // accepting them would give one byte string two encodings.
  for (const char* bad :
       {"Zg==", "Zm9v=", "+/+/", "Zm 9v", "Z", "Zm9vY", "Zh", "Zm9", "Zm9\n", "\xff\xfe", "ab*d"}) {
    EXPECT_EQ(base64url_decode(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(base64url_decode("Zm8"), std::optional<std::vector<uint8_t>>(bytes_of("fo")));
}

TEST(Base64Test, RandomRoundTrips) {
  std::mt19937_64 rng(1);
  for (size_t len = 0; len < 300; ++len) {
    std::vector<uint8_t> b(len);
    for (auto& x : b)
      x = static_cast<uint8_t>(rng());
    std::string text = base64url_encode(b);
    EXPECT_EQ(text.size(), (len * 4 + 2) / 3);
    EXPECT_EQ(
        text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
        std::string::npos);
    auto back = base64url_decode(text);
    ASSERT_TRUE(back.has_value()) << len;
    EXPECT_EQ(*back, b);
  }
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0x00000000u);
  // RFC 3720 (iSCSI) appendix B.4 test patterns.
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> data(64);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<uint8_t>(i * 37);
  uint32_t base = crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(crc32c(data.data(), data.size()), base) << bit;
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

TEST(WireTest, WriterReaderRoundTrip) {
  std::vector<uint8_t> out;
  WireWriter w(out);
  w.put<uint8_t>(0xab);
  w.put<uint16_t>(0x1234);
  w.put<uint32_t>(0xdeadbeef);
  w.put<uint64_t>(0x0102030405060708ull);
  w.short_string("hello");
  w.bytes("xyz", 3);
  ASSERT_EQ(out.size(), 1u + 2 + 4 + 8 + 1 + 5 + 3);
  // Little-endian on the wire.
  EXPECT_EQ(out[1], 0x34);
  EXPECT_EQ(out[2], 0x12);
  EXPECT_EQ(out[7], 0x08);

  WireReader r(out);
  EXPECT_EQ(r.get<uint8_t>(), 0xab);
  EXPECT_EQ(r.get<uint16_t>(), 0x1234);
  EXPECT_EQ(r.get<uint32_t>(), 0xdeadbeefu);
  EXPECT_EQ(r.get<uint64_t>(), 0x0102030405060708ull);
  EXPECT_EQ(r.short_string(), "hello");
  char xyz[3];
  EXPECT_TRUE(r.bytes(xyz, 3));
  EXPECT_EQ(std::string(xyz, 3), "xyz");
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(r.position(), out.size());
}

TEST(WireTest, ReaderNeverReadsPastItsInput) {
  const uint8_t data[5] = {1, 2, 3, 4, 5};
  {
    WireReader r(std::span<const uint8_t>(data, 3));
    EXPECT_EQ(r.get<uint32_t>(), 0u);  // 4 > 3: fails, returns 0
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.position(), 0u);
    EXPECT_EQ(r.get<uint8_t>(), 0u) << "a failed reader stays failed";
  }
  {
    WireReader r(data);
    EXPECT_EQ(r.get<uint32_t>(), 0x04030201u);
    EXPECT_TRUE(r.view(2).empty());
    EXPECT_FALSE(r.ok());
  }
  {
    WireReader r(data);
    char buf[8];
    EXPECT_FALSE(r.bytes(buf, 6));
    EXPECT_FALSE(r.ok());
  }
  {
    // A string whose length byte points past the end.
    const uint8_t s[3] = {10, 'a', 'b'};
    WireReader r(s);
    EXPECT_EQ(r.short_string(), "");
    EXPECT_FALSE(r.ok());
  }
  {
    WireReader r(std::span<const uint8_t>{});
    EXPECT_EQ(r.remaining(), 0u);
    EXPECT_EQ(r.get<uint8_t>(), 0u);
    EXPECT_FALSE(r.ok());
  }
  {
    // A huge size must not overflow the bounds check.
    WireReader r(data);
    EXPECT_TRUE(r.view(std::numeric_limits<size_t>::max()).empty());
    EXPECT_FALSE(r.ok());
  }
  {
    WireReader r(data);
    EXPECT_EQ(r.view(5).size(), 5u);
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r.view(0).size(), 0u);
    EXPECT_TRUE(r.ok());
  }
}

TEST(WireTest, RangeFits) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_TRUE(range_fits(0, 0, 0));
  EXPECT_TRUE(range_fits(0, 10, 10));
  EXPECT_TRUE(range_fits(10, 0, 10));
  EXPECT_TRUE(range_fits(3, 7, 10));
  EXPECT_FALSE(range_fits(3, 8, 10));
  EXPECT_FALSE(range_fits(11, 0, 10));
  EXPECT_FALSE(range_fits(kMax, 2, 10));
  EXPECT_FALSE(range_fits(2, kMax, 10));
  EXPECT_FALSE(range_fits(kMax - 1, 2, kMax));
  EXPECT_TRUE(range_fits(kMax - 1, 1, kMax));
  EXPECT_FALSE(range_fits(1, kMax, kMax));
}

TEST(HostPortTest, Parse) {
  auto a = parse_host_port("127.0.0.1:4000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 4000);
  EXPECT_EQ(a->to_string(), "127.0.0.1:4000");
  auto b = parse_host_port("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->to_string(), "[::1]:0");
  auto c = parse_host_port(" example.com:65535 ");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->port, 65535);
  for (const char* bad : {"", "host", ":80", "host:", "host:65536", "host:-1", "host:x", "[::1]",
                          "[::1]80", "[::1:80", "[]:80"}) {
    EXPECT_EQ(parse_host_port(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace rdmabuf
