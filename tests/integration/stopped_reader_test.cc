// A same-host writer stopped inside its copy while the owner releases the
// buffer (backends/memory/shared_state.h): the release waits for it; a copy
// through the kernel (private memory) is cancelled after SlotTable's grace,
// a copy through a mapping of the owner's file (LocalMemory::allocate's
// memory) is waited for until the writer resumes or dies. Either way, once
// release() has returned the writer's bytes never land, and its op fails
// with NotFound.
//
// The writer is a process of its own (rdmabuf_test_reader --write), stopped
// by ptrace at the entry of its process_vm_writev (the worst moment: its
// checks passed, its ranges built, the system call not yet made), or by
// SIGSTOP at a moment of chance.
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/memory/shared_state.h"
#include "tests/helpers/process.h"
#include "tests/integration/integration.h"

namespace rdmabuf::testing {
namespace {

constexpr uint64_t kSize = 64 << 10;
constexpr auto kGrace = memory::SlotTable::kStoppedReaderGrace;

class StoppedWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_ = make_manager([](Config& c) { c.backends = {"memory"}; });
    ASSERT_NE(owner_, nullptr);
    for (const BackendInfo& info : owner_->backends()) {
      if (info.name == "memory" && !info.viable) {
        GTEST_SKIP() << "the memory backend is not viable here: " << info.reason;
      }
    }
  }

  struct Owned {
    LocalMemory memory;
    RemoteBuffer handle;
  };
  // A buffer of pattern `seed`, in private memory (copied through the
  // kernel) or, with `shared`, in LocalMemory::allocate's (mapped).
  Owned own(uint64_t seed, bool shared = false) {
    Owned o{shared ? allocate(kSize) : LocalMemory::allocate_private(kSize).value(), {}};
    fill_pattern(o.memory.span(), seed);
    auto h = owner_->register_buffer(o.memory);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) o.handle = *h;
    return o;
  }

  // A writer of 0x5a bytes, waiting for "go" on its stdin.
  std::unique_ptr<Subprocess> start_writer(const Owned& o, bool loop) {
    std::vector<std::string> args = {"--write", "5a", "--wait"};
    if (loop) args.push_back("--loop");
    args.push_back(o.handle.to_text());
    args.push_back(std::to_string(kSize));
    std::string error;
    auto child = Subprocess::spawn(RDMABUF_TEST_READER, args, {"RDMABUF_BACKENDS=memory"}, &error);
    EXPECT_NE(child, nullptr) << error;
    if (!child) return nullptr;
    auto ready = child->read_line(kTimeout);
    EXPECT_EQ(ready, std::optional<std::string>("ready"));
    return ready == std::optional<std::string>("ready") ? std::move(child) : nullptr;
  }

  // The status line the writer prints once its op (or loop) ended.
  static std::string final_status(Subprocess& writer) {
    auto line = writer.read_line(kTimeout);
    return line ? *line : "(no status: the writer printed nothing)";
  }

  static std::vector<std::byte> snapshot(const LocalMemory& m) {
    return std::vector<std::byte>(m.data(), m.data() + m.size());
  }

  std::unique_ptr<Manager> owner_;
};

// Runs `pid` (traced by this process, stopped) until it stops at the entry
// of system call `nr`; false when it did not within `limit`.
bool run_to_syscall_entry(pid_t pid, long nr, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (ptrace(PTRACE_SYSCALL, pid, nullptr, nullptr) != 0) return false;
    int status = 0;
    if (waitpid(pid, &status, __WALL) != pid || !WIFSTOPPED(status)) return false;
    if (WSTOPSIG(status) != (SIGTRAP | 0x80)) continue;  // not a system call stop
    __ptrace_syscall_info info{};
    if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, sizeof info, &info) <= 0) return false;
    if (info.op == PTRACE_SYSCALL_INFO_ENTRY && static_cast<long>(info.entry.nr) == nr) {
      return true;
    }
  }
  return false;
}

TEST_F(StoppedWriterTest, AWriterStoppedAtItsSystemCallIsCancelledAndNeverLands) {
  Owned o = own(61);
  auto writer = start_writer(o, false);
  ASSERT_NE(writer, nullptr);
  const pid_t pid = writer->pid();
  if (ptrace(PTRACE_SEIZE, pid, nullptr, PTRACE_O_TRACESYSGOOD) != 0) {
    GTEST_SKIP() << "cannot trace the writer here: " << std::strerror(errno);
  }
  // Stopped before it is told to go: told first, it could finish its write
  // before the interrupt lands.
  ASSERT_EQ(ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr), 0) << std::strerror(errno);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, __WALL), pid);
  ASSERT_TRUE(writer->write_line("go"));
  ASSERT_TRUE(run_to_syscall_entry(pid, SYS_process_vm_writev, kTimeout))
      << "the writer never reached process_vm_writev";

  // Stopped at the entry of the write: its pin is armed. The release waits
  // for it, then cancels its copy.
  const auto started = Clock::now();
  ASSERT_TRUE(owner_->release(o.handle).ok());
  const auto took = Clock::now() - started;
  EXPECT_GE(took, kGrace - 50ms) << "the stopped writer was not waited for";
  EXPECT_LT(took, kGrace + 5s);
  const std::vector<std::byte> at_release = snapshot(o.memory);
  EXPECT_EQ(find_mismatch(at_release, 61), std::nullopt) << "the write landed before it ran";

  ASSERT_EQ(ptrace(PTRACE_DETACH, pid, nullptr, nullptr), 0) << std::strerror(errno);
  const std::string reported = final_status(*writer);
  EXPECT_EQ(reported.rfind("status NotFound", 0), 0u) << reported;
  EXPECT_NE(reported.find("cancelled"), std::string::npos) << reported;
  EXPECT_EQ(snapshot(o.memory), at_release) << "the cancelled write landed after release()";
}

// SIGSTOP at chance moments of a stream of writes, a release while stopped,
// then SIGCONT: whatever the moment, nothing lands after release() returned.
TEST_F(StoppedWriterTest, AWriterStoppedAtAnyMomentNeverLandsAfterRelease) {
  std::mt19937 chance(std::random_device{}());
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Owned o = own(70 + static_cast<uint64_t>(round));
    auto writer = start_writer(o, true);
    ASSERT_NE(writer, nullptr);
    ASSERT_TRUE(writer->write_line("go"));
    std::this_thread::sleep_for(std::chrono::microseconds(chance() % 20000));
    ASSERT_TRUE(writer->stop());
    const auto started = Clock::now();
    ASSERT_TRUE(owner_->release(o.handle).ok());
    EXPECT_LT(Clock::now() - started, kGrace + 5s);
    const std::vector<std::byte> at_release = snapshot(o.memory);
    ASSERT_TRUE(writer->resume());
    const std::string reported = final_status(*writer);
    EXPECT_EQ(reported.rfind("status NotFound", 0), 0u) << reported;
    EXPECT_EQ(snapshot(o.memory), at_release) << "a write landed after release()";
  }
}

// The same with the buffer in LocalMemory::allocate's memory, which the
// writer maps and copies with stores: a copy nobody can cancel from outside.
// The release waits while the writer is stopped, however long, and returns
// once it resumes (then it finishes the copy it was in, and its next op is
// refused) or is killed; nothing lands after it returned.
TEST_F(StoppedWriterTest, AStoppedWriterToMappedMemoryHoldsTheReleaseUntilItResumesOrDies) {
  std::mt19937 chance(std::random_device{}());
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const bool kill_it = round % 2 == 1;
    Owned o = own(80 + static_cast<uint64_t>(round), /*shared=*/true);
    auto writer = start_writer(o, true);
    ASSERT_NE(writer, nullptr);
    ASSERT_TRUE(writer->write_line("go"));
    std::this_thread::sleep_for(std::chrono::microseconds(5000 + chance() % 20000));
    ASSERT_TRUE(writer->stop());
    std::atomic<bool> returned{false};
    std::vector<std::byte> at_release;
    std::thread release([&] {
      EXPECT_TRUE(owner_->release(o.handle).ok());
      at_release = snapshot(o.memory);
      returned = true;
    });
    // Past the grace a copy through the kernel would have been cancelled;
    // this one is still waited for, if the writer was inside one.
    std::this_thread::sleep_for(kGrace + 300ms);
    const bool waited = !returned.load();
    if (kill_it) {
      ASSERT_TRUE(writer->signal(SIGKILL));
    } else {
      ASSERT_TRUE(writer->resume());
    }
    release.join();
    ASSERT_TRUE(returned.load());
    if (!kill_it) {
      const std::string reported = final_status(*writer);
      EXPECT_EQ(reported.rfind("status NotFound", 0), 0u) << reported;
    }
    writer->wait(kTimeout);
    EXPECT_EQ(snapshot(o.memory), at_release) << "a write landed after release()";
    std::printf("round %d: the writer was %sinside a copy when stopped\n", round,
                waited ? "" : "not ");
  }
}

}  // namespace
}  // namespace rdmabuf::testing
