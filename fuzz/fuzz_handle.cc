// Fuzzes the handle decoders, RemoteBuffer::from_bytes and from_text
// (common/buffer.cc): the bytes any process may be handed as a handle.
//
// Feeds each input three ways: as a handle's binary form; as the same bytes
// resealed (total-length field and CRC-32C rewritten to match, so that
// mutations get past the checksum into the field decoders); and as the
// handle's text form.
//
// Checks, beyond no crash and no sanitizer report, that a handle that
// decodes
//   - keeps to the Limits of docs/wire-format.md: 75 .. 65 535 bytes; at
//     most 8 contexts, each named with 1 .. 32 bytes, no name twice, with
//     at most 4096 bytes of data; owner address and host id of at most 255
//     bytes, the address HOST:PORT; a non-empty buffer with the view inside;
//   - re-encodes to exactly the bytes it came from (to_bytes), and for text
//     to exactly the text without its surrounding whitespace (to_text): a
//     handle has one encoding, so nothing can be smuggled in a second one;
//   - slices as the contract says: the whole view and empty ends fit,
//     nothing past the end does.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/crc32c.h"
#include "common/socket.h"
#include "common/strings.h"
#include "fuzz/fuzz_support.h"
#include "rdmabuf/buffer.h"

namespace rdmabuf::fuzz {
namespace {

constexpr size_t kMinHandle = 75;
constexpr size_t kMaxHandle = 65535;

void check_handle(const RemoteBuffer& h, std::span<const uint8_t> bytes) {
  RDMABUF_FUZZ_CHECK(h.valid());
  RDMABUF_FUZZ_CHECK(bytes.size() >= kMinHandle && bytes.size() <= kMaxHandle);
  std::vector<uint8_t> again = h.to_bytes();
  RDMABUF_FUZZ_CHECK(again.size() == bytes.size() &&
                     std::equal(again.begin(), again.end(), bytes.begin()));

  RDMABUF_FUZZ_CHECK(h.contexts().size() <= 8);
  std::set<std::string> names;
  for (const BackendContext& ctx : h.contexts()) {
    RDMABUF_FUZZ_CHECK(!ctx.backend.empty() && ctx.backend.size() <= 32);
    RDMABUF_FUZZ_CHECK(ctx.data.size() <= 4096);
    RDMABUF_FUZZ_CHECK(names.insert(ctx.backend).second);
    RDMABUF_FUZZ_CHECK(h.context(ctx.backend) == &ctx);
  }
  RDMABUF_FUZZ_CHECK(h.owner().address.size() <= 255 && h.owner().host_id.size() <= 255);
  RDMABUF_FUZZ_CHECK(parse_host_port(h.owner().address).ok());
  RDMABUF_FUZZ_CHECK(h.region_size() > 0);
  RDMABUF_FUZZ_CHECK(h.offset() <= h.region_size() && h.size() <= h.region_size() - h.offset());
  RDMABUF_FUZZ_CHECK(!h.describe().empty());

  auto whole = h.slice(0, h.size());
  RDMABUF_FUZZ_CHECK(whole.ok() && whole->to_bytes() == again);
  RDMABUF_FUZZ_CHECK(h.slice(h.size(), 0).ok());
  RDMABUF_FUZZ_CHECK(!h.slice(h.size(), 1).ok());
  RDMABUF_FUZZ_CHECK(!h.slice(1, h.size()).ok());
  if (h.size() >= 2) {
    auto inner = h.slice(1, h.size() - 2);
    RDMABUF_FUZZ_CHECK(inner.ok() && inner->offset() == h.offset() + 1 && inner->id() == h.id() &&
                       inner->token() == h.token());
  }

  auto from_text = RemoteBuffer::from_text(h.to_text());
  RDMABUF_FUZZ_CHECK(from_text.ok() && from_text->to_bytes() == again);
}

void resealed(std::vector<uint8_t>& bytes) {
  if (bytes.size() < 8 || bytes.size() > kMaxHandle) return;
  auto total = static_cast<uint16_t>(bytes.size());
  std::memcpy(bytes.data() + 6, &total, sizeof total);
  uint32_t crc = crc32c(bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, sizeof crc);
}

}  // namespace
}  // namespace rdmabuf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmabuf;
  using namespace rdmabuf::fuzz;
  std::span<const uint8_t> bytes(data, size);

  auto raw = RemoteBuffer::from_bytes(bytes);
  if (raw.ok()) check_handle(*raw, bytes);

  std::vector<uint8_t> sealed(bytes.begin(), bytes.end());
  resealed(sealed);
  auto fixed = RemoteBuffer::from_bytes(sealed);
  if (fixed.ok()) check_handle(*fixed, sealed);

  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto decoded = RemoteBuffer::from_text(text);
  if (decoded.ok()) {
    check_handle(*decoded, decoded->to_bytes());
    RDMABUF_FUZZ_CHECK(decoded->to_text() == trim(text));
  }
  return 0;
}
