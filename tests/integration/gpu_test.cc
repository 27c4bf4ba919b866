// GPU memory between processes: an owner whose buffers are on a GPU, in a
// process of its own (rdmabuf_test_peer --gpu), read and written from GPU
// and host memory here over each same-host backend; and the memory
// backend's CUDA IPC mappings, opened once per allocation and closed once
// the owner released every buffer in it (the test driver counts them).
// On CI the GPU is the test driver's (tests/helpers/gpu.h).
#include <dlfcn.h>

#include <cstdlib>
#include <thread>

#include "common/crc32c.h"
#include "tests/helpers/gpu.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

constexpr size_t kSize = 8 << 20;

std::unique_ptr<TestPeer> start_gpu_peer(std::vector<TestPeer::BufferSpec> buffers) {
  TestPeer::Options options;
  options.buffers = std::move(buffers);
  options.gpu = true;
  std::string error;
  auto peer = TestPeer::start(options, &error);
  if (!peer) ADD_FAILURE() << "cannot start rdmabuf_test_peer --gpu: " << error;
  return peer;
}

// `name`, a function of the test driver's own, when the test driver is
// the one loaded; null on a real GPU.
template <typename Function>
Function* test_driver_function(const char* name) {
  const char* path = std::getenv("RDMABUF_CUDA_DRIVER");
  void* driver = path ? ::dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (!driver) return nullptr;
  auto* function = reinterpret_cast<Function*>(::dlsym(driver, name));
  ::dlclose(driver);  // still loaded: RTLD_NOLOAD took a reference to a loaded library
  return function;
}

// How many IPC handles this process has open, as the test driver counts
// them; -1 on a real GPU (it does not say).
int open_ipc_handles() {
  auto* count = test_driver_function<int()>("fake_cuda_open_ipc_handles");
  return count ? count() : -1;
}

class GpuPeerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Status gpu = use_test_gpu();
    ASSERT_TRUE(gpu.ok()) << gpu.to_string();
    reader_ = make_manager([&](Config& c) { c.backends = {GetParam()}; });
    ASSERT_NE(reader_, nullptr);
  }
  std::unique_ptr<Manager> reader_;
};

TEST_P(GpuPeerTest, EveryMixOfHostAndGpuMemoryMovesIntact) {
  auto peer = start_gpu_peer({{kSize, 5}});
  ASSERT_NE(peer, nullptr);
  for (MemoryKind kind : {MemoryKind::kHost, MemoryKind::kCuda}) {
    SCOPED_TRACE(std::string("local memory: ") + memory_kind_name(kind));
    LocalMemory dst = allocate_of(kind, kSize);
    Transfer t = reader_->submit({Op::read(peer->handle(0), dst)}, kTimeout);
    ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
    EXPECT_EQ(t.op_backend(0), GetParam()) << t.op_note(0);
    EXPECT_EQ(find_mismatch(HostBytes(dst).span(), 5), std::nullopt);
    // A write of a slice, checked by the owner.
    LocalMemory src = with_pattern_of(kind, 3 << 20, 77, 4096);
    ASSERT_TRUE(reader_->write_from(slice(peer->handle(0), 4096, 3 << 20), src, kTimeout).ok());
    EXPECT_EQ(peer->check(0, 4096, 3 << 20, 77, 4096), "ok");
    EXPECT_EQ(peer->check(0, 0, 4096, 5, 0), "ok") << "bytes before the slice changed";
    ASSERT_EQ(peer->command("fill 0 5"), "ok");
  }
}

TEST_P(GpuPeerTest, TheOwnerReadsOurGpuBufferIntoItsGpu) {
  auto peer = start_gpu_peer({});
  ASSERT_NE(peer, nullptr);
  LocalMemory mine = with_pattern_of(MemoryKind::kCuda, kSize, 31);
  auto handle = reader_->register_buffer(mine);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  const HostBytes expected(mine);
  EXPECT_EQ(peer->command("read " + handle->to_text()),
            crc_line(expected.data(), expected.size()) + " " + GetParam());
  EXPECT_EQ(peer->command("write " + handle->to_text() + " 32").rfind("ok ", 0), 0u);
  EXPECT_EQ(find_mismatch(HostBytes(mine).span(), 32), std::nullopt);
  ASSERT_TRUE(reader_->release(*handle).ok());
  EXPECT_EQ(peer->command("read " + handle->to_text()).rfind("error NotFound", 0), 0u);
}

TEST_P(GpuPeerTest, ReleasedGpuBufferIsNotFound) {
  auto peer = start_gpu_peer({{1 << 20, 8}});
  ASSERT_NE(peer, nullptr);
  LocalMemory dst = filled_of(MemoryKind::kCuda, 1 << 20, kSentinel);
  ASSERT_TRUE(reader_->read_into(peer->handle(0), dst, kTimeout).ok());
  ASSERT_EQ(peer->release(0), "ok");
  LocalMemory again = filled_of(MemoryKind::kCuda, 1 << 20, kSentinel);
  EXPECT_EQ(reader_->read_into(peer->handle(0), again, kTimeout).code(), StatusCode::kNotFound);
  EXPECT_EQ(find_not(HostBytes(again).span(), kSentinel), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(SameHost, GpuPeerTest, ::testing::Values("memory", "tcp"),
                         [](const auto& param) { return param.param; });

class GpuIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status gpu = use_test_gpu();
    ASSERT_TRUE(gpu.ok()) << gpu.to_string();
    if (open_ipc_handles() < 0) GTEST_SKIP() << "counting IPC handles needs the test driver";
    reader_ = make_manager([](Config& c) { c.backends = {"memory"}; });
    ASSERT_NE(reader_, nullptr);
  }
  void read(TestPeer& peer, size_t i) {
    LocalMemory dst = allocate_of(MemoryKind::kCuda, peer.spec(i).size);
    Transfer t = reader_->submit({Op::read(peer.handle(i), dst)}, kTimeout);
    ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
    ASSERT_EQ(t.op_backend(0), "memory") << t.op_note(0);
  }
  std::unique_ptr<Manager> reader_;
};

TEST_F(GpuIpcTest, AnAllocationIsOpenedOnceAndClosedOnceItsBuffersAreReleased) {
  auto peer = start_gpu_peer({{1 << 20, 1}, {1 << 20, 2}});  // two allocations
  ASSERT_NE(peer, nullptr);
  read(*peer, 0);
  read(*peer, 0);
  EXPECT_EQ(open_ipc_handles(), 1) << "opened once, then reused";
  // Buffer 2: buffer 0's memory registered again, in the same allocation.
  const std::string alias = peer->command("alias 0");
  ASSERT_EQ(alias.rfind("handle 2 ", 0), 0u) << alias;
  auto handle = RemoteBuffer::from_text(alias.substr(9));
  ASSERT_TRUE(handle.ok());
  LocalMemory dst = allocate_of(MemoryKind::kCuda, 1 << 20);
  ASSERT_TRUE(reader_->read_into(*handle, dst, kTimeout).ok());
  EXPECT_EQ(open_ipc_handles(), 1) << "a second buffer in the allocation shares its mapping";
  read(*peer, 1);
  EXPECT_EQ(open_ipc_handles(), 2);
  // Released, buffer 0's allocation stays open while its alias lives.
  ASSERT_EQ(peer->release(0), "ok");
  read(*peer, 1);
  EXPECT_EQ(open_ipc_handles(), 2);
  ASSERT_EQ(peer->release(2), "ok");
  read(*peer, 1);  // the next copy from that owner closes what it no longer needs
  EXPECT_EQ(open_ipc_handles(), 1);
  ASSERT_EQ(peer->release(1), "ok");
  EXPECT_EQ(reader_->read_into(peer->handle(1), dst, kTimeout).code(), StatusCode::kNotFound);
  EXPECT_EQ(open_ipc_handles(), 0);
}

// A copy in flight keeps its allocation mapped: the owner releases the
// buffer (its release waits for the copy), and meanwhile another copy from
// that owner drops the released buffer's mapping. The first copy still
// lands whole, and the mapping closes after it.
TEST_F(GpuIpcTest, AMappingStaysOpenWhileACopyThroughItIsInFlight) {
  auto* set_sync_delay = test_driver_function<void(int)>("fake_cuda_set_sync_delay_ms");
  ASSERT_NE(set_sync_delay, nullptr);
  auto peer = start_gpu_peer({{1 << 20, 1}, {1 << 20, 2}});  // two allocations
  ASSERT_NE(peer, nullptr);
  read(*peer, 0);
  read(*peer, 1);
  ASSERT_EQ(open_ipc_handles(), 2);
  LocalMemory first_dst = allocate_of(MemoryKind::kCuda, 1 << 20);
  LocalMemory second_dst = allocate_of(MemoryKind::kCuda, 1 << 20);

  set_sync_delay(600);  // every copy now waits 600 ms, queued, before it runs
  Status first;
  std::thread copier([&] { first = reader_->read_into(peer->handle(0), first_dst, kTimeout); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // its copy queued, pinned
  std::string released;
  std::thread releaser([&] { released = peer->release(0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // buffer 0 marked released
  // This copy's sweep drops buffer 0's mapping, the last of its allocation.
  Status second = reader_->read_into(peer->handle(1), second_dst, kTimeout);
  copier.join();
  releaser.join();
  set_sync_delay(0);

  EXPECT_TRUE(first.ok()) << first.to_string();
  EXPECT_EQ(find_mismatch(HostBytes(first_dst).span(), 1), std::nullopt);
  EXPECT_TRUE(second.ok()) << second.to_string();
  EXPECT_EQ(find_mismatch(HostBytes(second_dst).span(), 2), std::nullopt);
  EXPECT_EQ(released, "ok");
  EXPECT_EQ(open_ipc_handles(), 1) << "buffer 0's allocation closed once its copy was done";
}

TEST_F(GpuIpcTest, AnOwnerThatExitedFailsOpsAndItsMappingsClose) {
  auto peer = start_gpu_peer({{1 << 20, 1}});
  ASSERT_NE(peer, nullptr);
  read(*peer, 0);
  EXPECT_EQ(open_ipc_handles(), 1);
  ASSERT_TRUE(peer->exit());
  LocalMemory dst = allocate_of(MemoryKind::kCuda, 1 << 20);
  Status st = reader_->read_into(peer->handle(0), dst, kTimeout);
  EXPECT_FALSE(st.ok());
  reader_.reset();  // the owner's view goes with the manager
  EXPECT_EQ(open_ipc_handles(), 0);
}

}  // namespace
}  // namespace rdmabuf::testing

namespace rdmabuf::testing {
namespace {

// Over ibverbs the NIC must reach GPU memory itself: through a dma-buf the
// driver exports, else by plain registration (where a peer-memory module
// is loaded). Where neither works, as with the test driver on Soft-RoCE
// (no /dev/udmabuf to export a dma-buf from, and GPU memory no access
// reaches), an owner's GPU buffer is not offered over ibverbs, saying why,
// and a reader's GPU memory goes through host memory, its note saying why.
// Runs in the Soft-RoCE VM; where ibverbs is not viable it is skipped.
TEST(IbverbsGpuTest, WhereTheNicReachesNoGpuMemoryOpsAreStagedSayingWhy) {
  Status gpu = use_test_gpu();
  ASSERT_TRUE(gpu.ok()) << gpu.to_string();
  Config c;
  c.backends = {"ibverbs", "tcp"};
  auto manager = Manager::create(c);
  ASSERT_TRUE(manager.ok()) << manager.status().to_string();
  for (const BackendInfo& info : (*manager)->backends()) {
    if (info.name == "ibverbs" && !info.viable) {
      GTEST_SKIP() << "ibverbs is not viable here: " << info.reason;
    }
  }
  if (real_gpu_requested()) GTEST_SKIP() << "a real GPU and NIC may well reach each other";
  Manager& m = **manager;
  // The owner's side: offered over tcp only.
  LocalMemory gpu_buffer = with_pattern_of(MemoryKind::kCuda, 1 << 20, 3);
  auto handle = m.register_buffer(gpu_buffer);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  EXPECT_EQ(handle->context("ibverbs"), nullptr);
  ASSERT_NE(handle->context("tcp"), nullptr);
  // The reader's side: a host buffer offered over ibverbs, read into GPU memory.
  LocalMemory host_buffer = with_pattern_of(MemoryKind::kHost, 1 << 20, 4);
  auto host_handle = m.register_buffer(host_buffer);
  ASSERT_TRUE(host_handle.ok());
  ASSERT_NE(host_handle->context("ibverbs"), nullptr);
  LocalMemory dst = allocate_of(MemoryKind::kCuda, 1 << 20);
  Transfer t = m.submit({Op::read(*host_handle, dst)}, kTimeout);
  ASSERT_TRUE(t.wait().ok()) << t.status().to_string();
  EXPECT_EQ(t.op_backend(0), "ibverbs");
  const std::string note = t.op_note(0);
  EXPECT_NE(note.find("staged through host memory"), std::string::npos) << note;
  EXPECT_NE(note.find("dma-buf"), std::string::npos) << note;
  EXPECT_NE(note.find("plain registration"), std::string::npos) << note;
  EXPECT_EQ(find_mismatch(HostBytes(dst).span(), 4), std::nullopt);
  // And the GPU buffer, read over tcp from GPU memory.
  LocalMemory back = allocate_of(MemoryKind::kCuda, 1 << 20);
  ASSERT_TRUE(m.read_into(*handle, back, kTimeout).ok());
  EXPECT_EQ(find_mismatch(HostBytes(back).span(), 3), std::nullopt);
}

}  // namespace
}  // namespace rdmabuf::testing
