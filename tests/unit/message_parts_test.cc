// How an endpoint cuts a message into kSentPart frames (core/endpoint/message_parts.h):
// over TCP eight whole frames a write, through the shared-memory rings one,
// and through a channel with a write unit (an RDMA channel's SEND) the
// fewest frames of one size that fill the unit without passing it.
#include "core/endpoint/message_parts.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace rdmabuf::endpoint {
namespace {

constexpr uint64_t kWholeFrame = kHeaderSize + kMaxPayload;

TEST(MessageParts, TcpWritesEightWholeFramesAtOnce) {
  const PartShape shape = part_shape(/*over_channel=*/false, 0);
  EXPECT_EQ(shape.part_bytes, kPartBytes);
  EXPECT_EQ(shape.parts_per_write, kPartsPerWrite);
  EXPECT_EQ(shape.part_bytes + kPartOverhead, kWholeFrame);
}

TEST(MessageParts, ChannelsWithoutAWriteUnitWriteOneWholeFrameAtATime) {
  const PartShape shape = part_shape(/*over_channel=*/true, 0);
  EXPECT_EQ(shape.part_bytes, kPartBytes);
  EXPECT_EQ(shape.parts_per_write, kRingPartsPerWrite);
}

TEST(MessageParts, TheIbverbsChannelsUnitTakesTwoFramesOfExactlyEightKiB) {
  // The ibverbs channel's write_unit() (backends/ibverbs/message_channel.cc).
  constexpr uint64_t kIbverbsUnit = 16 * 1024;
  const PartShape shape = part_shape(/*over_channel=*/true, kIbverbsUnit);
  EXPECT_EQ(shape.parts_per_write, 2);
  EXPECT_EQ(shape.part_bytes + kPartOverhead, 8192u);
  EXPECT_EQ(shape.parts_per_write * (shape.part_bytes + kPartOverhead), kIbverbsUnit);
}

// For every unit: frames no larger than a whole frame, as few as fill the
// unit, together no larger than it and short of it by less than a byte a
// frame; a unit too small for a frame with a byte of message in it is
// ignored (one whole frame a write, as without a unit).
TEST(MessageParts, EveryWriteUnitIsFilledByTheFewestFramesThatFitIt) {
  for (uint64_t unit = 1; unit <= 9 * kWholeFrame + 7; unit += unit < 64 ? 1 : 61) {
    SCOPED_TRACE("write unit " + std::to_string(unit));
    const PartShape shape = part_shape(/*over_channel=*/true, unit);
    const auto frames = static_cast<uint64_t>(shape.parts_per_write);
    const uint64_t frame = shape.part_bytes + kPartOverhead;
    if (unit <= kPartOverhead) {
      EXPECT_EQ(shape.part_bytes, kPartBytes);
      EXPECT_EQ(shape.parts_per_write, kRingPartsPerWrite);
      continue;
    }
    ASSERT_GE(frames, 1u);
    EXPECT_GT(shape.part_bytes, 0u);
    EXPECT_LE(frame, kWholeFrame);
    EXPECT_LE(frames * frame, unit);
    EXPECT_LT(unit - frames * frame, frames);
    EXPECT_LT((frames - 1) * kWholeFrame, unit) << "one frame fewer would have done";
  }
}

}  // namespace
}  // namespace rdmabuf::endpoint
