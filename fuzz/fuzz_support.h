// What the fuzz targets share: reporting a broken invariant, feeding fuzz
// input to decoders that read from a socket, and the fake owner and reader
// the tcp targets (and the corpus generator, make_corpus.cc) talk to.
//
// Everything here runs the library's real code; only the peer on the other
// end of the socket is played by the fuzz input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "common/socket.h"
#include "rdmabuf/buffer.h"
#include "rdmabuf/op.h"
#include "rdmabuf/status.h"

// Reports a broken invariant as a crash, so that libFuzzer saves the input.
#define RDMABUF_FUZZ_CHECK(cond)                                                              \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz invariant broken: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      __builtin_trap();                                                                       \
    }                                                                                         \
  } while (0)

namespace rdmabuf::fuzz {

// --- Sockets ----------------------------------------------------------------

// A connected pair of stream (AF_UNIX) sockets: the code under test uses
// `local`; `remote` plays the peer.
struct SocketPair {
  Fd local;
  Fd remote;
};
SocketPair socket_pair();

// A socket pair whose `local` end holds exactly `bytes` followed by end of
// stream (the remote end is shut down for writing, but stays open, so
// `local` may still send). A decoder reading `local` never waits, so any
// deadline works. Bytes beyond what the socket buffer takes (several
// hundred KiB; far above the fuzzers' -max_len) are dropped.
SocketPair fed_with(std::span<const uint8_t> bytes);

// Everything readable on `fd` now, without waiting.
std::vector<uint8_t> take_available(int fd);

// The little-endian integer at `at` of `bytes` (which must hold it).
template <typename T>
T load(std::span<const uint8_t> bytes, size_t at) {
  T value{};
  __builtin_memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

// --- The owner of the tcp targets -------------------------------------------

// The fake owner's manager id, and the reader's.
constexpr uint64_t kOwnerId = 0x0f0e0d0c0b0a0908;
constexpr uint64_t kReaderId = 0x1122334455667788;

// The buffers the owner's registry holds. Buffer 1 is larger than the
// largest read the reader target makes; buffer 2 is small, so that bounds
// are easy to hit.
struct OwnedBuffer {
  uint64_t id;
  uint8_t token_byte;  // the token is 16 times this byte
  size_t size;
};
constexpr OwnedBuffer kOwnedBuffers[] = {{1, 0xa1, 32 << 10}, {2, 0xb2, 256}};
Token token_of(const OwnedBuffer& buffer);
// The bytes of buffer kOwnedBuffers[index] before any write.
const std::vector<uint8_t>& initial_contents(size_t index);

// The owner of docs/wire-format.md ("tcp data frames", "What each side
// refuses") and backends/tcp/protocol.h (scattered requests, kinds 5 and 6)
// serving `requests` (the bytes a reader sends after the hello)
// from kOwnedBuffers, as initial_contents left them: a model to check the
// real one against.
struct OwnerModel {
  // Every reply it owes, in order: one per well-formed request before the
  // first it must refuse, and before a write whose payload is cut short.
  std::vector<uint8_t> replies;
  // The buffers afterwards, in kOwnedBuffers order.
  std::vector<std::vector<uint8_t>> buffers;
  // False when the input ends in the middle of a request, or has one the
  // owner must refuse: the owner then hangs up, and may do so without
  // sending the replies it has gathered.
  bool clean = true;
  // A write cut short by the end of the input leaves these bytes of buffer
  // `cut_buffer` unspecified (the owner may have applied part of it): a
  // plain write's range; a scattered write's, from the lowest byte of its
  // ranges to the highest.
  size_t cut_buffer = 0, cut_begin = 0, cut_end = 0;
};
OwnerModel model_owner(std::span<const uint8_t> requests);

// Serves `requests` with a real tcp::ServerConnection, over a socket pair,
// from a real Registry holding kOwnedBuffers, reset to initial_contents
// first. Plays a reader that sends `requests`, keeps its side open until it
// has received the replies model_owner says it is owed (a reader that shuts
// its side down abandons the connection: the owner then drops its writes),
// then shuts it down and takes what comes until the owner hangs up.
// Returns the bytes the connection sent. `contents`, when not null,
// receives each buffer's bytes afterwards (in kOwnedBuffers order).
std::vector<uint8_t> serve_requests(std::span<const uint8_t> requests,
                                    std::vector<std::vector<uint8_t>>* contents = nullptr);

// --- The reader of the tcp targets ------------------------------------------

// A batch of ops on buffer 1 of the owner (each at remote offset 0, but
// for a scattered op's ranges), chunked as a tcp::Peer with one stream
// chunks them. Decoded from the first bytes of an input: byte 0, bits 0-1:
// ops - 1; bit 2: chunk size 64 KiB (else 4 KiB); then a byte per op: bit
// 0 write (else read), bits 1-3 its length (an index into kReadLengths or
// kWriteLengths); bit 4: instead, an atomic on the word at offset 0 (bit
// 5: compare-and-swap, else fetch-and-add), with the operands
// planned_operands gives; else bit 6: instead, a scattered read or write
// of the ranges planned_ranges gives (bits 1-3: which list). Writes are at
// most 16 KiB, so the reader always sends a write's payload together with
// its header.
struct ReaderPlan {
  struct PlannedOp {
    bool write = false;
    uint64_t length = 0;  // the bytes it moves (a scattered op's: its ranges')
    uint8_t atomic = 0;   // 0: a read or write; else the tcp request kind (3, 4)
    uint8_t ranges = 0;   // 0: one range; else 1 + the index of its planned_ranges
  };
  std::vector<PlannedOp> ops;
  uint64_t chunk_size = 4096;

  // Parses the plan at the front of `bytes`; the rest is left in `bytes`.
  // False when `bytes` is too short to hold one.
  static bool parse(std::span<const uint8_t>& bytes, ReaderPlan* plan);
  // The bytes parse() reads back as this plan (for the corpus).
  std::vector<uint8_t> encode() const;
};
constexpr size_t kMaxPlannedOps = 4;
// What the request of atomic op `op` carries after its header: fetch-and-add
// (add, 0), compare-and-swap (expected, desired). Op::compare_and_swap
// takes (expected, desired) too.
struct PlannedOperands {
  uint64_t first, second;
};
constexpr PlannedOperands planned_operands(size_t op, uint8_t kind) {
  return kind == 3 ? PlannedOperands{0x0101010101010101u * (op + 1), 0}
                   : PlannedOperands{op, 0xa5a5a5a5a5a5a5a5u + op};
}
constexpr uint64_t kReadLengths[] = {1, 8, 100, 4096, 4097, 16384, 20000, 32768};
constexpr uint64_t kWriteLengths[] = {1, 8, 100, 4096, 4097, 16384, 4095, 2};
// The ranges of a scattered op (list `index`, 0..7), in buffer 1 and in the
// op's local memory (at most 32 KiB): never overlapping on either side,
// some out of order, some across a chunk's end, one list of more than
// 4096 ranges (one request's most). Their lengths add up to at most 16 KiB.
const std::vector<OpRange>& planned_ranges(size_t index);
// The bytes op `op`'s local memory spans.
uint64_t planned_local_bytes(const ReaderPlan::PlannedOp& op);

// One request of a plan, as docs/wire-format.md and tcp/protocol.h say a
// reader cuts an op: `length` bytes from byte `op_offset` of the op's bytes
// (a scattered op's ranges taken one after another), at most chunk_size of
// them, and for a scattered op at most 4096 ranges (one range cut between
// two requests counts in both; a request ends as soon as it holds either
// most).
struct PlannedChunk {
  size_t op;
  uint8_t kind;        // the request's (1 to 6)
  uint64_t op_offset;  // within the op's bytes
  uint64_t length;
  // Where its bytes lie, in order: remote offsets in buffer 1, local ones
  // in the op's memory (a plain op's one piece: op_offset on both sides).
  std::vector<OpRange> pieces;
  bool write() const { return kind == 2 || kind == 6; }
  bool scattered() const { return kind == 5 || kind == 6; }
  // Whether an OK reply carries `length` bytes (a read's, an atomic's word).
  bool returns_bytes() const { return !write(); }
};
std::vector<PlannedChunk> planned_chunks(const ReaderPlan& plan);

// What one run of a plan gave.
struct ReaderOutcome {
  std::vector<Status> op_status;
  std::vector<std::vector<uint8_t>> local;  // each op's local memory afterwards
  std::vector<uint8_t> requests;            // what the reader sent after its hello
  bool finished = false;                    // every op finished in time
};
// Op `op`'s local memory before a run (what a write sends): its first
// planned_local_bytes are the op's.
const std::vector<uint8_t>& initial_local(size_t op);

// The status run_reader's owner refuses a second connection with, at its
// hello: the reader opens one only after a goodbye.
constexpr StatusCode kRefusedAgain = StatusCode::kResourceExhausted;

// Runs `plan` with a real tcp::Peer (one stream) against a fake owner on a
// loopback TCP socket. The owner answers the reader's hello with OK as
// kOwnerId, sends `replies` as they are, and shuts its side down; it
// refuses any further connection with kRefusedAgain. Waits up
// to 10 s for every op to finish. With `expect_requests` > 0 the owner
// first waits until it has read that many request bytes (for the corpus
// generator; a fuzz run passes 0 and so never waits for the reader).
ReaderOutcome run_reader(const ReaderPlan& plan, std::span<const uint8_t> replies,
                         size_t expect_requests = 0);

// The request bytes `plan` makes a reader send: 64 per chunk, plus a
// scattered chunk's 16 per range, the payload of each write chunk and the
// 16 operand bytes of each atomic.
size_t request_bytes(const ReaderPlan& plan);

}  // namespace rdmabuf::fuzz
