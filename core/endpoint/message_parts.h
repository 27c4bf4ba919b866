// The sizes of an endpoint's frames that carry messages, and how a message
// too large for one frame is cut into kSentPart frames (core/endpoint/;
// docs/wire-format.md). Both sides agree on the frame sizes; the shape of
// the parts is the sender's own, chosen for its channel.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmabuf::endpoint {

// A frame's header: u32 payload length, u8 type.
constexpr size_t kHeaderSize = 5;
constexpr uint32_t kMaxPayload = 8192;  // an inline message, or a handle
// The bytes of a message a kSentPart frame carries, at most: a whole frame.
constexpr uint64_t kPartBytes = kMaxPayload - 2 * sizeof(uint64_t);
// A kSentPart frame's bytes besides its part of the message: its header, the
// receive's seq and the message's size.
constexpr uint64_t kPartOverhead = kHeaderSize + 2 * sizeof(uint64_t);
static_assert(kPartBytes + kPartOverhead == kHeaderSize + kMaxPayload);
// Parts written at once over TCP (one hold of the write lock, one send):
// other frames go out between these, so a long message delays them little.
constexpr int kPartsPerWrite = 8;
// Through the shared-memory rings each part is published as soon as it is
// written, so that the reader copies one part out while the writer copies
// the next in: a 64 KiB message's one-way time fell from 7.9 to 6.3 us
// (two parts at a time: 6.1 us, but 5% less bandwidth; eight: 7.9 us).
constexpr int kRingPartsPerWrite = 1;

// How a sender cuts a message in kSentPart frames: the message's bytes in
// each (the last may have fewer), and the frames one write carries.
struct PartShape {
  uint64_t part_bytes;
  int parts_per_write;
};

// Over TCP (`over_channel` false), kPartsPerWrite whole frames a write.
// Through a channel (shared-memory rings, or an RDMA backend's
// MessageChannel) without a write unit (`write_unit` 0, the rings), one
// whole frame a write (kRingPartsPerWrite). Through one with a write unit
// (MessageChannel::write_unit; an RDMA channel's is one SEND), the fewest
// frames of at most a whole frame's size that fill the unit, all of one
// size (short of it by less than one byte a frame when they do not divide
// it), written together: the ibverbs channel's units of 16 KiB take two
// frames of 8192 bytes, so that no SEND carries only a part's last few
// bytes. A unit too small for
// a frame with a byte of message in it is ignored.
constexpr PartShape part_shape(bool over_channel, uint64_t write_unit) {
  if (!over_channel) return {kPartBytes, kPartsPerWrite};
  constexpr uint64_t kWholeFrame = kHeaderSize + kMaxPayload;
  const uint64_t frames = write_unit / kWholeFrame + (write_unit % kWholeFrame != 0);
  if (write_unit == 0 || write_unit / frames <= kPartOverhead) {
    return {kPartBytes, kRingPartsPerWrite};
  }
  return {write_unit / frames - kPartOverhead, static_cast<int>(frames)};
}

}  // namespace rdmabuf::endpoint
