// GPU memory as a LocalMemory, and the public calls of rdmabuf/gpu.h: a
// device pointer is recognised from the pointer itself, with its GPU, and
// a range that runs past its allocation is refused; allocate_gpu's errors;
// copy_memory in every direction; gpu_support() and synchronize_stream();
// and a process without a driver.
// On CI the GPU is the test driver's (tests/helpers/gpu.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "common/cuda_driver.h"
#include "tests/helpers/gpu.h"
#include "tests/helpers/pattern.h"

namespace rdmabuf::testing {
namespace {

class GpuMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status gpu = use_test_gpu();
    if (!gpu.ok()) GTEST_SKIP() << "no GPU memory here: " << gpu.to_string();
  }
};

TEST_F(GpuMemoryTest, ADevicePointerIsRecognisedWithItsGpu) {
  auto gpu = LocalMemory::allocate_gpu(1 << 20);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_TRUE(gpu->on_gpu());
  EXPECT_EQ(gpu->device(), 0);

  // A pointer into the middle of the allocation, from a caller that knows
  // nothing of its kind (a tensor's data_ptr).
  auto* inside = gpu->data() + 4096;
  auto recognised = LocalMemory::recognize(inside, 8192);
  ASSERT_TRUE(recognised.ok()) << recognised.status().to_string();
  EXPECT_EQ(recognised->kind(), MemoryKind::kCuda);
  EXPECT_EQ(recognised->device(), 0);
  EXPECT_EQ(recognised->size(), 8192u);

  std::vector<std::byte> host(4096);
  auto plain = LocalMemory::recognize(host.data(), host.size());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->kind(), MemoryKind::kHost);
  EXPECT_EQ(plain->data(), host.data());
}

TEST_F(GpuMemoryTest, ARangeRunningPastItsAllocationIsRefused) {
  auto gpu = LocalMemory::allocate_gpu(1 << 20);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto* inside = gpu->data() + 4096;
  auto past = LocalMemory::recognize(inside, 1 << 20);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("runs past its allocation"), std::string::npos)
      << past.status().to_string();
}

TEST_F(GpuMemoryTest, AllocateGpuRefusesNothingAndNoSuchGpu) {
  auto empty = LocalMemory::allocate_gpu(0);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  const int gpus = static_cast<int>(gpu_support().gpus.size());
  auto none = LocalMemory::allocate_gpu(4096, gpus);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no GPU " + std::to_string(gpus)), std::string::npos)
      << none.status().to_string();
}

TEST_F(GpuMemoryTest, GpuSupportNamesTheDriverAndEveryGpu) {
  GpuSupport support = gpu_support();
  ASSERT_TRUE(support.status.ok());
  EXPECT_FALSE(support.driver.empty());
  EXPECT_GE(support.driver_version, 1000);
  ASSERT_FALSE(support.gpus.empty());
  for (size_t i = 0; i < support.gpus.size(); ++i) {
    EXPECT_EQ(support.gpus[i].ordinal, static_cast<int>(i));
    EXPECT_FALSE(support.gpus[i].name.empty());
    EXPECT_GT(support.gpus[i].memory, 0u);
    EXPECT_EQ(support.gpus[i].pci_bus_id.size(), 12u) << support.gpus[i].pci_bus_id;
  }
}

TEST_F(GpuMemoryTest, CopyMemoryMovesBytesEveryWay) {
  constexpr size_t kSize = (3 << 20) + 17;
  LocalMemory host_a = with_pattern_of(MemoryKind::kHost, kSize, 5);
  auto gpu_a = LocalMemory::allocate_gpu(kSize);
  auto gpu_b = LocalMemory::allocate_gpu(kSize + 100);
  auto host_b = LocalMemory::allocate(kSize);
  ASSERT_TRUE(gpu_a.ok() && gpu_b.ok() && host_b.ok());
  ASSERT_TRUE(copy_memory(*gpu_a, host_a).ok());                    // host to GPU
  ASSERT_TRUE(copy_memory(*gpu_b, *gpu_a).ok());                    // GPU to GPU, into a larger one
  ASSERT_TRUE(copy_memory(*host_b, *gpu_b->slice(0, kSize)).ok());  // GPU to host
  EXPECT_EQ(find_mismatch(host_b->span(), 5), std::nullopt);
  auto host_c = LocalMemory::allocate(kSize);
  ASSERT_TRUE(host_c.ok());
  ASSERT_TRUE(copy_memory(*host_c, *host_b).ok());  // host to host
  EXPECT_EQ(find_mismatch(host_c->span(), 5), std::nullopt);

  Status small = copy_memory(host_a, *gpu_b);
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument) << small.to_string();
  EXPECT_EQ(find_mismatch(host_a.span(), 5), std::nullopt) << "a refused copy moved bytes";
}

TEST_F(GpuMemoryTest, SynchronizeStreamWaitsOnTheDefaultStreamsAndRefusesNoSuchGpu) {
  EXPECT_TRUE(synchronize_stream(0, 1).ok());  // the legacy default stream
  EXPECT_TRUE(synchronize_stream(0, 2).ok());  // the per-thread one
  const int gpus = static_cast<int>(gpu_support().gpus.size());
  EXPECT_EQ(synchronize_stream(gpus, 1).code(), StatusCode::kInvalidArgument);
}

// A process with no CUDA driver: GPU memory is FailedPrecondition saying
// why, and host memory works as ever (registered, read, recognised).
TEST(GpuWithoutDriverTest, GpuMemoryIsFailedPreconditionAndHostMemoryWorks) {
  if (cuda::Driver::get_if_loaded().ok()) {
    GTEST_SKIP() << "an earlier test in this process loaded the driver (run this one alone)";
  }
  ::setenv("RDMABUF_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  GpuSupport support = gpu_support();
  EXPECT_EQ(support.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(support.status.message().find("/nonexistent/libcuda.so.1"), std::string::npos)
      << support.status.to_string();
  EXPECT_TRUE(support.gpus.empty());
  auto gpu = LocalMemory::allocate_gpu(4096);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kFailedPrecondition);

  LocalMemory host = with_pattern_of(MemoryKind::kHost, 4096, 9);
  auto recognised = LocalMemory::recognize(host.data(), host.size());
  ASSERT_TRUE(recognised.ok()) << recognised.status().to_string();
  EXPECT_EQ(recognised->kind(), MemoryKind::kHost);
  auto copy = LocalMemory::allocate(4096);
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(copy_memory(*copy, host).ok());
  EXPECT_EQ(find_mismatch(copy->span(), 9), std::nullopt);
}

}  // namespace
}  // namespace rdmabuf::testing
