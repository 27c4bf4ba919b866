// Fuzzes the backends' contexts in a handle: the data a reader's memory and
// ibverbs backends decode from any handle they are given
// (backends/memory/handle_context.cc, backends/ibverbs/handle_context.cc).
//
// Feeds each input, as a context's data, to both decoders.
//
// Checks, beyond no crash and no sanitizer report, that a context that
// decodes keeps to docs/wire-format.md: memory, exactly 48 bytes of version
// 1, a slot below the 16384 of the shared state and a non-zero pid;
// ibverbs, version 2 and a device name of 1 .. 63 bytes without a NUL (so it fits the
// connect message's 64-byte field unchanged); and that it re-encodes to
// exactly the bytes it came from (reserved bytes zero, nothing left over).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backends/ibverbs/handle_context.h"
#include "backends/memory/handle_context.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmabuf;
  std::span<const uint8_t> in(data, size);
  auto same = [&](const std::vector<uint8_t>& bytes) {
    return bytes.size() == in.size() && std::equal(bytes.begin(), bytes.end(), in.begin());
  };

  auto memory = memory::decode_context(in);
  if (memory.ok()) {
    RDMABUF_FUZZ_CHECK(size == 48 && in[0] == 1);
    RDMABUF_FUZZ_CHECK(memory->slot < 16384 && memory->pid != 0);
    RDMABUF_FUZZ_CHECK(same(memory::encode_context(*memory)));
  }

  auto ibverbs = ibverbs::decode_context(in);
  if (ibverbs.ok()) {
    RDMABUF_FUZZ_CHECK(in[0] == 2);
    RDMABUF_FUZZ_CHECK(!ibverbs->device.empty() && ibverbs->device.size() <= 63);
    RDMABUF_FUZZ_CHECK(ibverbs->device.find('\0') == std::string::npos);
    RDMABUF_FUZZ_CHECK(same(ibverbs::encode_context(*ibverbs)));
  }
  return 0;
}
