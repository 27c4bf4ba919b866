// Fuzzes what a reader's tcp stream reads from an owner once the hello is
// done: the response frames and read payloads (backends/tcp/client.cc,
// protocol.h).
//
// Feeds each input as a plan of up to 4 reads, writes, scattered reads and
// writes and atomics (its first bytes, see ReaderPlan in fuzz_support.h)
// and the bytes an owner sends back (the rest): a real tcp::Peer with one
// stream runs the plan against a fake owner on a loopback socket that
// answers the hello, sends those bytes and shuts its side down.
//
// Checks the outcome against a reader written from docs/wire-format.md ("tcp
// data frames", "What each side refuses") and protocol.h (scattered
// requests), walking the replies in request order: every op finishes (none
// hangs once the owner has hung up); an op succeeds exactly when every
// chunk of it got a well-formed OK reply (id and kind of the oldest
// outstanding request, zero reserved fields; a read's payload length equal
// to its length, and the payload whole; an atomic's 8, and its word whole;
// a write's zero); a refusal the owner sent fails the op with the owner's
// status; a malformed reply fails that and every later chunk with
// ProtocolError, and the end of the stream with Unavailable; a goodbye
// (kind 0xff, every other field zero) makes the reader send what is
// unanswered again on a new connection, which the fake owner refuses at its
// hello, failing those chunks with the refusal's status; an OK read or
// atomic holds exactly the payload bytes the owner sent for it (a scattered
// read's, range after range at the ranges' local offsets, the bytes between
// them untouched), a write's local memory is as it was; and the reader sent
// exactly the requests of docs/wire-format.md for the plan's chunks (a
// scattered op's cut at the chunk size and at 4096 ranges, each with its
// list of ranges and a write's bytes in list order).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "rdmabuf/status.h"

namespace rdmabuf::fuzz {
namespace {

constexpr size_t kResponse = 24;
constexpr uint8_t kGoodbyeKind = 0xff;

bool is_owner_status(uint8_t code) {
  return code == 0 || code == 1 || code == 2 || code == 3 || code == 11;
}

// The requests docs/wire-format.md and tcp/protocol.h say a reader sends
// for `plan`, all on buffer 1: at remote offset 0 of each op, or at a
// scattered op's ranges.
std::vector<uint8_t> reference_requests(const ReaderPlan& plan) {
  std::vector<uint8_t> out;
  const OwnedBuffer& target = kOwnedBuffers[0];
  Token token = token_of(target);
  uint64_t request_id = 1;
  for (const PlannedChunk& c : planned_chunks(plan)) {
    uint8_t h[64] = {};
    h[0] = c.kind;
    std::memcpy(h + 8, &request_id, 8);
    std::memcpy(h + 16, &target.id, 8);
    std::memcpy(h + 24, token.data(), token.size());
    uint64_t region = target.size;
    std::memcpy(h + 40, &region, 8);
    // A scattered request's offset is its number of ranges; the list follows.
    const uint64_t offset = c.scattered() ? c.pieces.size() : c.op_offset;
    std::memcpy(h + 48, &offset, 8);
    std::memcpy(h + 56, &c.length, 8);
    out.insert(out.end(), h, h + sizeof h);
    for (size_t k = 0; c.scattered() && k < c.pieces.size(); ++k) {
      const uint64_t range[2] = {c.pieces[k].remote_offset, c.pieces[k].length};
      const auto* p = reinterpret_cast<const uint8_t*>(range);
      out.insert(out.end(), p, p + sizeof range);
    }
    if (c.kind == 3 || c.kind == 4) {
      const PlannedOperands o = planned_operands(c.op, c.kind);
      const uint64_t operands[2] = {o.first, o.second};
      const auto* p = reinterpret_cast<const uint8_t*>(operands);
      out.insert(out.end(), p, p + sizeof operands);
    }
    if (c.write()) {  // piece after piece
      for (const OpRange& piece : c.pieces) {
        auto from = initial_local(c.op).begin() + static_cast<ptrdiff_t>(piece.local_offset);
        out.insert(out.end(), from, from + static_cast<ptrdiff_t>(piece.length));
      }
    }
    ++request_id;
  }
  return out;
}

struct Expected {
  std::vector<StatusCode> op_code;
  std::vector<std::vector<uint8_t>> local;
};

// The reader of docs/wire-format.md, given `replies` for `plan`.
Expected reference_reader(const ReaderPlan& plan, std::span<const uint8_t> replies) {
  Expected e;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    e.op_code.push_back(StatusCode::kOk);
    const std::vector<uint8_t>& initial = initial_local(i);
    e.local.emplace_back(initial.begin(), initial.begin() + static_cast<ptrdiff_t>(
                                                                planned_local_bytes(plan.ops[i])));
  }
  std::vector<std::vector<uint8_t>> received = e.local;
  size_t pos = 0;
  StatusCode broken = StatusCode::kOk;  // set once the connection is gone
  uint64_t request_id = 1;
  for (const PlannedChunk& c : planned_chunks(plan)) {
    StatusCode code = broken;
    if (broken == StatusCode::kOk) {
      if (replies.size() - pos < kResponse) {
        code = broken = StatusCode::kUnavailable;
      } else {
        std::span<const uint8_t> h = replies.subspan(pos, kResponse);
        pos += kResponse;
        const uint8_t status = h[1];
        const uint64_t payload = load<uint64_t>(h, 16);
        const bool zero_fields = status == 0 && load<uint16_t>(h, 2) == 0 &&
                                 load<uint32_t>(h, 4) == 0 && load<uint64_t>(h, 8) == 0 &&
                                 payload == 0;
        if (h[0] == kGoodbyeKind && zero_fields) {
          // The owner closes this connection: the reader sends what is
          // unanswered again on a new one, which this owner refuses.
          code = broken = kRefusedAgain;
        } else if (load<uint64_t>(h, 8) != request_id || h[0] != (c.kind | 0x80) ||
                   load<uint16_t>(h, 2) != 0 || load<uint32_t>(h, 4) != 0 ||
                   !is_owner_status(status) || (status != 0 && payload != 0) ||
                   (status == 0 && c.write() && payload != 0) ||
                   (status == 0 && c.returns_bytes() && payload != c.length)) {
          code = broken = StatusCode::kProtocolError;
        } else if (status != 0) {
          code = static_cast<StatusCode>(status);
        } else if (c.returns_bytes()) {
          // Piece after piece, as far as they arrived.
          const size_t arrived =
              static_cast<size_t>(std::min<uint64_t>(c.length, replies.size() - pos));
          size_t left = arrived;
          for (const OpRange& piece : c.pieces) {
            const size_t n = std::min(static_cast<size_t>(piece.length), left);
            std::copy(replies.begin() + static_cast<ptrdiff_t>(pos),
                      replies.begin() + static_cast<ptrdiff_t>(pos + n),
                      received[c.op].begin() + static_cast<ptrdiff_t>(piece.local_offset));
            pos += n;
            left -= n;
          }
          if (arrived < c.length) code = broken = StatusCode::kUnavailable;
        }
      }
    }
    if (code != StatusCode::kOk && e.op_code[c.op] == StatusCode::kOk) e.op_code[c.op] = code;
    ++request_id;
  }
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    if (e.op_code[i] == StatusCode::kOk && !plan.ops[i].write) e.local[i] = received[i];
  }
  return e;
}

}  // namespace
}  // namespace rdmabuf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmabuf;
  using namespace rdmabuf::fuzz;
  std::span<const uint8_t> in(data, size);
  ReaderPlan plan;
  if (!ReaderPlan::parse(in, &plan)) return -1;  // not a plan: keep out of the corpus
  ReaderOutcome got = run_reader(plan, in);
  RDMABUF_FUZZ_CHECK(got.finished);
  Expected want = reference_reader(plan, in);
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    RDMABUF_FUZZ_CHECK(got.op_status[i].code() == want.op_code[i]);
    // A failed read may have received part of its bytes; only OK ones are
    // compared in full.
    if (want.op_code[i] == StatusCode::kOk || plan.ops[i].write) {
      RDMABUF_FUZZ_CHECK(got.local[i] == want.local[i]);
    }
  }
  // What the reader sent, as far as the owner took it before hanging up.
  std::vector<uint8_t> requests = reference_requests(plan);
  RDMABUF_FUZZ_CHECK(got.requests.size() <= requests.size() &&
                     std::equal(got.requests.begin(), got.requests.end(), requests.begin()));
  return 0;
}
