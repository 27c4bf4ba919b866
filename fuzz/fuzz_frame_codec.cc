// Fuzzes the endpoint's frame codec (core/endpoint/frames.h), the one
// decoder of each frame that every reader of the endpoint uses, whether it
// takes a frame where it lies in a ring or from a copy.
//
// The first byte of an input picks the frame type; the rest is its payload.
// Checks, beyond no crash and no sanitizer report: a payload that decodes
// re-encodes, with the codec's own encoder, to exactly the bytes it came
// from (so no field is read that the encoder does not write, and none is
// left over); a message answer or part never claims bytes past its
// payload; a decoded reply's code is a real status code.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/endpoint/frames.h"
#include "fuzz/fuzz_support.h"

namespace {

using namespace rdmabuf;            // NOLINT(google-build-using-namespace)
using namespace rdmabuf::endpoint;  // NOLINT(google-build-using-namespace)

bool same(FrameBuilder&& frame, std::span<const uint8_t> payload) {
  const std::span<const uint8_t> bytes = frame.done();
  return bytes.size() == kHeaderSize + payload.size() &&
         std::equal(payload.begin(), payload.end(), bytes.begin() + kHeaderSize);
}

bool within(std::span<const uint8_t> inner, std::span<const uint8_t> outer) {
  return inner.empty() || (inner.data() >= outer.data() &&
                           inner.data() + inner.size() <= outer.data() + outer.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto type = static_cast<Frame>(data[0] % 20);
  const std::span<const uint8_t> payload(data + 1, size - 1);
  switch (type) {
    case Frame::kPosted: {
      Credit credit;
      if (decode_credit(payload, credit).ok() && !credit.buffer.valid()) {
        std::vector<uint8_t> frame;
        append_credit(frame, credit.seq, credit.capacity, {});
        RDMABUF_FUZZ_CHECK(frame.size() == kHeaderSize + payload.size() &&
                           std::equal(payload.begin(), payload.end(), frame.begin() + kHeaderSize));
      }
      Credit bare;
      RDMABUF_FUZZ_CHECK(!decode_bare_credit(payload, bare) ||
                         (bare.seq == credit.seq && bare.capacity == credit.capacity));
      break;
    }
    case Frame::kSent:
    case Frame::kTooLarge:
    case Frame::kNotTaken:
    case Frame::kSentInline: {
      MessageAnswer answer;
      if (!decode_answer(type, payload, answer)) break;
      RDMABUF_FUZZ_CHECK(within(answer.data, payload));
      if (type == Frame::kSentInline) {
        RDMABUF_FUZZ_CHECK(answer.size == answer.data.size());
        const InlineHead head = inline_head(answer.seq, answer.size);
        RDMABUF_FUZZ_CHECK(std::equal(head.begin() + kHeaderSize, head.end(), payload.begin()));
      } else {
        RDMABUF_FUZZ_CHECK(same(answer_frame(type, answer.seq, answer.size), payload));
      }
      break;
    }
    case Frame::kSentPart: {
      MessagePart part;
      if (!decode_part(payload, part)) break;
      RDMABUF_FUZZ_CHECK(!part.data.empty() && within(part.data, payload));
      const PartHead head = part_head(part.seq, part.size, part.data.size());
      RDMABUF_FUZZ_CHECK(std::equal(head.begin() + kHeaderSize, head.end(), payload.begin()));
      break;
    }
    case Frame::kWithdrawn: {
      auto seq = decode_withdrawn(payload);
      if (seq.ok() && payload.size() == 16 &&
          std::all_of(payload.begin() + 8, payload.end(), [](uint8_t b) { return b == 0; })) {
        RDMABUF_FUZZ_CHECK(same(answer_frame(type, *seq, 0), payload));
      }
      break;
    }
    case Frame::kLendRequest:
    case Frame::kRenew:
    case Frame::kHandleWanted: {
      Request request;
      if (decode_request(type, payload, request).ok()) {
        RDMABUF_FUZZ_CHECK(same(request_frame(type, request), payload));
      }
      break;
    }
    case Frame::kLent:
    case Frame::kRenewed:
    case Frame::kReceiveHandle: {
      Reply reply;
      if (!decode_reply(payload, reply).ok()) break;
      RDMABUF_FUZZ_CHECK(reply.code <= StatusCode::kInternal && within(reply.body, payload));
      if (reply.code == StatusCode::kOk) {
        RDMABUF_FUZZ_CHECK(
            same(reply_frame(type, reply.id, Status::Ok(), reply.value, reply.body), payload));
      }
      break;
    }
    case Frame::kNotify: {
      Notice notice;
      if (decode_notify(payload, notice).ok())
        RDMABUF_FUZZ_CHECK(same(notify_frame(notice), payload));
      break;
    }
    case Frame::kBuffer: {
      auto buffer = decode_buffer(payload);
      if (buffer.ok()) RDMABUF_FUZZ_CHECK(same(buffer_frame(buffer->to_bytes()), payload));
      break;
    }
    case Frame::kHello: {
      auto hello = decode_hello(type, payload);
      if (hello.ok()) RDMABUF_FUZZ_CHECK(same(hello_frame(*hello), payload));
      break;
    }
    // (Reasons are cut at 1024 bytes when encoded: longer ones come back shorter.)
    case Frame::kChannelOffer: {
      auto offer = decode_channel_offer(type, payload);
      if (offer.ok() && offer->host_id.size() <= 1024 && offer->no_shared_memory.size() <= 1024 &&
          offer->no_rdma.size() <= 1024) {
        RDMABUF_FUZZ_CHECK(same(channel_offer_frame(*offer), payload));
      }
      break;
    }
    case Frame::kChannelAnswer: {
      auto answer = decode_channel_answer(type, payload);
      if (answer.ok() && answer->no_shared_memory.size() <= 1024 &&
          answer->no_rdma.size() <= 1024) {
        RDMABUF_FUZZ_CHECK(same(channel_answer_frame(*answer), payload));
      }
      break;
    }
    case Frame::kChannelReady: {
      auto ready = decode_channel_ready(type, payload);
      if (ready.ok() && ready->ok) {
        RDMABUF_FUZZ_CHECK(same(channel_ready_frame(Status::Ok(), ready->address_or_why), payload));
      }
      break;
    }
    default:
      break;
  }
  return 0;
}
