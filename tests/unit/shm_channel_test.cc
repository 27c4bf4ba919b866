// ShmChannel (core/endpoint/shm_channel.h): the same-host rings an endpoint's frames
// travel through, each write one record. Bytes arrive in order each way,
// across records, wrap-around, a full ring, two threads and two processes; a
// write goes in whole or not at all, exactly when the record rule says it
// has room; doorbells are asked for and taken once; each side sees
// whether the peer's reader last waited on its CPU; and a peer that
// corrupts the shared file, or offers a file that is not the one it created,
// is refused rather than trusted.
#include <fcntl.h>
#include <linux/membarrier.h>
#include <sched.h>
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
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <semaphore>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "core/endpoint/shm_channel.h"
#include "tests/helpers/pinned.h"
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

// Moves `size` bytes with `step(done)` (a write or a read from position
// `done`: how many bytes it moved, 0 when the ring was full or empty),
// spinning while the ring is full or empty.
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

// Writes all of data[0, size) as whole records of most_whole_write() bytes
// at most, spinning while the ring has not room for the next.
::testing::AssertionResult write_all(ShmChannel& ch, const uint8_t* data, size_t size, Spin& spin) {
  return move_all("write_whole", size, spin, [&](size_t done) -> Result<size_t> {
    const size_t n = std::min(size - done, ShmChannel::most_whole_write());
    RDMABUF_ASSIGN_OR_RETURN(const bool wrote, ch.write_whole({data + done, n}, {}));
    return wrote ? n : 0;
  });
}

// Reads exactly `size` bytes into out, spinning while the ring is empty.
::testing::AssertionResult read_exact(ShmChannel& ch, uint8_t* out, size_t size, Spin& spin) {
  return move_all("read_some", size, spin,
                  [&](size_t done) { return ch.read_some(out + done, size - done); });
}

// One write_whole (of data[0, size), as one record) / read_some that must
// succeed: its byte count (for a write: all or 0), or 0 with the failure
// recorded.
size_t put(ShmChannel& ch, const uint8_t* data, size_t size) {
  auto wrote = ch.write_whole({data, size}, {});
  EXPECT_TRUE(wrote.ok()) << wrote.status().to_string();
  return wrote.ok() && *wrote ? size : 0;
}

size_t take(ShmChannel& ch, uint8_t* out, size_t size) {
  auto n = ch.read_some(out, size);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return n.ok() ? *n : 0;
}

// One peek() that must succeed: the bytes it shows, or none with the failure
// recorded.
std::span<const uint8_t> look(ShmChannel& ch) {
  auto seen = ch.peek();
  EXPECT_TRUE(seen.ok()) << seen.status().to_string();
  return seen.ok() ? *seen : std::span<const uint8_t>();
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

std::string hex(uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(v));
  return text;
}

// --- The record rule, as the test works it out -------------------------------
//
// Where core/endpoint/shm_channel.h puts each write: one record, a header word then
// the bytes, from a multiple of record_align() to the next multiple past its
// bytes; at the start of the next lap instead, past a wrap word, when it
// would reach past the ring's end. A write of L bytes goes in when the
// bytes it skips to the lap's start (if any), its record and the word after
// it (zeroed: the next record's header) fit the room: the ring's bytes less
// those from the reader's head to the write position. The head the reader
// stores is its read position, past the header word and the bytes it took,
// not rounded up to a line.
//
// A RecordModel follows one ring as the channel should: the tests ask it
// whether a write fits, and check the channel's answer and the file's words
// against it.
class RecordModel {
 public:
  static constexpr uint64_t kHeaderBytes = sizeof(uint64_t);

  // The ring's bytes a record of `size` bytes takes, its header included.
  static uint64_t record_bytes(size_t size) {
    const uint64_t align = ShmChannel::record_align();
    return (kHeaderBytes + size + align - 1) / align * align;
  }

  uint64_t tail() const { return tail_; }  // where the next record goes
  uint64_t head() const { return head_; }  // the head the reader stored
  uint64_t waiting() const { return waiting_; }
  uint64_t room() const { return ShmChannel::ring_bytes() - (tail_ - head_); }

  // The bytes a write of `size` skips to reach the next lap's start: 0 when
  // its record fits before the ring's end.
  uint64_t skip_for(size_t size) const {
    const uint64_t ring = ShmChannel::ring_bytes();
    const uint64_t at = tail_ % ring;
    return at + record_bytes(size) > ring ? ring - at : 0;
  }
  bool fits(size_t size) const {
    return skip_for(size) + record_bytes(size) + kHeaderBytes <= room();
  }

  // A write the channel took: where its record went, and the bytes before
  // the ring's end it skipped for that (a wrap word at their start).
  struct Placed {
    uint64_t at;
    uint64_t skipped;
  };
  Placed write(size_t size) {
    const uint64_t skipped = skip_for(size);
    const uint64_t at = tail_ + skipped;
    records_.push_back(Record{at, size});
    tail_ = at + record_bytes(size);
    waiting_ += size;
    return Placed{at, skipped};
  }

  // `n` bytes the reader took (at most those waiting): whether they lay on
  // both sides of the ring's end.
  bool read(size_t n) {
    if (n == 0) return false;
    const uint64_t ring = ShmChannel::ring_bytes();
    bool first = true;
    uint64_t first_lap = 0;
    while (n > 0 && !records_.empty()) {
      const Record& r = records_.front();
      const uint64_t from = r.at + kHeaderBytes + read_in_front_;
      if (first) first_lap = from / ring;
      first = false;
      const size_t k = std::min(n, r.size - read_in_front_);
      head_ = from + k;
      read_in_front_ += k;
      waiting_ -= k;
      n -= k;
      if (read_in_front_ == r.size) {
        records_.pop_front();
        read_in_front_ = 0;
      }
    }
    EXPECT_EQ(n, 0u) << "the model read more than was written";
    return (head_ - 1) / ring != first_lap;
  }

  // What peek() shows: the rest of the record being read, or the next one.
  size_t rest_of_record() const {
    return records_.empty() ? 0 : records_.front().size - read_in_front_;
  }

 private:
  struct Record {
    uint64_t at;  // where its header lies
    size_t size;
  };
  std::deque<Record> records_;  // those not all read, oldest first
  size_t read_in_front_ = 0;    // of the oldest
  uint64_t tail_ = 0;
  uint64_t head_ = 0;
  uint64_t waiting_ = 0;
};

// --- The shared file, as a peer sees it ------------------------------------
//
// A second mapping of a channel's file, made by the test, through which it
// plays a peer that writes what it likes. The layout is core/endpoint/shm_channel.cc's:
// a 4096-byte first page holding struct Layout {u64 magic, nonce, ring_bytes;
// RingControl rings[2]}, each RingControl alignas(64) with the head on one
// 64-byte line and the doorbell and reader_fences (u32 each) on the next (so
// rings[0] starts at 64 and each is 128 bytes); then ring 0's records, then
// ring 1's. A record's header word: its length in the low 32 bits, "REC1"
// in the high ones; a wrap word: "WRAP" in the high ones, 0 in the low.
// CheckLayout() verifies these against the running code before a test
// relies on them.
class SharedFile {
 public:
  static constexpr uint64_t kMagic = 0x324e4843504552ULL;            // "REPCHN2"
  static constexpr uint64_t kRecordMark = 0x52454331;                // "REC1"
  static constexpr uint64_t kWrapWord = uint64_t{0x57524150} << 32;  // "WRAP"
  static constexpr size_t kMagicAt = 0;
  static constexpr size_t kNonceAt = 8;
  static constexpr size_t kRingBytesAt = 16;
  static constexpr size_t kDataAt = 4096;

  static size_t head_at(int ring) { return 64 + 128 * static_cast<size_t>(ring); }
  static size_t doorbell_at(int ring) { return head_at(ring) + 64; }
  static size_t reader_fences_at(int ring) { return doorbell_at(ring) + 4; }
  static size_t data_at(int ring) {
    return kDataAt + static_cast<size_t>(ring) * ShmChannel::ring_bytes();
  }
  static size_t file_bytes() { return kDataAt + 2 * ShmChannel::ring_bytes(); }
  // Where the word at `position` (counted in bytes ever written) of `ring`
  // lies in the file: a record's header word, where a record starts there.
  static size_t word_at(int ring, uint64_t position) {
    return data_at(ring) + static_cast<size_t>(position % ShmChannel::ring_bytes());
  }
  // The header word of a record of `size` bytes.
  static constexpr uint64_t header(uint64_t size) { return kRecordMark << 32 | size; }

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

// The bytes CheckLayout() writes to `ring` (and reads back).
size_t layout_check_bytes(int ring) {
  return ring == 0 ? 5 : 3;
}

// `ring` as CheckLayout() leaves it: one record written and read.
RecordModel after_layout_check(int ring) {
  RecordModel model;
  model.write(layout_check_bytes(ring));
  model.read(layout_check_bytes(ring));
  return model;
}

// Who writes and who reads one ring, and the pattern it carries.
struct Direction {
  ShmChannel* writer;
  ShmChannel* reader;
  int ring;
  uint64_t seed;
};

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

  // Checks the offsets and words SharedFile assumes against the running
  // code, on a fresh channel: the header's fields hold what create() wrote;
  // a write puts its record where SharedFile looks, a header word then its
  // bytes, with the word after it zero; and a read moves the head found
  // there to its read position. Leaves both rings empty, as
  // after_layout_check() says: the next record at 64, the heads at 8 + 5
  // (ring 0) and 8 + 3 (ring 1).
  void CheckLayout(const SharedFile& file) {
    ASSERT_TRUE(file.ok()) << file.path() << ": " << std::strerror(errno);
    ASSERT_EQ(file.size(), SharedFile::file_bytes());
    ASSERT_EQ(file.u64(SharedFile::kMagicAt), SharedFile::kMagic);
    ASSERT_EQ(file.u64(SharedFile::kNonceAt), creator_->offer().nonce);
    ASSERT_EQ(file.u64(SharedFile::kRingBytesAt), ShmChannel::ring_bytes());
    for (int ring : {0, 1}) {
      ASSERT_EQ(file.u64(SharedFile::head_at(ring)), 0u) << "ring " << ring;
    }
    const Direction directions[] = {{creator_.get(), opener_.get(), 0, kCreatorToOpener},
                                    {opener_.get(), creator_.get(), 1, kOpenerToCreator}};
    for (const Direction& d : directions) {
      SCOPED_TRACE("ring " + std::to_string(d.ring));
      const size_t size = layout_check_bytes(d.ring);
      const std::vector<uint8_t> data = pattern(0, size, d.seed);
      ASSERT_EQ(put(*d.writer, data.data(), size), size);
      ASSERT_EQ(file.u64(SharedFile::word_at(d.ring, 0)), SharedFile::header(size));
      ASSERT_EQ(std::memcmp(file.bytes(SharedFile::word_at(d.ring, 8)), data.data(), size), 0);
      // Where the next record's header goes: nothing there yet.
      ASSERT_EQ(file.u64(SharedFile::word_at(d.ring, ShmChannel::record_align())), 0u);
      ASSERT_EQ(file.u64(SharedFile::head_at(d.ring)), 0u);  // a write moves no head
    }
    for (const Direction& d : directions) {
      SCOPED_TRACE("ring " + std::to_string(d.ring));
      const size_t size = layout_check_bytes(d.ring);
      uint8_t got[8];
      ASSERT_EQ(take(*d.reader, got, sizeof got), size);
      ASSERT_TRUE(matches_pattern(got, 0, size, d.seed));
      // The head is the read position: past the header word and the bytes.
      ASSERT_EQ(file.u64(SharedFile::head_at(d.ring)), 8 + size);
      ASSERT_EQ(file.u64(SharedFile::head_at(d.ring)), after_layout_check(d.ring).head());
      // A read leaves the record as it was.
      ASSERT_EQ(file.u64(SharedFile::word_at(d.ring, 0)), SharedFile::header(size));
    }
    ASSERT_EQ(file.u64(SharedFile::head_at(0)), 8u + 5);  // the other ring's read left it
  }

  std::unique_ptr<ShmChannel> creator_;
  std::unique_ptr<ShmChannel> opener_;
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

  // Each reader gets exactly the other side's bytes, in order, none of its
  // own, across the records they came in.
  ASSERT_EQ(take(*opener_, got.data(), got.size()), a.size());
  EXPECT_TRUE(matches_pattern(got.data(), 0, a.size(), kCreatorToOpener));
  EXPECT_EQ(take(*opener_, got.data(), got.size()), 0u);
  ASSERT_EQ(take(*creator_, got.data(), got.size()), b.size());
  EXPECT_TRUE(matches_pattern(got.data(), 0, b.size(), kOpenerToCreator));
  EXPECT_EQ(take(*creator_, got.data(), got.size()), 0u);

  // A read smaller than what waits takes the first bytes and leaves the
  // rest, whether it ends within a record or at its end.
  const std::vector<uint8_t> c = pattern(3000, 10, kCreatorToOpener);
  ASSERT_EQ(put(*creator_, c.data(), 4), 4u);
  ASSERT_EQ(put(*creator_, c.data() + 4, 6), 6u);
  uint64_t pos = 3000;
  for (size_t piece : {3u, 3u, 4u}) {
    ASSERT_EQ(take(*opener_, got.data(), piece), piece);
    EXPECT_TRUE(matches_pattern(got.data(), pos, piece, kCreatorToOpener));
    pos += piece;
  }
  EXPECT_EQ(take(*opener_, got.data(), got.size()), 0u);
}

TEST_F(ShmChannelTest, EachSideSeesWhetherThePeersReaderWaitsOnItsCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  bool answers[3] = {};
  if (!testing::RunOnCpu(cpus[0], [&] {
        answers[0] = creator_->peer_waits_on_this_cpu();  // the opener has not said yet
        answers[1] = opener_->peer_waits_on_this_cpu();
        answers[2] = creator_->peer_waits_on_this_cpu();
      })) {
    GTEST_SKIP() << "a thread cannot be pinned to CPU " << cpus[0] << " here";
  }
  EXPECT_FALSE(answers[0]);
  EXPECT_TRUE(answers[1]);
  EXPECT_TRUE(answers[2]);
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU here: no second CPU to move the opener to";
  bool moved = true;
  ASSERT_TRUE(testing::RunOnCpu(cpus[1], [&] { moved = opener_->peer_waits_on_this_cpu(); }));
  EXPECT_FALSE(moved) << "the creator said it waits on another CPU";
  bool back = true;
  ASSERT_TRUE(testing::RunOnCpu(cpus[0], [&] { back = creator_->peer_waits_on_this_cpu(); }));
  EXPECT_FALSE(back) << "the opener said it moved";
}

// A reader that takes bytes in place: peek() shows the rest of the record
// being read, never bytes of two records, and consume() moves on.
TEST_F(ShmChannelTest, PeekShowsTheRestOfOneRecordAndConsumeMovesOn) {
  const std::vector<uint8_t> a = pattern(0, 130, kCreatorToOpener);
  EXPECT_FALSE(opener_->has_incoming());
  EXPECT_TRUE(look(*opener_).empty());

  ASSERT_EQ(put(*creator_, a.data(), 100), 100u);
  ASSERT_EQ(put(*creator_, a.data() + 100, 30), 30u);
  EXPECT_TRUE(opener_->has_incoming());
  EXPECT_FALSE(creator_->has_incoming()) << "the other direction's ring";
  std::span<const uint8_t> seen = look(*opener_);
  ASSERT_EQ(seen.size(), 100u);
  EXPECT_TRUE(matches_pattern(seen.data(), 0, 100, kCreatorToOpener));
  // A peek takes nothing: the same again.
  ASSERT_EQ(look(*opener_).size(), 100u);

  opener_->consume(40);
  seen = look(*opener_);
  ASSERT_EQ(seen.size(), 60u);
  EXPECT_TRUE(matches_pattern(seen.data(), 40, 60, kCreatorToOpener));
  opener_->consume(60);
  // The first record all read: the second is what is there now.
  EXPECT_TRUE(opener_->has_incoming());
  seen = look(*opener_);
  ASSERT_EQ(seen.size(), 30u);
  EXPECT_TRUE(matches_pattern(seen.data(), 100, 30, kCreatorToOpener));
  opener_->consume(30);
  EXPECT_FALSE(opener_->has_incoming());
  EXPECT_TRUE(look(*opener_).empty());
  uint8_t extra;
  EXPECT_EQ(take(*opener_, &extra, 1), 0u);
}

// --- 2. Wrap-around ----------------------------------------------------------

// Streams several rings' worth one way in whole records of the sizes
// `write_sizes` (in turn), read in pieces of `read_piece` bytes: fill the
// ring until a write is refused, drain a little over half of what waits,
// again, then drain it all. Every byte checked; every write goes in exactly
// when the record rule says it fits, where it says, and some records go to
// a lap's start past a wrap word.
void stream_in_records(const Direction& d, const SharedFile& file,
                       std::span<const size_t> write_sizes, size_t read_piece) {
  const size_t ring = ShmChannel::ring_bytes();
  const uint64_t total = 5 * uint64_t{ring} + 12345;
  RecordModel model = after_layout_check(d.ring);
  std::vector<uint8_t> out(*std::max_element(write_sizes.begin(), write_sizes.end()));
  std::vector<uint8_t> in(read_piece), scratch(read_piece);
  uint64_t written = 0, read = 0;
  size_t records = 0;
  int refused = 0, wrapped = 0, reads_across_the_end = 0;
  while (read < total) {
    while (written < total) {
      const size_t want = static_cast<size_t>(
          std::min<uint64_t>(write_sizes[records % write_sizes.size()], total - written));
      fill_pattern(out.data(), written, want, d.seed);
      const bool fits = model.fits(want);
      auto wrote = d.writer->write_whole({out.data(), want}, {});
      ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
      ASSERT_EQ(*wrote, fits) << want << " bytes at " << model.tail() << ", the head at "
                              << model.head() << " (room " << model.room() << ")";
      if (!fits) {
        ++refused;
        break;  // full
      }
      const RecordModel::Placed placed = model.write(want);
      ASSERT_EQ(file.u64(SharedFile::word_at(d.ring, placed.at)), SharedFile::header(want))
          << "at " << placed.at;
      ASSERT_EQ(file.u64(SharedFile::word_at(d.ring, model.tail())), 0u) << "at " << model.tail();
      if (placed.skipped > 0) {
        ++wrapped;
        ASSERT_EQ(placed.at % ring, 0u);
        ASSERT_EQ(file.u64(SharedFile::word_at(d.ring, placed.at - placed.skipped)),
                  SharedFile::kWrapWord);
      }
      written += want;
      ++records;
    }
    const uint64_t stop = written < total ? read + (written - read) / 2 + 3 : total;
    while (read < stop) {
      const size_t n = take(*d.reader, in.data(), read_piece);
      ASSERT_EQ(n, std::min<uint64_t>(read_piece, written - read)) << "at " << read;
      ASSERT_TRUE(matches_pattern(in.data(), read, n, d.seed, scratch.data()));
      if (model.read(n)) ++reads_across_the_end;
      ASSERT_EQ(file.u64(SharedFile::head_at(d.ring)), model.head()) << "at " << read;
      read += n;
    }
  }
  EXPECT_EQ(take(*d.reader, in.data(), read_piece), 0u);
  // The run did what it is for: a full ring, records placed past a wrap
  // word, reads that took bytes from both sides of the ring's end.
  EXPECT_GT(refused, 0);
  EXPECT_GT(wrapped, 0);
  EXPECT_GT(reads_across_the_end, 0);
}

TEST_F(ShmChannelTest, WrapsAroundInOddSizedRecordsCreatorToOpener) {
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  const size_t sizes[] = {1000, 4099, 70001, 5};
  stream_in_records(Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener}, file, sizes, 7);
}

TEST_F(ShmChannelTest, WrapsAroundInOddSizedRecordsOpenerToCreator) {
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  // 56 bytes fill a line with their header; 57 take two.
  const size_t sizes[] = {7, 56, 57, 333};
  stream_in_records(Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}, file, sizes,
                    1000);
}

// A frame goes in as pieces (its header, then the message, not copied
// together) in one write_whole: one record, which the reader's peek() shows
// whole, in order with the others, across the ring's end. One refused for
// want of room goes in whole once the reader has made room.
TEST_F(ShmChannelTest, PiecesWrittenTogetherArriveAsOneRecordAcrossTheEnd) {
  const size_t ring = ShmChannel::ring_bytes();
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  RecordModel model = after_layout_check(0);
  const uint64_t total = 3 * uint64_t{ring} + 777;
  const std::vector<uint8_t> all = pattern(0, total, kCreatorToOpener);
  uint64_t written = 0, read = 0;
  int frames = 0, refused = 0, wrapped = 0;

  // Takes bytes in place up to stream position `stop`: each peek() shows the
  // rest of one record, no more, no less.
  auto drain_to = [&](uint64_t stop) {
    while (read < stop) {
      const size_t rest = model.rest_of_record();
      ASSERT_GT(rest, 0u) << "at " << read;
      const std::span<const uint8_t> seen = look(*opener_);
      ASSERT_EQ(seen.size(), rest) << "at " << read;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(rest, stop - read));
      ASSERT_TRUE(matches_pattern(seen.data(), read, n, kCreatorToOpener)) << "at " << read;
      opener_->consume(n);
      model.read(n);
      read += n;
    }
    ASSERT_EQ(file.u64(SharedFile::head_at(0)), model.head());
  };

  while (written < total) {
    // Three pieces of odd sizes, the second possibly empty.
    const size_t sizes[] = {5, frames % 2 == 0 ? size_t{0} : size_t{4099}, 7001};
    std::span<const uint8_t> pieces[3];
    uint64_t at = written;
    for (size_t i = 0; i < 3; ++i) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(sizes[i], total - at));
      pieces[i] = std::span<const uint8_t>(all.data() + at, n);
      at += n;
    }
    const size_t frame = static_cast<size_t>(at - written);
    const bool fits = model.fits(frame);
    auto wrote = creator_->write_whole(pieces[0], std::span(pieces).subspan(1));
    ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
    ASSERT_EQ(*wrote, fits) << frame << " bytes at " << model.tail() << ", the head at "
                            << model.head();
    if (!fits) {
      // Full: take a little over half of what waits, then write the frame
      // again.
      ++refused;
      ASSERT_NO_FATAL_FAILURE(drain_to(read + (written - read) / 2 + 11));
      continue;
    }
    if (model.write(frame).skipped > 0) ++wrapped;
    written += frame;
    ++frames;
  }
  ASSERT_NO_FATAL_FAILURE(drain_to(total));
  EXPECT_FALSE(opener_->has_incoming());
  // The run did what it is for: frames refused by a full ring, and frames
  // placed at a lap's start.
  EXPECT_GT(refused, 0);
  EXPECT_GT(wrapped, 0);
}

// --- 3. A full ring ----------------------------------------------------------

TEST_F(ShmChannelTest, AFullRingHoldsTheRecordsTheRuleSaysAndAReadMakesRoom) {
  const size_t ring = ShmChannel::ring_bytes();
  // Records of 1000 bytes take 1024 of the ring each (a header word, the
  // bytes, then to the next line), and each write needs the word after its
  // record too: an empty ring holds (ring - 8) / 1024 of them, a lap less
  // one record.
  constexpr size_t kSize = 1000;
  ASSERT_EQ(RecordModel::record_bytes(kSize), 1024u);
  const size_t fit = (ring - sizeof(uint64_t)) / 1024;
  ASSERT_EQ(fit, ring / 1024 - 1);
  const std::vector<uint8_t> data = pattern(0, (fit + 2) * kSize, kCreatorToOpener);
  std::vector<uint8_t> got((fit + 2) * kSize);

  for (size_t i = 0; i < fit; ++i) {
    ASSERT_EQ(put(*creator_, data.data() + i * kSize, kSize), kSize) << "record " << i;
  }
  EXPECT_EQ(put(*creator_, data.data() + fit * kSize, kSize), 0u);  // full
  EXPECT_EQ(put(*creator_, data.data() + fit * kSize, kSize), 0u);

  // The other direction is not held up by a full ring 0.
  const std::vector<uint8_t> back = pattern(0, 10, kOpenerToCreator);
  EXPECT_EQ(put(*opener_, back.data(), back.size()), back.size());

  // Reading one record makes room for one more, no more.
  ASSERT_EQ(take(*opener_, got.data(), kSize), kSize);
  EXPECT_TRUE(matches_pattern(got.data(), 0, kSize, kCreatorToOpener));
  EXPECT_EQ(put(*creator_, data.data() + fit * kSize, kSize), kSize);
  EXPECT_EQ(put(*creator_, data.data() + (fit + 1) * kSize, kSize), 0u);

  // Everything waiting comes out, in order; then there is room again.
  ASSERT_EQ(take(*opener_, got.data(), got.size()), fit * kSize);
  EXPECT_TRUE(matches_pattern(got.data(), kSize, fit * kSize, kCreatorToOpener));
  EXPECT_EQ(put(*creator_, data.data() + (fit + 1) * kSize, kSize), kSize);
  ASSERT_EQ(take(*opener_, got.data(), got.size()), kSize);
  EXPECT_TRUE(matches_pattern(got.data(), (fit + 1) * kSize, kSize, kCreatorToOpener));

  ASSERT_EQ(take(*creator_, got.data(), got.size()), back.size());
  EXPECT_TRUE(matches_pattern(got.data(), 0, back.size(), kOpenerToCreator));
}

TEST_F(ShmChannelTest, AWholeWriteGoesInEntirelyOrNotAtAllAndWrapsToTheLapStart) {
  const size_t ring = ShmChannel::ring_bytes();
  const size_t most = ShmChannel::most_whole_write();
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  // Ring 0 as CheckLayout leaves it: the next record at 64, the head at 13.
  const std::vector<uint8_t> data = pattern(0, 3 * ring, kCreatorToOpener);
  std::vector<uint8_t> got(ring);
  auto word = [&](uint64_t position) { return file.u64(SharedFile::word_at(0, position)); };
  auto write = [&](uint64_t from, size_t size) {
    return creator_->write_whole({data.data() + from, size}, {});
  };

  // 2046 records of 1000 bytes (1024 each) bring the writer to 1984 bytes
  // before the ring's end; the reader takes three of them, which gives the
  // ring's start back up to its head at 64 + 2 * 1024 + 8 + 1000 = 3120.
  uint64_t written = 0;
  for (int i = 0; i < 2046; ++i) {
    ASSERT_EQ(put(*creator_, data.data() + written, 1000), 1000u) << "record " << i;
    written += 1000;
  }
  ASSERT_EQ(take(*opener_, got.data(), 3000), 3000u);
  ASSERT_TRUE(matches_pattern(got.data(), 0, 3000, kCreatorToOpener));
  ASSERT_EQ(file.u64(SharedFile::head_at(0)), 3120u);
  uint64_t tail = ring - 1984;  // room: ring - (tail - 3120) = 5104

  // `first` (an empty piece too) and the pieces go in together, in order:
  // one record of 100 bytes, 128 with its header.
  const std::span<const uint8_t> pieces[] = {{data.data() + written + 30, 0},
                                             {data.data() + written + 30, 70}};
  auto wrote = creator_->write_whole({data.data() + written, 30}, pieces);
  ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(word(tail), SharedFile::header(100));
  written += 100;
  tail += 128;  // room 4976, 1856 bytes of it before the ring's end

  // 3100 bytes (a record of 3136) do not fit before the end: they would go
  // to the lap's start, past the 1856 bytes left, and with the word after
  // them need 5000 bytes of room. Refused, nothing written, though 3144
  // would fit the room were a record to wrap round the end.
  std::vector<uint8_t> before = file.snapshot();
  wrote = write(written, 3100);
  ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
  EXPECT_FALSE(*wrote);
  EXPECT_TRUE(file.snapshot() == before) << "a refused write changed the shared file";

  // 1900 bytes (a record of 1920) need 1856 + 1920 + 8 = 3784: they go in at
  // the lap's start, and a wrap word where they would have gone sends the
  // reader there.
  wrote = write(written, 1900);
  ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(word(tail), SharedFile::kWrapWord);
  EXPECT_EQ(word(0), SharedFile::header(1900));
  EXPECT_EQ(std::memcmp(file.bytes(SharedFile::word_at(0, 8)), data.data() + written, 1900), 0);
  EXPECT_EQ(word(1920), 0u);
  written += 1900;
  tail = ring + 1920;  // room: ring - (tail - 3120) = 1200

  // 1145 bytes (a record of 1216, and the word after it) do not fit, not
  // even in part; 1144 (a record of 1152) do.
  before = file.snapshot();
  const std::span<const uint8_t> rest[] = {{data.data() + written + 1000, 145}};
  wrote = creator_->write_whole({data.data() + written, 1000}, rest);
  ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
  EXPECT_FALSE(*wrote);
  EXPECT_TRUE(file.snapshot() == before) << "a refused write changed the shared file";
  wrote = write(written, 1144);
  ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(word(tail), SharedFile::header(1144));
  written += 1144;
  tail += 1152;  // room 48

  // Everything comes out in order: what the first fill left, then the rest.
  uint64_t read = 3000;
  while (read < written) {
    const size_t n = take(*opener_, got.data(), got.size());
    ASSERT_GT(n, 0u);
    ASSERT_TRUE(matches_pattern(got.data(), read, n, kCreatorToOpener)) << "at " << read;
    read += n;
  }
  EXPECT_EQ(read, written);
  EXPECT_EQ(file.u64(SharedFile::head_at(0)), tail);  // 8 + 1144 ends on a line
  EXPECT_FALSE(opener_->has_incoming());

  // The most one write takes goes into an empty ring wherever the writer
  // is: before the ring's end (a record of ring / 2 - 64 from 3072); where
  // it must go to the lap's start; and where that skips the most bytes (a
  // line past where its record would end at the ring's end), with the head
  // 63 bytes short of the writer, the most padding a record leaves.
  const uint64_t record = RecordModel::record_bytes(most);
  const uint64_t worst = ring - record + ShmChannel::record_align();
  for (const int place : {0, 1, 2}) {
    SCOPED_TRACE("place " + std::to_string(place) + ", at " + std::to_string(tail % ring));
    if (place == 2) {
      // Records of filler bytes up to there, the last one's bytes 63 short
      // of its end.
      uint64_t distance = (worst + ring - tail % ring) % ring;
      if (distance < 128) distance += ring;
      while (distance > 0) {
        uint64_t filler = std::min<uint64_t>(distance, ring / 4);
        if (distance != filler && distance - filler < 128) filler -= 128;
        const size_t size = static_cast<size_t>(filler - (distance == filler ? 71 : 8));
        ASSERT_EQ(RecordModel::record_bytes(size), filler);
        wrote = write(written, size);
        ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
        ASSERT_TRUE(*wrote);
        ASSERT_EQ(take(*opener_, got.data(), got.size()), size);
        ASSERT_TRUE(matches_pattern(got.data(), written, size, kCreatorToOpener));
        written += size;
        tail += filler;
        distance -= filler;
      }
      ASSERT_EQ(tail % ring, worst);
      ASSERT_EQ(file.u64(SharedFile::head_at(0)), tail - 63);
    }
    const bool wraps = place > 0;
    ASSERT_EQ(tail % ring + record > ring, wraps);
    wrote = write(written, most);
    ASSERT_TRUE(wrote.ok()) << wrote.status().to_string();
    EXPECT_TRUE(*wrote);
    if (wraps) {
      EXPECT_EQ(word(tail), SharedFile::kWrapWord);
      tail += ring - tail % ring;
    }
    EXPECT_EQ(word(tail), SharedFile::header(most));
    tail += record;
    ASSERT_EQ(take(*opener_, got.data(), got.size()), most);
    EXPECT_TRUE(matches_pattern(got.data(), written, most, kCreatorToOpener));
    written += most;
  }

  // More than that is an error, not a wait, however it is split, and
  // writes nothing.
  before = file.snapshot();
  wrote = write(0, most + 1);
  EXPECT_EQ(wrote.status().code(), StatusCode::kInvalidArgument);
  const std::span<const uint8_t> over[] = {{data.data(), most}, {data.data(), 1}};
  wrote = creator_->write_whole({}, over);
  EXPECT_EQ(wrote.status().code(), StatusCode::kInvalidArgument);
  wrote = write(0, ring);
  EXPECT_EQ(wrote.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(file.snapshot() == before) << "a refused write changed the shared file";
  EXPECT_FALSE(opener_->has_incoming());
}

// --- 4. Two threads ----------------------------------------------------------

TEST_F(ShmChannelTest, TwoThreadsStream64MiBInRandomPieces) {
  constexpr uint64_t kTotal = uint64_t{64} << 20;
  constexpr size_t kMaxPiece = size_t{64} << 10;
  // Piece sizes spread over every scale from 1 byte to kMaxPiece: each
  // written as one record, read in pieces of other sizes.
  auto piece = [](std::mt19937_64& rng) {
    const unsigned scale = static_cast<unsigned>(rng() % 17);  // up to 2^16
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
  // Each reader says beside its doorbell whether it fences for the writer,
  // which then skips its own.
  EXPECT_EQ(file.u32(SharedFile::reader_fences_at(0)), creator_->writes_without_fence() ? 1u : 0u);
  EXPECT_EQ(file.u32(SharedFile::reader_fences_at(1)), opener_->writes_without_fence() ? 1u : 0u);
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

// Moves both ends of `d`'s ring to position `to` (`model` says where they
// are; `to` a multiple of record_align() in the same lap, or at its end):
// records of filler bytes, each read back as soon as it is written. `pos`,
// the stream position of d's pattern, moves on past them.
void advance_to(const Direction& d, RecordModel& model, uint64_t to, uint64_t& pos) {
  const uint64_t quarter = ShmChannel::ring_bytes() / 4;
  std::vector<uint8_t> buf(quarter);
  while (model.tail() < to) {
    // A record that ends exactly where the next is to go: no padding.
    const size_t size =
        static_cast<size_t>(std::min(to - model.tail(), quarter) - RecordModel::kHeaderBytes);
    fill_pattern(buf.data(), pos, size, d.seed);
    ASSERT_EQ(put(*d.writer, buf.data(), size), size);
    ASSERT_EQ(model.write(size).skipped, 0u) << "a filler at " << model.tail() << " wrapped";
    ASSERT_EQ(take(*d.reader, buf.data(), size), size);
    ASSERT_TRUE(matches_pattern(buf.data(), pos, size, d.seed));
    model.read(size);
    pos += size;
  }
  ASSERT_EQ(model.tail(), to);
}

TEST_F(ShmChannelTest, AReaderRefusesARecordHeaderItsPeerCorrupted) {
  const size_t ring = ShmChannel::ring_bytes();
  const uint64_t most = ShmChannel::most_whole_write();
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  for (const Direction& d : {Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener},
                             Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}}) {
    SCOPED_TRACE("ring " + std::to_string(d.ring));
    RecordModel model = after_layout_check(d.ring);
    uint64_t pos = 0;  // in d's pattern
    std::vector<uint8_t> got(ring);
    auto word_at = [&](uint64_t position) { return SharedFile::word_at(d.ring, position); };
    // Writes a record of `size` bytes of the pattern: where it went.
    auto write_record = [&](size_t size) {
      const std::vector<uint8_t> data = pattern(pos + model.waiting(), size, d.seed);
      EXPECT_EQ(put(*d.writer, data.data(), size), size);
      return model.write(size).at;
    };
    // The reader, with the file as the peer left it: kProtocolError, and
    // nothing copied out or changed in the file.
    auto expect_refused = [&](const std::string& what) {
      SCOPED_TRACE(what);
      const std::vector<uint8_t> before = file.snapshot();
      std::fill(got.begin(), got.end(), 0xa5);
      auto n = d.reader->read_some(got.data(), got.size());
      EXPECT_EQ(n.status().code(), StatusCode::kProtocolError);
      EXPECT_EQ(d.reader->peek().status().code(), StatusCode::kProtocolError);
      EXPECT_TRUE(file.snapshot() == before) << "a refused read changed the shared file";
      EXPECT_EQ(std::count(got.begin(), got.end(), 0xa5), static_cast<ptrdiff_t>(got.size()))
          << "a refused read copied bytes out";
    };
    // The bytes waiting, read as they should be.
    auto expect_the_rest = [&] {
      const uint64_t waiting = model.waiting();
      ASSERT_EQ(take(*d.reader, got.data(), got.size()), waiting);
      EXPECT_TRUE(matches_pattern(got.data(), pos, waiting, d.seed));
      model.read(waiting);
      pos += waiting;
      EXPECT_EQ(file.u64(SharedFile::head_at(d.ring)), model.head());
    };

    // A record of 100 bytes waits at 64, after CheckLayout's.
    uint64_t at = write_record(100);
    ASSERT_EQ(at, 64u);
    uint64_t good = file.u64(word_at(at));
    ASSERT_EQ(good, SharedFile::header(100));
    const std::pair<uint64_t, const char*> bad_headers[] = {
        {(SharedFile::kRecordMark + 1) << 32 | 100, "another mark"},
        {100, "no mark"},
        {SharedFile::kRecordMark, "the mark in the length's half"},
        {SharedFile::header(0), "no bytes"},
        {SharedFile::header(most + 1), "more than most_whole_write()"},
        {SharedFile::header(0xffffffff), "the longest length"},
        {~uint64_t{0}, "all ones"},
        {SharedFile::kWrapWord | 100, "a wrap word with a length"},
    };
    for (const auto& [bad, what] : bad_headers) {
      file.set_u64(word_at(at), bad);
      expect_refused(std::string(what) + ": " + hex(bad));
    }
    // A wrap word sends the reader to the lap's start, which must hold a
    // record then: the writer stores it before the wrap word.
    const uint64_t lap_start = file.u64(word_at(0));  // CheckLayout's record, read
    const std::pair<uint64_t, const char*> bad_lap_starts[] = {
        {0, "nothing"},
        {SharedFile::kWrapWord, "another wrap word"},
        {(SharedFile::kRecordMark + 1) << 32 | 100, "another mark"},
        {SharedFile::header(0), "no bytes"},
        {SharedFile::header(most + 1), "more than most_whole_write()"},
    };
    for (const auto& [bad, what] : bad_lap_starts) {
      file.set_u64(word_at(at), SharedFile::kWrapWord);
      file.set_u64(word_at(ring), bad);
      expect_refused(std::string("a wrap to ") + what + ": " + hex(bad));
    }
    file.set_u64(word_at(0), lap_start);
    // Nothing moved: with the header put back, the stream goes on where it
    // was.
    file.set_u64(word_at(at), good);
    ASSERT_NO_FATAL_FAILURE(expect_the_rest());

    // A record of 120 bytes waits in the ring's last two lines: one a byte
    // longer would reach past the end.
    ASSERT_NO_FATAL_FAILURE(advance_to(d, model, ring - 128, pos));
    at = write_record(120);
    ASSERT_EQ(at, ring - 128);
    good = file.u64(word_at(at));
    for (const uint64_t bad : {SharedFile::header(121), SharedFile::header(ring / 4)}) {
      file.set_u64(word_at(at), bad);
      expect_refused("past the ring's end: " + hex(bad));
    }
    // The bound is exact: a record that ends at the ring's end is read.
    file.set_u64(word_at(at), good);
    ASSERT_NO_FATAL_FAILURE(expect_the_rest());

    // A record waits at the next lap's start, where a wrap word has nowhere
    // to send the reader.
    at = write_record(100);
    ASSERT_EQ(at, ring);
    good = file.u64(word_at(at));
    file.set_u64(word_at(at), SharedFile::kWrapWord);
    expect_refused("a wrap word at the lap's start");
    file.set_u64(word_at(at), good);
    ASSERT_NO_FATAL_FAILURE(expect_the_rest());

    // A corrupt header after good records: a read takes the good records'
    // bytes (and gives their room back), the next read is refused.
    write_record(10);
    write_record(20);
    at = write_record(30);
    good = file.u64(word_at(at));
    file.set_u64(word_at(at), SharedFile::header(0));
    auto n = d.reader->read_some(got.data(), got.size());
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    ASSERT_EQ(*n, 30u);
    EXPECT_TRUE(matches_pattern(got.data(), pos, 30, d.seed));
    model.read(30);
    pos += 30;
    EXPECT_EQ(file.u64(SharedFile::head_at(d.ring)), model.head());
    expect_refused("no bytes, after good records");
    file.set_u64(word_at(at), good);
    ASSERT_NO_FATAL_FAILURE(expect_the_rest());
    EXPECT_EQ(model.waiting(), 0u);
  }
}

TEST_F(ShmChannelTest, AWriterRefusesAHeadItsPeerCorrupted) {
  const size_t ring = ShmChannel::ring_bytes();
  const size_t most = ShmChannel::most_whole_write();
  SharedFile file(creator_->offer());
  ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
  for (const Direction& d : {Direction{creator_.get(), opener_.get(), 0, kCreatorToOpener},
                             Direction{opener_.get(), creator_.get(), 1, kOpenerToCreator}}) {
    SCOPED_TRACE("ring " + std::to_string(d.ring));
    RecordModel model = after_layout_check(d.ring);
    const size_t head_at = SharedFile::head_at(d.ring);
    const std::vector<uint8_t> data = pattern(0, 2 * most + 100, d.seed);
    std::vector<uint8_t> got(ring);
    // Half a ring and 100 bytes wait, 40 bytes of them read.
    ASSERT_EQ(put(*d.writer, data.data(), most), most);
    model.write(most);
    ASSERT_EQ(put(*d.writer, data.data() + most, 100), 100u);
    model.write(100);
    ASSERT_EQ(take(*d.reader, got.data(), 40), 40u);
    model.read(40);
    const uint64_t head = file.u64(head_at);
    ASSERT_EQ(head, model.head());
    const uint64_t tail = model.tail();  // the writer's position, past its records
    // A writer looks at the head when it needs more room than it last saw
    // there: another most_whole_write() bytes need more than the ring has
    // (they would go to the lap's start, too).
    ASSERT_FALSE(model.fits(most));
    const std::span<const uint8_t> big(data.data() + most + 100, most);

    for (uint64_t bad :
         {tail + 1, tail + 10 * uint64_t{ring}, tail - ring - 1, tail + (uint64_t{1} << 63)}) {
      SCOPED_TRACE("head " + std::to_string(bad) + ", tail " + std::to_string(tail));
      file.set_u64(head_at, bad);
      const std::vector<uint8_t> before = file.snapshot();
      auto wrote = d.writer->write_whole(big, {});
      EXPECT_EQ(wrote.status().code(), StatusCode::kProtocolError);
      EXPECT_TRUE(file.snapshot() == before) << "a refused write changed the shared file";
    }

    // The bound is exact: a head that says the ring is full is no error.
    file.set_u64(head_at, tail - ring);
    auto full = d.writer->write_whole(big, {});
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    EXPECT_FALSE(*full);

    // Nothing moved: with the head put back, the write waits for room as it
    // would have, and goes in once the reader has taken what waited.
    file.set_u64(head_at, head);
    full = d.writer->write_whole(big, {});
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    EXPECT_FALSE(*full);
    ASSERT_EQ(take(*d.reader, got.data(), got.size()), most + 60);
    EXPECT_TRUE(matches_pattern(got.data(), 40, most + 60, d.seed));
    model.read(most + 60);
    ASSERT_TRUE(model.fits(most));
    EXPECT_EQ(put(*d.writer, big.data(), big.size()), most);
    ASSERT_EQ(take(*d.reader, got.data(), got.size()), most);
    EXPECT_TRUE(matches_pattern(got.data(), most + 100, most, d.seed));
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
    SCOPED_TRACE("a header with another magic, version or ring size");
    SharedFile file(good);
    ASSERT_NO_FATAL_FAILURE(CheckLayout(file));
    file.set_u64(SharedFile::kRingBytesAt, 2 * ShmChannel::ring_bytes());
    expect_refused(good, "is not the shared rings the peer offered");
    file.set_u64(SharedFile::kRingBytesAt, ShmChannel::ring_bytes());
    file.set_u64(SharedFile::kMagicAt, SharedFile::kMagic ^ 1);
    expect_refused(good, "is not the shared rings the peer offered");
    // REPCHN1's: rings of bytes and a shared tail, which this version
    // cannot read (docs/wire-format.md).
    file.set_u64(SharedFile::kMagicAt, 0x314e4843504552ULL);
    expect_refused(good, "is an endpoint's shared rings of another version");
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
    auto wrote = (*created)->write_whole({bytes, sizeof bytes}, {});
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
