// Fuzzes what a manager's tcp backend reads from a reader once the hello is
// done: the request frames, scattered requests' range lists and write
// payloads of a data stream (backends/tcp/server.cc, protocol.h).
//
// Feeds each input, as the bytes a reader sent, to a real
// tcp::ServerConnection serving a real Registry (fuzz_support.h: buffer 1
// of 32 KiB, buffer 2 of 256 B, fixed tokens), over a socket pair, and
// takes everything it sends back.
//
// Checks the replies and the buffers against an owner written from
// docs/wire-format.md and protocol.h (model_owner, fuzz_support.h): every
// reply is exactly the model's (kind | 0x80, status, echoed id, payload
// length, and for an OK read the buffer's bytes as the writes and atomics
// before it left them, never a later one's, a scattered read's range after
// range; for an OK atomic the word's previous value), in order, none
// extra; a scattered request with one range out of bounds is refused whole
// and moves no byte (a write's payload is still consumed); the connection
// ends at the first request the owner must refuse (unknown kind, non-zero
// flags or reserved fields, length 0 or over 1 GiB, an atomic not on 8
// bytes or whose operands are cut short, a fetch-add with a second operand,
// a scattered request of 0 or over 4096 ranges, with an empty range, whose
// range lengths do not add up to its length, or whose list is cut short) or
// at a write whose payload is cut short, and may drop the replies it has
// not sent by then but never sends a wrong one; a stream of only
// well-formed whole requests gets every reply; the buffers hold exactly the
// bytes the model's writes left (a scattered write's ranges in list order,
// a later one winning where they overlap), but for those a write cut short
// may have landed (a scattered one's from its lowest range byte to its
// highest); nothing outside them is touched (AddressSanitizer).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "rdmabuf/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmabuf::fuzz;
  std::span<const uint8_t> in(data, size);
  std::vector<std::vector<uint8_t>> contents;
  std::vector<uint8_t> replies = serve_requests(in, &contents);
  OwnerModel want = model_owner(in);
  RDMABUF_FUZZ_CHECK(replies.size() <= want.replies.size());
  RDMABUF_FUZZ_CHECK(std::equal(replies.begin(), replies.end(), want.replies.begin()));
  if (want.clean) RDMABUF_FUZZ_CHECK(replies.size() == want.replies.size());
  // A write cut short may have landed in part: those bytes are not compared.
  std::vector<uint8_t>& cut = contents[want.cut_buffer];
  std::copy(want.buffers[want.cut_buffer].begin() + static_cast<ptrdiff_t>(want.cut_begin),
            want.buffers[want.cut_buffer].begin() + static_cast<ptrdiff_t>(want.cut_end),
            cut.begin() + static_cast<ptrdiff_t>(want.cut_begin));
  RDMABUF_FUZZ_CHECK(contents == want.buffers);
  return 0;
}
