// secure_random: the token source. It draws from getrandom in batches, so
// what matters is that no two draws repeat, in one process or across a fork.
// read_small_file: /proc entries, of processes that may be gone.
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/host.h"

namespace rdmabuf {
namespace {

TEST(SecureRandomTest, DrawsDoNotRepeatAcrossPoolRefills) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 5000; ++i) {  // ~10 pools of 4 KiB
    EXPECT_TRUE(seen.insert(secure_random_u64()).second) << "draw " << i << " repeated";
  }
  uint8_t big[3000];  // larger than a quarter pool: straight from the kernel
  secure_random(big, sizeof big);
  EXPECT_NE(std::set<uint8_t>(big, big + sizeof big).size(), 1u);
}

TEST(SecureRandomTest, AForkedChildDoesNotRepeatItsParentsDraws) {
  (void)secure_random_u64();  // the pool now holds bytes the parent will hand out
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    uint64_t v = secure_random_u64();
    _exit(write(pipe_fds[1], &v, sizeof v) == sizeof v ? 0 : 1);
  }
  const uint64_t parents = secure_random_u64();
  uint64_t childs = 0;
  ASSERT_EQ(read(pipe_fds[0], &childs, sizeof childs), static_cast<ssize_t>(sizeof childs));
  int status = 0;
  waitpid(child, &status, 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_NE(parents, childs) << "the child handed out its parent's next random bytes";
}

TEST(ReadSmallFileTest, ReadsUpToItsLimitAndAnswersEmptyForWhatIsGone) {
  const std::string mine = "/proc/" + std::to_string(getpid()) + "/stat";
  EXPECT_EQ(read_small_file(mine).rfind(std::to_string(getpid()) + " (", 0), 0u);
  EXPECT_EQ(read_small_file(mine, 3).size(), 3u);
  EXPECT_EQ(read_small_file("/no/such/file"), "");
  // A process that has exited and been reaped: its entries are gone.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_EQ(read_small_file("/proc/" + std::to_string(child) + "/task/" + std::to_string(child) +
                            "/stat"),
            "");
}

}  // namespace
}  // namespace rdmabuf
