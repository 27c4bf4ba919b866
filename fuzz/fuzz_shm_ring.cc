// Fuzzes what a same-host endpoint reads from the shared memory its peer
// writes: the record headers and heads of core/endpoint/shm_channel.h
// (docs/wire-format.md, "The shared-memory channel").
//
// Each input is a program of 13-byte steps, {u8 op, u32 arg, u64 word}
// little-endian, run against a fresh channel (a real memfd, created and
// opened as two endpoints would), the opener being the side under test and
// a second mapping of the file playing its peer:
//   op % 4 == 0: the peer stores `word` at byte (arg mod ring size, rounded
//                down to 8) of the ring the opener reads;
//   op % 4 == 1: the opener peeks and consumes `arg` bytes (at most those
//                it was shown);
//   op % 4 == 2: the opener reads up to `arg` mod 70000 bytes (read_some);
//   op % 4 == 3: the peer stores `word` as the head of the ring the opener
//                writes (how much it claims to have read), and the opener
//                writes a record of `arg` mod (most_whole_write() + 64)
//                bytes.
//
// Checks: nothing crashes or touches memory it should not
// (AddressSanitizer); every view peek() gives lies within the ring it reads;
// a read never says it copied more than asked; the only errors are the ones
// a peer can cause (ProtocolError; InvalidArgument for a write larger than
// a record may be); and the opener's writes never touch the ring it reads.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/socket.h"
#include "core/endpoint/shm_channel.h"
#include "fuzz/fuzz_support.h"

namespace {

using namespace rdmabuf;

// The file's layout (docs/wire-format.md): a page, then ring 0 (which the
// creator writes and the opener reads), then ring 1. Ring 1's head, the
// opener's reader's progress as the creator sees it, is at 64 + 128.
constexpr size_t kPage = 4096;
constexpr size_t kRing1HeadAt = 64 + 128;

template <typename T>
T take(const uint8_t*& at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  at += sizeof value;
  return value;
}

// A cheap fingerprint of ring 0, to show that the opener's writes stay out
// of it: its words at a spread of places.
uint64_t fingerprint(const uint8_t* ring) {
  uint64_t sum = 0;
  for (size_t at = 0; at < ShmChannel::ring_bytes(); at += 4096 - 8) {
    uint64_t word;
    std::memcpy(&word, ring + at, sizeof word);
    sum = sum * 1099511628211ULL + word;
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto created = ShmChannel::create();
  RDMABUF_FUZZ_CHECK(created.ok());
  std::unique_ptr<ShmChannel> creator = std::move(created).value();
  auto opened = ShmChannel::open(creator->offer());
  RDMABUF_FUZZ_CHECK(opened.ok());
  std::unique_ptr<ShmChannel> opener = std::move(opened).value();

  const size_t file_bytes = kPage + 2 * ShmChannel::ring_bytes();
  const std::string path = "/proc/self/fd/" + std::to_string(creator->offer().fd);
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  RDMABUF_FUZZ_CHECK(fd.valid());
  void* mapped = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  RDMABUF_FUZZ_CHECK(mapped != MAP_FAILED);
  uint8_t* base = static_cast<uint8_t*>(mapped);
  uint8_t* ring0 = base + kPage;

  std::vector<uint8_t> out(70000);
  std::vector<uint8_t> record(ShmChannel::most_whole_write() + 64, 0x5a);
  const uint8_t* at = data;
  constexpr size_t kStep = 1 + 4 + 8;
  for (size_t left = size; left >= kStep; left -= kStep) {
    const uint8_t op = take<uint8_t>(at);
    const uint32_t arg = take<uint32_t>(at);
    const uint64_t word = take<uint64_t>(at);
    switch (op % 4) {
      case 0: {
        const size_t where = (arg % ShmChannel::ring_bytes()) & ~size_t{7};
        std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(ring0 + where)).store(word);
        break;
      }
      case 1: {
        auto seen = opener->peek();
        if (!seen.ok()) {
          RDMABUF_FUZZ_CHECK(seen.status().code() == StatusCode::kProtocolError);
          break;
        }
        const std::span<const uint8_t> ring = opener->incoming_ring();
        RDMABUF_FUZZ_CHECK(seen->empty() ||
                           (seen->data() >= ring.data() && seen->size() <= ring.size() &&
                            seen->data() + seen->size() <= ring.data() + ring.size()));
        opener->consume(std::min<size_t>(arg, seen->size()));
        break;
      }
      case 2: {
        const size_t wanted = arg % out.size();
        auto n = opener->read_some(out.data(), wanted);
        if (n.ok()) {
          RDMABUF_FUZZ_CHECK(*n <= wanted);
        } else {
          RDMABUF_FUZZ_CHECK(n.status().code() == StatusCode::kProtocolError);
        }
        break;
      }
      default: {
        std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + kRing1HeadAt)).store(word);
        const uint64_t before = fingerprint(ring0);
        const std::span<const uint8_t> bytes(record.data(), arg % record.size());
        auto wrote = opener->write_whole(bytes, {});
        if (!wrote.ok()) {
          const StatusCode code = wrote.status().code();
          RDMABUF_FUZZ_CHECK(code == StatusCode::kProtocolError ||
                             (code == StatusCode::kInvalidArgument &&
                              bytes.size() > ShmChannel::most_whole_write()));
        }
        RDMABUF_FUZZ_CHECK(fingerprint(ring0) == before);
        break;
      }
    }
  }
  ::munmap(mapped, file_bytes);
  return 0;
}
