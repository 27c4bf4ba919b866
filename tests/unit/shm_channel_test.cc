// ShmChannel (core/shm_channel.h): the same-host rings an endpoint's frames
// travel through. Bytes arrive in order each way, across wrap-around, a full
// ring, two threads and two processes; doorbells are asked for and taken
// once; and a peer that corrupts the shared file, or offers a file that is
// not the one it created, is refused rather than trusted.
#include <fcntl.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <semaphore>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "core/shm_channel.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// --- The bytes streamed: a function of the position in the stream ---------
//
// Each 8-byte word is a hash of its index and the stream's seed, so a byte
// taken from the wrong lap of a ring (position +- k * ring_bytes()), from the
// other direction, or from memory nobody wrote (zeros) does not match.

constexpr uint64_t kCreatorToOpener = 0x51;  // seeds, one per direction
constexpr uint64_t kOpenerToCreator = 0xa7;

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fills out[0, n) with the stream's bytes at positions [pos, pos + n).
void fill_pattern(uint8_t* out, uint64_t pos, size_t n, uint64_t seed) {
  size_t i = 0;
  while (i < n) {
    const uint64_t word = mix64(((pos + i) >> 3) ^ (seed << 56));
    do {
      out[i] = static_cast<uint8_t>(word >> (((pos + i) & 7) * 8));
      ++i;
    } while (i < n && ((pos + i) & 7) != 0);
  }
}

std::vector<uint8_t> pattern(uint64_t pos, size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  fill_pattern(v.data(), pos, n, seed);
  return v;
}

// Whether got[0, n) are the stream's bytes at [pos, pos + n). `scratch`
// (n bytes at least) spares an allocation in the hot loops.
::testing::AssertionResult matches_pattern(const uint8_t* got, uint64_t pos, size_t n,
                                           uint64_t seed, uint8_t* scratch = nullptr) {
  std::vector<uint8_t> own;
  if (scratch == nullptr) {
    own.resize(n);
    scratch = own.data();
  }
  fill_pattern(scratch, pos, n, seed);
  if (n == 0 || std::memcmp(got, scratch, n) == 0) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (got[i] == scratch[i])
    ++i;
  return ::testing::AssertionFailure()
         << "stream byte " << pos + i << " is " << int{got[i]} << ", not " << int{scratch[i]};
}

// --- Spinning on a ring, with a way out ------------------------------------

// When a wait on a ring that stays full or empty gives up: at its deadline,
// or, when `peer` is set, as soon as that child process has exited.
class Spin {
 public:
  explicit Spin(std::chrono::seconds limit, pid_t peer = 0)
      : deadline_(SteadyClock::now() + limit), peer_(peer) {}

  // Empty while the wait may go on; otherwise why it ends.
  std::string why_stop() {
    if ((++spins_ & 1023) != 0) return "";
    if (SteadyClock::now() > deadline_) return "timed out";
    if (peer_ != 0) {
      siginfo_t info{};
      // WNOWAIT: the test reaps the child itself, and reads its status.
      if (::waitid(P_PID, static_cast<id_t>(peer_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == peer_) {
        return "the peer process ended";
      }
    }
    std::this_thread::yield();
    return "";
  }

 private:
  SteadyClock::time_point deadline_;
  pid_t peer_;
  uint64_t spins_ = 0;
};

// Moves `size` bytes with `step(done)` (a write_some or read_some from
// position `done`), spinning while the ring is full or empty.
template <typename Step>
::testing::AssertionResult move_all(const char* what, size_t size, Spin& spin, Step step) {
  size_t done = 0;
  while (done < size) {
    Result<size_t> n = step(done);
    if (!n.ok()) return ::testing::AssertionFailure() << what << ": " << n.status().to_string();
    done += *n;
    if (*n == 0) {
      const std::string why = spin.why_stop();
      if (!why.empty()) {
        return ::testing::AssertionFailure()
               << what << ": " << why << " with " << size - done << " of " << size << " bytes left";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Writes all of data[0, size), spinning while the ring is full.
::testing::AssertionResult write_all(ShmChannel& ch, const uint8_t* data, size_t size, Spin& spin) {
  return move_all("write_some", size, spin,
                  [&](size_t done) { return ch.write_some(data + done, size - done); });
}

// Reads exactly `size` bytes into out, spinning while the ring is empty.
::testing::AssertionResult read_exact(ShmChannel& ch, uint8_t* out, size_t size, Spin& spin) {
  return move_all("read_some", size, spin,
                  [&](size_t done) { return ch.read_some(out + done, size - done); });
}

// One write_some / read_some that must succeed: its byte count, or 0 with the
// failure recorded.
size_t put(ShmChannel& ch, const uint8_t* data, size_t size) {
  auto n = ch.write_some(data, size);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return n.ok() ? *n : 0;
}

size_t take(ShmChannel& ch, uint8_t* out, size_t size) {
  auto n = ch.read_some(out, size);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return n.ok() ? *n : 0;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

// --- The shared file, as a peer sees it ------------------------------------
//
// A second mapping of a channel's file, made by the test, through which it
// plays a peer that writes what it likes. The layout is core/shm_channel.cc's:
// a 4096-byte first page holding struct Layout {u64 magic, nonce, ring_bytes;
// RingControl rings[2]}, each RingControl alignas(64) with tail, head and
// doorbell on 64-byte lines of their own (so rings[0] starts at 64 and each
// is 192 bytes); then ring 0's bytes, then ring 1's. CheckLayout() verifies
// these offsets against the running code before a test relies on them.
class SharedFile {
 public:
  static constexpr uint64_t kMagic = 0x314e4843504552ULL;  // "REPCHN1"
  static constexpr size_t kMagicAt = 0;
  static constexpr size_t kNonceAt = 8;
  static constexpr size_t kRingBytesAt = 16;
  static constexpr size_t kDataAt = 4096;

  static size_t tail_at(int ring) { return 64 + 192 * static_cast<size_t>(ring); }
  static size_t head_at(int ring) { return tail_at(ring) + 64; }
  static size_t doorbell_at(int ring) { return tail_at(ring) + 128; }
  static size_t data_at(int ring) {
    return kDataAt + static_cast<size_t>(ring) * ShmChannel::ring_bytes();
  }
  static size_t file_bytes() { return kDataAt + 2 * ShmChannel::ring_bytes(); }

  // Maps the file `offer` names; the offer must be this process's.
  explicit SharedFile(const ShmChannel::Offer& offer) {
    path_ = "/proc/self/fd/" + std::to_string(offer.fd);
    fd_ = Fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd_.valid()) return;
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0 || st.st_size <= 0) return;
    size_ = static_cast<size_t>(st.st_size);
    void* base = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (base != MAP_FAILED) base_ = static_cast<uint8_t*>(base);
  }
  ~SharedFile() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;

  bool ok() const { return base_ != nullptr; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }

  uint64_t u64(size_t at) const { return std::atomic_ref<uint64_t>(*field<uint64_t>(at)).load(); }
  void set_u64(size_t at, uint64_t v) { std::atomic_ref<uint64_t>(*field<uint64_t>(at)).store(v); }
  uint32_t u32(size_t at) const { return std::atomic_ref<uint32_t>(*field<uint32_t>(at)).load(); }
  const uint8_t* bytes(size_t at) const { return base_ + at; }

  // The whole file, to show that a refused call changed nothing in it.
  std::vector<uint8_t> snapshot() const { return std::vector<uint8_t>(base_, base_ + size_); }

 private:
  template <typename T>
  T* field(size_t at) const {
    return static_cast<T*>(static_cast<void*>(base_ + at));
  }

  std::string path_;
  Fd fd_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

size_t open_fd_count() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

size_t ring_mapping_count() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("rdmabuf-endpoint") != std::string::npos) ++n;
  }
  return n;
}

// A creator and an opener of one channel, in this process: the creator
// writes ring 0 and reads ring 1, the opener the other way round.
class ShmChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = ShmChannel::create();
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    creator_ = std::move(created).value();
    auto opened = ShmChannel::open(creator_->offer());
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    opener_ = std::move(opened).value();
  }

  // Checks the offsets SharedFile assumes against the running code, on a
  // fresh channel: the header's fields hold what create() wrote, and bytes
  // moved through the API move the tail and head found at those offsets.
  // Leaves both rings empty, at positions 5 (ring 0) and 3 (ring 1).
  void CheckLayout(const SharedFile& file) {
    ASSERT_TRUE(file.ok()) << file.path() << ": " << std::strerror(errno);
    ASSERT_EQ(file.size(), SharedFile::file_bytes());
    ASSERT_EQ(file.u64(SharedFile::kMagicAt), SharedFile::kMagic);
    ASSERT_EQ(file.u64(SharedFile::kNonceAt), creator_->offer().nonce);
    ASSERT_EQ(file.u64(SharedFile::kRingBytesAt), ShmChannel::ring_bytes());
    for (int ring : {0, 1}) {
      ASSERT_EQ(file.u64(SharedFile::tail_at(ring)), 0u) << "ring " << ring;
      ASSERT_EQ(file.u64(SharedFile::head_at(ring)), 0u) << "ring " << ring;
    }
    const std::vector<uint8_t> a = pattern(0, 5, kCreatorToOpener);
    const std::vector<uint8_t> b = pattern(0, 3, kOpenerToCreator);
    ASSERT_EQ(put(*creator_, a.data(), a.size()), 5u);
    ASSERT_EQ(file.u64(SharedFile::tail_at(0)), 5u);
    ASSERT_EQ(put(*opener_, b.data(), b.size()), 3u);
    ASSERT_EQ(file.u64(SharedFile::tail_at(1)), 3u);
    ASSERT_EQ(std::memcmp(file.bytes(SharedFile::data_at(0)), a.data(), a.size()), 0);
    ASSERT_EQ(std::memcmp(file.bytes(SharedFile::data_at(1)), b.data(), b.size()), 0);
    uint8_t got[8];
    ASSERT_EQ(take(*opener_, got, sizeof got), 5u);
    ASSERT_EQ(file.u64(SharedFile::head_at(0)), 5u);
    ASSERT_EQ(take(*creator_, got, sizeof got), 3u);
    ASSERT_EQ(file.u64(SharedFile::head_at(1)), 3u);
    ASSERT_EQ(file.u64(SharedFile::tail_at(0)), 5u);  // a read moves no tail
    ASSERT_EQ(file.u64(SharedFile::tail_at(1)), 3u);
  }

  std::unique_ptr<ShmChannel> creator_;
  std::unique_ptr<ShmChannel> opener_;
};

// Who writes and who reads one ring, and the pattern it carries.
struct Direction {
  ShmChannel* writer;
  ShmChannel* reader;
  int ring;
  uint64_t seed;
};

// --- 1. Order, each way ----------------------------------------------------

TEST_F(ShmChannelTest, BytesArriveInOrderEachWayAndTheDirectionsAreIndependent) {
  const std::vector<uint8_t> a = pattern(0, 3000, kCreatorToOpener);
  const std::vector<uint8_t> b = pattern(0, 1234, kOpenerToCreator);
  std::vector<uint8_t> got(4000);

  // Nothing written yet: both rings are empty.
  EXPECT_EQ(take(*opener_, got.data(), got.size()), 0u);
  EXPECT_EQ(take(*creator_, got.data(), got.size()), 0u);

  // Both sides write, interleaved, before either reads.
  ASSERT_EQ(put(*creator_, a.data(), 1000), 1000u);
  ASSERT_EQ(put(*opener_, b.data(), b.size()), b.size());
  ASSERT_EQ(put(*creator_, a.data() + 1000, 2000), 2000u);

  // Each reader gets exactly the other side's bytes, in order, none of its own.
  ASSERT_EQ(take(*opener_, got.data(), got.size()), a.size());
  EXPECT_TRUE(matches_pattern(got.data(), 0, a.size(), kCreatorToOpener));
  EXPECT_EQ(take(*opener_, got.data(), got.size()), 0u);
  ASSERT_EQ(take(*creator_, got.data(), got.size()), b.size());
  EXPECT_TRUE(matches_pattern(got.data(), 0, b.size(), kOpenerToCreator));
  EXPECT_EQ(take(*creator_, got.data(), got.size()), 0u);

  // A read smaller than what waits takes the first bytes and leaves the rest.
  const std::vector<uint8_t> c = pattern(3000, 10, kCreatorToOpener);
  ASSERT_EQ(put(*creator_, c.data(), c.size()), 10u);
  uint64_t pos = 3000;
  for (size_t piece : {3u, 3u, 4u}) {
    ASSERT_EQ(take(*opener_, got.data(), piece), piece);
    EXPECT_TRUE(matches_pattern(got.data(), pos, piece, kCreatorToOpener));
    pos += piece;
  }
  EXPECT_EQ(take(*opener_, got.data(), got.size()), 0u);
}

// --- 2. Wrap-around ----------------------------------------------------------

// Streams several rings' worth one way in pieces of `write_piece` and
// `read_piece` bytes: fill the ring until a write comes up short, drain a
// little over half of it, again, then drain it all. Every byte checked.
void stream_in_pieces(const Direction& d, size_t write_piece, size_t read_piece) {
  const size_t ring = ShmChannel::ring_bytes();
  const uint64_t total = 5 * uint64_t{ring} + 12345;
  std::vector<uint8_t> out(write_piece), in(read_piece), scratch(read_piece);
  uint64_t written = 0, read = 0;
  int writes_across_the_end = 0, reads_across_the_end = 0;
  while (read < total) {
    while (written < total) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(write_piece, total - written));
      fill_pattern(out.data(), written, want, d.seed);
      const size_t n = put(*d.writer, out.data(), want);
      ASSERT_EQ(n, std::min<uint64_t>(want, ring - (written - read))) << "at " << written;
      if ((written % ring) + n > ring) ++writes_across_the_end;
      written += n;
      if (n < want) break;  // full
    }
    if (written < total) {
      ASSERT_EQ(written - read, ring) << "a short write left room";
    }
    const uint64_t stop = written < total ? read + ring / 2 + 3 : total;
    while (read < stop) {
      const size_t n = take(*d.reader, in.data(), read_piece);
      ASSERT_EQ(n, std::min<uint64_t>(read_piece, written - read)) << "at " << read;
      ASSERT_TRUE(matches_pattern(in.data(), read, n, d.seed, scratch.data()));
      if ((read % ring) + n > ring) ++reads_across_the_end;
      read += n;
    }
  }
  EXPECT_EQ(take(*d.reader, in.data(), read_piece), 0u);
  // The run did what it is for: pieces split by the ring's end.
  EXPECT_GT(writes_across_the_end, 0);
  EXPECT_GT(reads_across_the_end, 0);
}

TEST_F(ShmChannelTest, WrapsAroundInOddSizedPiecesCreatorToOpener) {
  stream_in_pieces(Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener}, 1000, 7);
}

TEST_F(ShmChannelTest, WrapsAroundInOddSizedPiecesOpenerToCreator) {
  stream_in_pieces(Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}, 7, 1000);
}

// A frame goes in as pieces (its header, then the message, not copied
// together), resumed after `skip` bytes when the ring filled: the reader
// sees one stream, in order, across the ring's end.
TEST_F(ShmChannelTest, PiecesWrittenTogetherArriveAsOneStreamAcrossTheEnd) {
  const size_t ring = ShmChannel::ring_bytes();
  const uint64_t total = 3 * uint64_t{ring} + 777;
  const std::vector<uint8_t> all = pattern(0, total, kCreatorToOpener);
  std::vector<uint8_t> in(ring);
  uint64_t written = 0, read = 0;
  int resumed = 0;
  while (read < total) {
    // Three pieces of odd sizes, the second possibly empty.
    const size_t sizes[] = {5, (written / 3) % 2 == 0 ? size_t{0} : size_t{4099}, 70001};
    std::vector<std::span<const uint8_t>> pieces;
    uint64_t at = written;
    for (size_t size : sizes) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(size, total - at));
      pieces.emplace_back(all.data() + at, n);
      at += n;
    }
    const size_t frame = static_cast<size_t>(at - written);
    size_t done = 0;
    while (done < frame) {
      auto n = creator_->write_some(pieces, done);
      ASSERT_TRUE(n.ok()) << n.status().to_string();
      ASSERT_EQ(*n, std::min<uint64_t>(frame - done, ring - (written + done - read)));
      done += *n;
      if (done == frame) break;
      ++resumed;  // full: drain a little over half, then go on after `done`
      const size_t got = take(*opener_, in.data(), ring / 2 + 11);
      ASSERT_TRUE(matches_pattern(in.data(), read, got, kCreatorToOpener)) << "at " << read;
      read += got;
    }
    written += frame;
    if (written == total) {
      const size_t got = take(*opener_, in.data(), in.size());
      ASSERT_TRUE(matches_pattern(in.data(), read, got, kCreatorToOpener)) << "at " << read;
      read += got;
    }
  }
  EXPECT_EQ(read, total);
  EXPECT_GT(resumed, 0);  // the run did what it is for: frames split by a full ring
}

// --- 3. A full ring ----------------------------------------------------------

TEST_F(ShmChannelTest, AFullRingHoldsExactlyRingBytesAndAReadMakesRoom) {
  const size_t ring = ShmChannel::ring_bytes();
  const std::vector<uint8_t> data = pattern(0, ring + 100, kCreatorToOpener);
  std::vector<uint8_t> got(ring + 100);

  EXPECT_EQ(put(*creator_, data.data(), data.size()), ring);  // exactly one ring fits
  EXPECT_EQ(put(*creator_, data.data() + ring, 100), 0u);     // full
  EXPECT_EQ(put(*creator_, data.data() + ring, 1), 0u);

  // The other direction is not held up by a full ring 0.
  const std::vector<uint8_t> back = pattern(0, 10, kOpenerToCreator);
  EXPECT_EQ(put(*opener_, back.data(), back.size()), back.size());

  // Reading 7 bytes makes room for 7, no more.
  ASSERT_EQ(take(*opener_, got.data(), 7), 7u);
  EXPECT_TRUE(matches_pattern(got.data(), 0, 7, kCreatorToOpener));
  EXPECT_EQ(put(*creator_, data.data() + ring, 100), 7u);
  EXPECT_EQ(put(*creator_, data.data() + ring + 7, 93), 0u);

  // Everything waiting comes out, in order; then there is room for the rest.
  ASSERT_EQ(take(*opener_, got.data(), got.size()), ring);
  EXPECT_TRUE(matches_pattern(got.data(), 7, ring, kCreatorToOpener));
  EXPECT_EQ(put(*creator_, data.data() + ring + 7, 93), 93u);
  ASSERT_EQ(take(*opener_, got.data(), got.size()), 93u);
  EXPECT_TRUE(matches_pattern(got.data(), ring + 7, 93, kCreatorToOpener));

  ASSERT_EQ(take(*creator_, got.data(), got.size()), back.size());
  EXPECT_TRUE(matches_pattern(got.data(), 0, back.size(), kOpenerToCreator));
}

TEST_F(ShmChannelTest, AWholeWriteGoesInEntirelyOrNotAtAllAcrossTheEnd) {
  const size_t ring = ShmChannel::ring_bytes();
  const std::vector<uint8_t> data = pattern(0, 2 * ring, kCreatorToOpener);
  std::vector<uint8_t> got(ring);
  // Fill all but 40 bytes, and read 1000 back: the tail sits 40 bytes
  // before the end, with 1040 bytes of room, part of it past the end.
  ASSERT_EQ(put(*creator_, data.data(), ring - 40), ring - 40);
  ASSERT_EQ(take(*opener_, got.data(), 1000), 1000u);
  uint64_t written = ring - 40;

  // `first` (an empty one too) and the pieces go in together, in order.
  const std::span<const uint8_t> pieces[] = {{data.data() + written + 30, 0},
                                             {data.data() + written + 30, 70}};
  auto wrote = creator_->write_whole({data.data() + written, 30}, pieces);
  ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
  EXPECT_TRUE(*wrote);
  written += 100;

  // 940 bytes of room: 900 go in; then 41 more do not, not even in part,
  // and 40 do.
  wrote = creator_->write_whole({data.data() + written, 900}, std::span(pieces, 0));
  ASSERT_TRUE(wrote.ok());
  EXPECT_TRUE(*wrote);
  const std::span<const uint8_t> tail[] = {{data.data() + written + 900, 41}};
  wrote = creator_->write_whole({}, tail);
  ASSERT_TRUE(wrote.ok());
  EXPECT_FALSE(*wrote);
  const std::span<const uint8_t> fits[] = {{data.data() + written + 900, 40}};
  wrote = creator_->write_whole({}, fits);
  ASSERT_TRUE(wrote.ok());
  EXPECT_TRUE(*wrote);
  written += 940;

  // Everything comes out in order: what the first fill left, then the rest.
  uint64_t read = 1000;
  while (read < written) {
    const size_t n = take(*opener_, got.data(), got.size());
    ASSERT_GT(n, 0u);
    ASSERT_TRUE(matches_pattern(got.data(), read, n, kCreatorToOpener)) << "at " << read;
    read += n;
  }
  EXPECT_EQ(read, written);

  // More than the ring holds is an error, not a wait.
  wrote = creator_->write_whole({data.data(), ring + 1}, std::span(pieces, 0));
  EXPECT_EQ(wrote.status().code(), StatusCode::kInvalidArgument);
}

// --- 4. Two threads ----------------------------------------------------------

TEST_F(ShmChannelTest, TwoThreadsStream64MiBInRandomPieces) {
  constexpr uint64_t kTotal = uint64_t{64} << 20;
  constexpr size_t kMaxPiece = size_t{128} << 10;
  // Piece sizes spread over every scale from 1 byte to kMaxPiece.
  auto piece = [](std::mt19937_64& rng) {
    const unsigned scale = static_cast<unsigned>(rng() % 18);  // up to 2^17
    return static_cast<size_t>(1 + rng() % (uint64_t{1} << scale));
  };
  std::atomic<bool> stop{false};
  std::string writer_error;
  const auto started = SteadyClock::now();

  std::thread writer([&] {
    std::mt19937_64 rng(1);
    std::vector<uint8_t> out(kMaxPiece);
    Spin spin(30s);
    uint64_t written = 0;
    while (written < kTotal && !stop.load(std::memory_order_relaxed)) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(piece(rng), kTotal - written));
      fill_pattern(out.data(), written, n, kCreatorToOpener);
      auto done = write_all(*creator_, out.data(), n, spin);
      if (!done) {
        writer_error = done.message();
        break;
      }
      written += n;
    }
  });

  std::mt19937_64 rng(2);
  std::vector<uint8_t> in(kMaxPiece), scratch(kMaxPiece);
  Spin spin(30s);
  uint64_t read = 0;
  while (read < kTotal) {
    auto n = opener_->read_some(in.data(), piece(rng));
    if (!n.ok()) {
      ADD_FAILURE() << "read_some at " << read << ": " << n.status().to_string();
      break;
    }
    if (*n == 0) {
      const std::string why = spin.why_stop();
      if (!why.empty()) {
        ADD_FAILURE() << "reading: " << why << " at " << read;
        break;
      }
      continue;
    }
    auto same = matches_pattern(in.data(), read, *n, kCreatorToOpener, scratch.data());
    if (!same) {
      ADD_FAILURE() << same.message();
      break;
    }
    read += *n;
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(writer_error, "");
  EXPECT_EQ(read, kTotal);
  uint8_t extra;
  EXPECT_EQ(take(*opener_, &extra, 1), 0u);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - started).count();
  std::printf("    64 MiB through one ring in %lld ms\n", static_cast<long long>(ms));
}

// --- 5. A corrupt peer ---------------------------------------------------------

TEST_F(ShmChannelTest, TheLayoutTheCorruptionTestsAssumeIsTheOneInUse) {
  SharedFile file(creator_->offer());
  // create() leaves a doorbell requested both ways (the first write rings).
  ASSERT_TRUE(file.ok()) << file.path() << ": " << std::strerror(errno);
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(0)), 1u);
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(1)), 1u);
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  // The doorbells are where they are assumed to be: taken, then asked for.
  EXPECT_TRUE(creator_->doorbell_requested());
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(0)), 0u);
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(1)), 1u);
  EXPECT_TRUE(opener_->doorbell_requested());
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(1)), 0u);
  EXPECT_TRUE(opener_->request_doorbell());
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(0)), 1u);
  EXPECT_EQ(file.u32(SharedFile::doorbell_at(1)), 0u);
}

TEST_F(ShmChannelTest, AReaderRefusesATailItsPeerCorrupted) {
  const size_t ring = ShmChannel::ring_bytes();
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  for (const Direction& d : {Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener},
                             Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}}) {
    SCOPED_TRACE("ring " + std::to_string(d.ring));
    const size_t tail_at = SharedFile::tail_at(d.ring);
    // 60 bytes waiting, the reader's head away from 0.
    const uint64_t start = file.u64(tail_at);
    const std::vector<uint8_t> data = pattern(start, 100, d.seed);
    ASSERT_EQ(put(*d.writer, data.data(), data.size()), 100u);
    std::vector<uint8_t> got(2 * ring);
    ASSERT_EQ(take(*d.reader, got.data(), 40), 40u);
    const uint64_t head = file.u64(SharedFile::head_at(d.ring));
    const uint64_t tail = file.u64(tail_at);
    ASSERT_EQ(tail - head, 60u);

    for (uint64_t bad : {head + 10 * uint64_t{ring}, head + ring + 1, head - 1, ~uint64_t{0},
                         head + (uint64_t{1} << 63)}) {
      SCOPED_TRACE("tail " + std::to_string(bad) + ", head " + std::to_string(head));
      file.set_u64(tail_at, bad);
      const std::vector<uint8_t> before = file.snapshot();
      std::fill(got.begin(), got.end(), 0xa5);
      auto n = d.reader->read_some(got.data(), got.size());
      EXPECT_EQ(n.status().code(), StatusCode::kProtocolError);
      EXPECT_TRUE(file.snapshot() == before) << "a refused read changed the shared file";
      EXPECT_EQ(std::count(got.begin(), got.end(), 0xa5), static_cast<ptrdiff_t>(got.size()))
          << "a refused read copied bytes out";
    }

    // Nothing moved: with the tail put back, the stream goes on where it was.
    file.set_u64(tail_at, tail);
    ASSERT_EQ(take(*d.reader, got.data(), got.size()), 60u);
    EXPECT_TRUE(matches_pattern(got.data(), start + 40, 60, d.seed));
  }
}

TEST_F(ShmChannelTest, AWriterRefusesAHeadItsPeerCorrupted) {
  const size_t ring = ShmChannel::ring_bytes();
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  for (const Direction& d : {Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener},
                             Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}}) {
    SCOPED_TRACE("ring " + std::to_string(d.ring));
    const size_t head_at = SharedFile::head_at(d.ring);
    const uint64_t start = file.u64(SharedFile::tail_at(d.ring));
    // A writer looks at the head when it needs more room than it knew of:
    // these writes ask for a whole ring.
    const std::vector<uint8_t> data = pattern(start, 100 + ring, d.seed);
    ASSERT_EQ(put(*d.writer, data.data(), 100), 100u);
    std::vector<uint8_t> got(ring);
    ASSERT_EQ(take(*d.reader, got.data(), 40), 40u);
    const uint64_t head = file.u64(head_at);
    const uint64_t tail = file.u64(SharedFile::tail_at(d.ring));
    ASSERT_EQ(tail - head, 60u);

    for (uint64_t bad :
         {tail + 1, tail + 10 * uint64_t{ring}, tail - ring - 1, tail + (uint64_t{1} << 63)}) {
      SCOPED_TRACE("head " + std::to_string(bad) + ", tail " + std::to_string(tail));
      file.set_u64(head_at, bad);
      const std::vector<uint8_t> before = file.snapshot();
      auto n = d.writer->write_some(data.data() + 100, ring);
      EXPECT_EQ(n.status().code(), StatusCode::kProtocolError);
      EXPECT_TRUE(file.snapshot() == before) << "a refused write changed the shared file";
    }

    // The bound is exact: a head that says the ring is full is no error.
    file.set_u64(head_at, tail - ring);
    auto full = d.writer->write_some(data.data() + 100, ring);
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    EXPECT_EQ(*full, 0u);

    // Nothing moved: with the head put back, the stream goes on where it was.
    file.set_u64(head_at, head);
    ASSERT_EQ(put(*d.writer, data.data() + 100, 64), 64u);
    ASSERT_EQ(take(*d.reader, got.data(), got.size()), 124u);
    EXPECT_TRUE(matches_pattern(got.data(), start + 40, 124, d.seed));
  }
}

// --- 6. Offers that do not name these rings ----------------------------------

TEST_F(ShmChannelTest, OpenRefusesAnOfferForAnotherFileHostOrNamespace) {
  const ShmChannel::Offer good = creator_->offer();
  const size_t fds_before = open_fd_count();
  const size_t maps_before = ring_mapping_count();

  auto expect_refused = [](const ShmChannel::Offer& offer, const std::string& says) {
    auto opened = ShmChannel::open(offer);
    EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(opened.status().message().find(says), std::string::npos)
        << "\"" << opened.status().message() << "\" does not say \"" << says << "\"";
  };
  {
    SCOPED_TRACE("another nonce");
    ShmChannel::Offer o = good;
    o.nonce ^= 1;
    expect_refused(o, "is not the shared rings the peer offered");
  }
  {
    SCOPED_TRACE("another host");
    ShmChannel::Offer o = good;
    o.host_id += "-elsewhere";
    expect_refused(o, "another host");
    o.host_id = "";
    expect_refused(o, "another host");
  }
  {
    SCOPED_TRACE("another PID namespace");
    ShmChannel::Offer o = good;
    o.pid_namespace = 0;
    expect_refused(o, "another PID namespace");
    o.pid_namespace = good.pid_namespace + 1;
    expect_refused(o, "another PID namespace");
  }
  {
    SCOPED_TRACE("no such fd");
    ShmChannel::Offer o = good;
    o.fd = 999999;
    expect_refused(o, "cannot open");
  }
  {
    SCOPED_TRACE("no such process");
    ShmChannel::Offer o = good;
    o.pid = 0x7ffffffe;  // above any pid_max
    expect_refused(o, "cannot open");
  }
  {
    SCOPED_TRACE("a file of another size");
    Fd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(null.valid());
    ShmChannel::Offer o = good;
    o.fd = static_cast<uint32_t>(null.get());
    expect_refused(o, "is not an endpoint's shared rings");
  }
  {
    SCOPED_TRACE("a file of the right size that create() did not write");
    Fd blank(static_cast<int>(
        ::syscall(SYS_memfd_create, "rdmabuf-test-blank", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
    ASSERT_TRUE(blank.valid());
    ASSERT_EQ(::ftruncate(blank.get(), static_cast<off_t>(SharedFile::file_bytes())), 0);
    ShmChannel::Offer o = good;
    o.fd = static_cast<uint32_t>(blank.get());
    // Not sealed at its size: it could shrink under the mapping.
    expect_refused(o, "not sealed at its size");
    ASSERT_EQ(::fcntl(blank.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    expect_refused(o, "is not the shared rings the peer offered");
    o.nonce = 0;  // the blank file's "nonce"
    expect_refused(o, "is not the shared rings the peer offered");
  }
  {
    SCOPED_TRACE("a header with another magic or ring size");
    SharedFile file(good);
    ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
    file.set_u64(SharedFile::kRingBytesAt, 2 * ShmChannel::ring_bytes());
    expect_refused(good, "is not the shared rings the peer offered");
    file.set_u64(SharedFile::kRingBytesAt, ShmChannel::ring_bytes());
    file.set_u64(SharedFile::kMagicAt, SharedFile::kMagic ^ 1);
    expect_refused(good, "is not the shared rings the peer offered");
    file.set_u64(SharedFile::kMagicAt, SharedFile::kMagic);
  }

  // A refusal keeps no descriptor or mapping; the good offer still opens.
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(ring_mapping_count(), maps_before);
  auto opened = ShmChannel::open(good);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
}

TEST_F(ShmChannelTest, AClosedChannelKeepsNoDescriptorOrMapping) {
  const size_t fds_before = open_fd_count();
  const size_t maps_before = ring_mapping_count();
  for (int i = 0; i < 50; ++i) {
    auto created = ShmChannel::create();
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    auto opened = ShmChannel::open((*created)->offer());
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    EXPECT_EQ(ring_mapping_count(), maps_before + 2);
  }
  EXPECT_EQ(open_fd_count(), fds_before);
  EXPECT_EQ(ring_mapping_count(), maps_before);
}

// --- 7. Doorbells ------------------------------------------------------------

TEST_F(ShmChannelTest, TheFirstWriteEachWayRingsADoorbell) {
  // create() marks both readers as asleep: the first write each way rings.
  for (ShmChannel* writer : {creator_.get(), opener_.get()}) {
    const uint8_t byte = 1;
    ASSERT_EQ(put(*writer, &byte, 1), 1u);
    EXPECT_TRUE(writer->doorbell_requested());
    EXPECT_FALSE(writer->doorbell_requested()) << "one request, two doorbells";
    ASSERT_EQ(put(*writer, &byte, 1), 1u);
    EXPECT_FALSE(writer->doorbell_requested()) << "a doorbell nobody asked for";
  }
}

TEST_F(ShmChannelTest, ADoorbellIsAskedForOnAnEmptyRingAndTakenOncePerRequest) {
  // Take the requests create() leaves.
  ASSERT_TRUE(creator_->doorbell_requested());
  ASSERT_TRUE(opener_->doorbell_requested());
  for (const Direction& d : {Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener},
                             Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}}) {
    SCOPED_TRACE("ring " + std::to_string(d.ring));
    const std::vector<uint8_t> data = pattern(0, 30, d.seed);
    std::vector<uint8_t> got(64);

    // An empty ring: the reader may sleep. Asking twice is still one request,
    // and it is this direction's: the reader's own writes do not see it.
    EXPECT_TRUE(d.reader->request_doorbell());
    EXPECT_TRUE(d.reader->request_doorbell());
    EXPECT_FALSE(d.reader->doorbell_requested());
    ASSERT_EQ(put(*d.writer, data.data(), 10), 10u);
    EXPECT_TRUE(d.writer->doorbell_requested());
    EXPECT_FALSE(d.writer->doorbell_requested());
    // No new request, no doorbell.
    ASSERT_EQ(put(*d.writer, data.data() + 10, 10), 10u);
    EXPECT_FALSE(d.writer->doorbell_requested());

    // Bytes waiting: do not sleep, until all are read.
    EXPECT_FALSE(d.reader->request_doorbell());
    ASSERT_EQ(take(*d.reader, got.data(), 4), 4u);
    EXPECT_FALSE(d.reader->request_doorbell());
    ASSERT_EQ(take(*d.reader, got.data() + 4, got.size() - 4), 16u);
    EXPECT_TRUE(matches_pattern(got.data(), 0, 20, d.seed));
    EXPECT_TRUE(d.reader->request_doorbell());
    ASSERT_EQ(put(*d.writer, data.data() + 20, 10), 10u);
    EXPECT_TRUE(d.writer->doorbell_requested());
    EXPECT_FALSE(d.writer->doorbell_requested());
    ASSERT_EQ(take(*d.reader, got.data(), got.size()), 10u);
    EXPECT_TRUE(matches_pattern(got.data(), 20, 10, d.seed));
  }
}

// The endpoint's use, on two threads: a reader that finds the ring empty asks
// for a doorbell and sleeps unless bytes came meanwhile; the writer rings
// when asked after a write. A request or a write the other side missed would
// leave the reader asleep; its sleep gives up after 10 s with a failure.
// Where the kernel offers membarrier's global expedited fences, both sides
// use them: the writers skip their fence, and AReaderThatSleepsIsAlwaysWoken
// tests that the readers' membarrier settles the race instead.
TEST_F(ShmChannelTest, WritersSkipTheirFenceWhereMembarrierIsOffered) {
  constexpr long kNeeded =
      MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
  const long offered = ::syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0u, 0);
  if (offered < 0 || (offered & kNeeded) != kNeeded) {
    GTEST_SKIP() << "membarrier's global expedited fences are not offered here: the writers "
                    "fence (the sleep test then tests that)";
  }
  EXPECT_TRUE(creator_->writes_without_fence());
  EXPECT_TRUE(opener_->writes_without_fence());
}

TEST_F(ShmChannelTest, AReaderThatSleepsIsAlwaysWoken) {
  constexpr int kMessages = 20000;
  constexpr size_t kMaxMessage = 64;
  ASSERT_TRUE(creator_->doorbell_requested());  // create()'s request
  std::counting_semaphore<> bell(0);            // the doorbells rung
  std::atomic<uint64_t> consumed{0};
  std::atomic<bool> stop{false};
  std::string writer_error;

  std::thread writer([&] {
    std::vector<uint8_t> out(kMaxMessage);
    Spin spin(30s);
    uint64_t written = 0;
    for (int i = 0; i < kMessages && !stop.load(); ++i) {
      // Now and then wait until the reader has caught up, so that it goes to
      // sleep just as the next message comes: the race the doorbell settles.
      while (i % 16 == 0 && consumed.load() < written && !stop.load()) {
        if (!spin.why_stop().empty()) break;
      }
      const size_t n = 1 + static_cast<size_t>(mix64(static_cast<uint64_t>(i)) % kMaxMessage);
      fill_pattern(out.data(), written, n, kCreatorToOpener);
      auto done = write_all(*creator_, out.data(), n, spin);
      if (!done) {
        writer_error = done.message();
        break;
      }
      written += n;
      if (creator_->doorbell_requested()) bell.release();
    }
  });

  uint64_t total = 0;
  for (int i = 0; i < kMessages; ++i)
    total += 1 + mix64(static_cast<uint64_t>(i)) % kMaxMessage;
  std::vector<uint8_t> in(4096), scratch(4096);
  uint64_t read = 0;
  int sleeps = 0;
  while (read < total) {
    auto n = opener_->read_some(in.data(), in.size());
    if (!n.ok()) {
      ADD_FAILURE() << "read_some: " << n.status().to_string();
      break;
    }
    if (*n > 0) {
      auto same = matches_pattern(in.data(), read, *n, kCreatorToOpener, scratch.data());
      if (!same) {
        ADD_FAILURE() << same.message();
        break;
      }
      read += *n;
      consumed.store(read);
      continue;
    }
    if (!opener_->request_doorbell()) continue;  // bytes came meanwhile
    if (!bell.try_acquire_for(10s)) {
      ADD_FAILURE() << "the reader slept through a write: no doorbell at " << read << " of "
                    << total;
      break;
    }
    ++sleeps;
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(writer_error, "");
  EXPECT_EQ(read, total);
  EXPECT_GT(sleeps, 0) << "the reader never slept: the test tested nothing";
}

// --- 8. Another process --------------------------------------------------------

// What the child of AnotherProcessOpensTheOfferAndEchoesEveryMessage exits with.
enum ChildExit : int {
  kChildOk = 0,
  kChildOpenFailed = 2,
  kChildReadFailed = 3,
  kChildWrongBytes = 4,
  kChildWriteFailed = 5,
};

uint64_t message_bytes(int i) {
  return 1 + mix64(static_cast<uint64_t>(i) + 1000) % 5000;
}

// The child: opens the parent's rings by the offer alone and echoes
// `messages` messages, checking each.
int echo_child(const ShmChannel::Offer& offer, int messages) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The child inherited the creator's descriptor: closed, only the parent's
  // (/proc/PID/fd/FD of the offer's pid) can be what it opens.
  ::close(static_cast<int>(offer.fd));
  auto opened = ShmChannel::open(offer);
  if (!opened.ok()) {
    std::fprintf(stderr, "child: %s\n", opened.status().to_string().c_str());
    return kChildOpenFailed;
  }
  ShmChannel& ch = **opened;
  std::vector<uint8_t> buf(5000), scratch(5000);
  Spin spin(20s);
  uint64_t pos = 0;
  for (int i = 0; i < messages; ++i) {
    const size_t n = static_cast<size_t>(message_bytes(i));
    auto got = read_exact(ch, buf.data(), n, spin);
    if (!got) {
      std::fprintf(stderr, "child: %s\n", got.message());
      return kChildReadFailed;
    }
    auto same = matches_pattern(buf.data(), pos, n, kCreatorToOpener, scratch.data());
    if (!same) {
      std::fprintf(stderr, "child: message %d: %s\n", i, same.message());
      return kChildWrongBytes;
    }
    // Echoed with the other direction's pattern, so that the parent can tell
    // an echo from its own bytes.
    fill_pattern(buf.data(), pos, n, kOpenerToCreator);
    auto sent = write_all(ch, buf.data(), n, spin);
    if (!sent) {
      std::fprintf(stderr, "child: %s\n", sent.message());
      return kChildWriteFailed;
    }
    pos += n;
  }
  return kChildOk;
}

TEST_F(ShmChannelTest, AnotherProcessOpensTheOfferAndEchoesEveryMessage) {
  constexpr int kMessages = 2000;
  opener_.reset();  // the child opens the rings instead
  const ShmChannel::Offer offer = creator_->offer();
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) ::_exit(echo_child(offer, kMessages));

  std::vector<uint8_t> out(5000), in(5000), scratch(5000);
  Spin spin(20s, child);
  uint64_t pos = 0;
  for (int i = 0; i < kMessages && !HasFailure(); ++i) {
    const size_t n = static_cast<size_t>(message_bytes(i));
    fill_pattern(out.data(), pos, n, kCreatorToOpener);
    EXPECT_TRUE(write_all(*creator_, out.data(), n, spin)) << "message " << i;
    EXPECT_TRUE(read_exact(*creator_, in.data(), n, spin)) << "message " << i;
    EXPECT_TRUE(matches_pattern(in.data(), pos, n, kOpenerToCreator, scratch.data()))
        << "message " << i;
    pos += n;
  }
  if (HasFailure()) ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == kChildOk)
      << "the child: " << describe_wait_status(status);
}

// --- A peer that shrinks the file ----------------------------------------------
//
// Either side holds the shared memfd read-write; were it able to ftruncate
// it, the other side's next load or store in its mapping would raise SIGBUS
// and kill that process. The file is sealed at its size, and open() refuses
// one that is not.
TEST_F(ShmChannelTest, APeerThatShrinksTheFileCannotCrashTheOtherSide) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // A channel of the child's own: the fixture's file stays whole.
    auto created = ShmChannel::create();
    if (!created.ok()) ::_exit(2);
    auto opened = ShmChannel::open((*created)->offer());
    if (!opened.ok()) ::_exit(3);
    // The opener's side turns hostile: it shrinks the file it was given.
    // The seals refuse it.
    const std::string path = "/proc/self/fd/" + std::to_string((*created)->offer().fd);
    Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) ::_exit(4);
    if (::ftruncate(fd.get(), 0) != 0) {
      // Refused: the file cannot shrink under its users.
    }
    uint8_t bytes[16] = {};
    // Either may fail with a status; neither may crash.
    auto wrote = (*created)->write_some(bytes, sizeof bytes);
    auto got = (*created)->read_some(bytes, sizeof bytes);
    (void)wrote;
    (void)got;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the side whose file its peer shrank: " << describe_wait_status(status);
}

}  // namespace
}  // namespace rdmabuf
