// One reader of many owners over ibverbs: its queue pairs run on its fixed
// I/O threads and share their completion queues, so neither grows with the
// owners it reads. Skips, saying why, where ibverbs is not viable
// (scripts/softroce-vm runs these tests).
#include <string>
#include <thread>

#include "common/socket.h"
#include "tests/helpers/backend_detail.h"
#include "tests/helpers/forge.h"
#include "tests/helpers/threads.h"
#include "tests/integration/ibverbs_pair.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

using IbverbsManyOwnersTest = IbverbsOnlyTest;

std::unique_ptr<Manager> ibverbs_manager(int io_threads = 0) {
  return make_manager([&](Config& c) {
    c.backends = {"ibverbs"};
    c.io_threads = io_threads;
  });
}

// Reads and writes 16 owners at once, every byte checked, then again on
// the same pairs. The reader's pairs run on its I/O threads and share their
// completion queues; each owner (in this process too) serves its pair on
// its I/O threads and takes notices on one thread of its own. So the
// process grows by the reader's threads and one per owner, and nothing per
// pair: before, each pair had a thread on either side.
TEST_F(IbverbsManyOwnersTest, AReadersPairsShareItsThreadsAndCompletionQueues) {
  constexpr int kOwners = 16;
  constexpr int kLoops = 2;
  constexpr uint64_t kSize = 64 << 10;
  auto reader = ibverbs_manager(kLoops);
  ASSERT_NE(reader, nullptr);
  std::vector<std::unique_ptr<Manager>> owners;
  std::vector<LocalMemory> theirs;
  std::vector<RemoteBuffer> handles;
  for (int i = 0; i < kOwners; ++i) {
    owners.push_back(ibverbs_manager(1));
    ASSERT_NE(owners.back(), nullptr);
    theirs.push_back(with_pattern(kSize, 700 + i));
    auto h = owners.back()->register_buffer(theirs.back());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  const int threads_before = threads_of();

  std::vector<LocalMemory> dsts;
  std::vector<Op> reads;
  for (int i = 0; i < kOwners; ++i) {
    dsts.push_back(with_sentinel(kSize));
    reads.push_back(Op::read(handles[i], dsts.back()));
  }
  Transfer t = reader->submit(reads, kTimeout);
  ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
  for (int i = 0; i < kOwners; ++i)
    ASSERT_EQ(find_mismatch(dsts[i].span(), 700 + i), std::nullopt) << "owner " << i;
  EXPECT_EQ(t.op_backend(0), "ibverbs");

  // Writes back on the same pairs: a new pattern into each owner's buffer.
  std::vector<LocalMemory> srcs;
  std::vector<Op> writes;
  for (int i = 0; i < kOwners; ++i) {
    srcs.push_back(with_pattern(kSize, 800 + i));
    writes.push_back(Op::write(handles[i], srcs.back()));
  }
  Transfer w = reader->submit(writes, kTimeout);
  ASSERT_TRUE(w.wait().ok()) << w.status().to_string();
  for (int i = 0; i < kOwners; ++i)
    ASSERT_EQ(find_mismatch(theirs[i].span(), 800 + i), std::nullopt) << "owner " << i;

  EXPECT_EQ(backend_detail(*reader, "ibverbs", "reader queue pairs"), std::to_string(kOwners));
  EXPECT_EQ(backend_detail(*reader, "ibverbs", "reader I/O threads"), std::to_string(kLoops));
  // Eight pairs per thread share two queues: the first has room for 4
  // pairs, the next for twice as many.
  EXPECT_EQ(backend_detail(*reader, "ibverbs", "reader completion queues"),
            std::to_string(2 * kLoops));
  EXPECT_EQ(threads_named("rdmabuf-loop"), kLoops);
  EXPECT_EQ(threads_named("rdmabuf-notices"), kOwners);  // one per owner
  // The handshakes' threads end once idle for 2 s.
  EXPECT_TRUE(wait_for_threads_named("rdmabuf-connect", 0, 10s));
  EXPECT_LE(threads_of() - threads_before, kOwners + kLoops + 1)
      << "the threads grew with the pairs";
}

// A reader that sets up pairs with more owners at once than it runs
// handshakes (64), here owners that never answer: the handshakes beyond
// wait their turn instead of each taking a thread, and every op ends when
// the reader shuts down.
TEST_F(IbverbsManyOwnersTest, HandshakesBeyondTheLimitWaitForAThread) {
  constexpr int kMostHandshakes = 64;  // backends/ibverbs/connection.h
  constexpr int kOwners = kMostHandshakes + 8;
  auto owner = ibverbs_manager(1);
  ASSERT_NE(owner, nullptr);
  LocalMemory theirs = with_pattern(4096, 5);
  auto genuine = owner->register_buffer(theirs);
  ASSERT_TRUE(genuine.ok()) << genuine.status().to_string();
  // One listener that accepts (in the kernel) and never answers, and as
  // many owners there as manager ids: a pair, and a handshake, each.
  auto silent = listen_tcp(HostPort{"127.0.0.1", 0}, 2 * kOwners);  // never accepts
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  auto bound = local_address(silent->get());
  ASSERT_TRUE(bound.ok()) << bound.status().to_string();
  const std::string silent_address = bound->to_string();
  std::vector<Op> reads;
  std::vector<LocalMemory> dsts;
  for (int i = 0; i < kOwners; ++i) {
    auto other = with_manager_id(*genuine, genuine->owner().manager_id + 1 + i);
    ASSERT_TRUE(other.ok());
    auto there = with_address(*other, silent_address);
    ASSERT_TRUE(there.ok());
    dsts.push_back(with_sentinel(4096));
    reads.push_back(Op::read(*there, dsts.back()));
  }

  auto reader = ibverbs_manager(1);
  ASSERT_NE(reader, nullptr);
  const int threads_before = threads_of();
  Transfer t = reader->submit(reads, kTimeout);
  ASSERT_TRUE(wait_for_threads_named("rdmabuf-connect", kMostHandshakes, 10s))
      << threads_named("rdmabuf-connect") << " handshakes under way";
  std::this_thread::sleep_for(200ms);  // the others wait: no thread starts for them
  EXPECT_EQ(threads_named("rdmabuf-connect"), kMostHandshakes);
  EXPECT_LE(threads_of() - threads_before, kMostHandshakes + 2)
      << "a thread for each of " << kOwners << " handshakes";
  EXPECT_FALSE(t.done());

  reader->shutdown();  // ends the handshakes under way, then those waiting
  ASSERT_TRUE(t.wait_for(10s)) << "ops still waiting for their handshakes";
  for (int i = 0; i < kOwners; ++i) {
    EXPECT_FALSE(t.op_status(i).ok()) << "op " << i;
    EXPECT_EQ(find_not(dsts[i].span(), kSentinel), std::nullopt) << "op " << i;
  }
}

// One owner read by 8 readers at once: its sides of their pairs are served
// on its I/O threads, and their receives share completion queues and one
// thread that takes the notices, so the owner adds one thread, not one per
// reader.
TEST_F(IbverbsManyOwnersTest, AnOwnersThreadsDoNotGrowWithItsReaders) {
  constexpr int kReaders = 8;
  constexpr uint64_t kSize = 64 << 10;
  auto owner = ibverbs_manager(1);
  ASSERT_NE(owner, nullptr);
  LocalMemory theirs = with_pattern(kSize * kReaders, 950);
  auto handle = owner->register_buffer(theirs);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  std::vector<std::unique_ptr<Manager>> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.push_back(ibverbs_manager(1));
    ASSERT_NE(readers.back(), nullptr);
  }
  const int threads_before = threads_of();
  std::vector<LocalMemory> dsts;
  std::vector<Transfer> reads;
  for (int i = 0; i < kReaders; ++i) {
    dsts.push_back(with_sentinel(kSize));
    reads.push_back(
        readers[i]->submit({Op::read(slice(*handle, i * kSize, kSize), dsts.back())}, kTimeout));
  }
  for (int i = 0; i < kReaders; ++i) {
    ASSERT_TRUE(reads[i].wait().ok()) << reads[i].status().to_string();
    ASSERT_EQ(find_mismatch(dsts[i].span(), 950, i * kSize), std::nullopt) << "reader " << i;
  }
  EXPECT_EQ(backend_detail(*owner, "ibverbs", "owner-side queue pairs"), std::to_string(kReaders));
  EXPECT_EQ(threads_named("rdmabuf-notices"), 1);
  EXPECT_TRUE(wait_for_threads_named("rdmabuf-connect", 0, 10s));  // idle 2 s, they end
  // Each reader's one I/O thread, and the owner's intake.
  EXPECT_LE(threads_of() - threads_before, kReaders + 1 + 1)
      << "the owner's threads grew with its readers";
}

// A pair whose owner went away fails only its own ops: the other pairs on
// the same thread and completion queue carry on, and the reader reaches a
// new owner afterwards.
TEST_F(IbverbsManyOwnersTest, AnOwnerGoneFailsOnlyItsOwnPairsOps) {
  constexpr uint64_t kSize = 64 << 10;
  auto reader = ibverbs_manager(1);  // one thread, one queue: every pair shares them
  ASSERT_NE(reader, nullptr);
  auto staying = ibverbs_manager(1);
  auto leaving = ibverbs_manager(1);
  ASSERT_NE(staying, nullptr);
  ASSERT_NE(leaving, nullptr);
  LocalMemory kept = with_pattern(kSize, 901);
  LocalMemory gone = with_pattern(kSize, 902);
  auto kept_handle = staying->register_buffer(kept);
  auto gone_handle = leaving->register_buffer(gone);
  ASSERT_TRUE(kept_handle.ok() && gone_handle.ok());

  LocalMemory a = with_sentinel(kSize), b = with_sentinel(kSize);
  Transfer both = reader->submit({Op::read(*kept_handle, a), Op::read(*gone_handle, b)}, kTimeout);
  ASSERT_TRUE(both.wait().ok()) << both.status().to_string();
  ASSERT_EQ(find_mismatch(b.span(), 902), std::nullopt);

  leaving.reset();  // its side of the pair, and its buffer, go
  LocalMemory c = with_sentinel(kSize);
  Status after = reader->read_into(*gone_handle, c, 10s);
  EXPECT_FALSE(after.ok());
  for (int i = 0; i < 3; ++i) {
    LocalMemory d = with_sentinel(kSize);
    Status s = reader->read_into(*kept_handle, d, kTimeout);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(find_mismatch(d.span(), 901), std::nullopt);
  }
  auto newcomer = ibverbs_manager(1);
  ASSERT_NE(newcomer, nullptr);
  LocalMemory fresh = with_pattern(kSize, 903);
  auto fresh_handle = newcomer->register_buffer(fresh);
  ASSERT_TRUE(fresh_handle.ok());
  LocalMemory e = with_sentinel(kSize);
  Status s = reader->read_into(*fresh_handle, e, kTimeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(find_mismatch(e.span(), 903), std::nullopt);
}

}  // namespace
}  // namespace rdmabuf::testing
