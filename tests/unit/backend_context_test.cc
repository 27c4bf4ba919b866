// The backends' contexts in a handle (backends/memory/handle_context.h,
// backends/ibverbs/handle_context.h): what a reader decodes from any handle
// it is given. A context has one encoding: whatever decodes re-encodes to
// the same bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/ibverbs/handle_context.h"
#include "backends/memory/handle_context.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

memory::HandleContext a_memory_context() {
  memory::HandleContext c;
  c.pid = 4321;
  c.pid_namespace = 4026531836;
  c.state_fd = 7;
  c.slot = 16383;
  c.generation = 9;
  c.base = 0x7f0000001000;
  c.segment_address = 0x7f0000200000;
  return c;
}

TEST(MemoryContextTest, RoundTrips) {
  std::vector<uint8_t> bytes = memory::encode_context(a_memory_context());
  ASSERT_EQ(bytes.size(), memory::kHandleContextBytes);
  auto c = memory::decode_context(bytes);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->pid, 4321u);
  EXPECT_EQ(c->slot, 16383u);
  EXPECT_EQ(c->base, 0x7f0000001000u);
  EXPECT_EQ(memory::encode_context(*c), bytes);
}

TEST(MemoryContextTest, RefusesWhatItCannotReEncode) {
  const std::vector<uint8_t> good = memory::encode_context(a_memory_context());
  auto refused = [](std::vector<uint8_t> bytes) {
    return memory::decode_context(bytes).status().code() == StatusCode::kInvalidArgument;
  };
  for (size_t at : {1, 2, 3}) {  // reserved bytes (accepted until fuzz_contexts)
    std::vector<uint8_t> bytes = good;
    bytes[at] = 1;
    EXPECT_TRUE(refused(bytes)) << "reserved byte " << at;
  }
  std::vector<uint8_t> version = good;
  version[0] = 2;
  EXPECT_TRUE(refused(version));
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer));
  EXPECT_TRUE(refused(std::vector<uint8_t>(good.begin(), good.end() - 1)));
  memory::HandleContext slot = a_memory_context();
  slot.slot = 16384;
  EXPECT_TRUE(refused(memory::encode_context(slot)));
  memory::HandleContext pid = a_memory_context();
  pid.pid = 0;
  EXPECT_TRUE(refused(memory::encode_context(pid)));
}

TEST(IbverbsContextTest, RoundTrips) {
  std::vector<uint8_t> bytes = ibverbs::encode_context({"mlx5_0", 0x7f3a12345000});
  auto c = ibverbs::decode_context(bytes);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->device, "mlx5_0");
  EXPECT_EQ(c->addr, 0x7f3a12345000u);
  EXPECT_EQ(ibverbs::encode_context(*c), bytes);
  std::string longest(ibverbs::kDeviceNameBytes - 1, 'd');
  EXPECT_TRUE(ibverbs::decode_context(ibverbs::encode_context({longest, 1})).ok());
}

TEST(IbverbsContextTest, RefusesWhatItCannotReEncode) {
  auto refused = [](const std::vector<uint8_t>& bytes) {
    return ibverbs::decode_context(bytes).status().code() == StatusCode::kInvalidArgument;
  };
  const std::vector<uint8_t> good = ibverbs::encode_context({"rxe0", 0x1000});
  for (size_t at : {1, 2, 3}) {  // reserved bytes (accepted until fuzz_contexts)
    std::vector<uint8_t> bytes = good;
    bytes[at] = 0x40;
    EXPECT_TRUE(refused(bytes)) << "reserved byte " << at;
  }
  // A NUL in the name (accepted until fuzz_contexts): the connect message
  // would have cut the name there, asking the owner for another device.
  EXPECT_TRUE(refused(ibverbs::encode_context({std::string("rxe0\0x", 6), 0x1000})));
  EXPECT_TRUE(refused(ibverbs::encode_context({"", 0x1000})));
  EXPECT_TRUE(refused(ibverbs::encode_context({std::string(64, 'd'), 0x1000})));
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer));
  EXPECT_TRUE(refused(std::vector<uint8_t>(good.begin(), good.end() - 1)));
}

}  // namespace
}  // namespace rdmabuf
