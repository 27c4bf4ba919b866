// secure_random: the token source. It draws from getrandom in batches, so
// what matters is that no two draws repeat, in one process or across a fork.
// read_small_file: /proc entries, of processes that may be gone.
// usable_cpus: what a thread's affinity mask and its cgroup's quota allow.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/host.h"
#include "tests/helpers/pinned.h"

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

TEST(UsableCpusTest, FollowsTheThreadsAffinityMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  // A cgroup's quota may allow fewer.
  EXPECT_GE(usable_cpus(), 1);
  EXPECT_LE(usable_cpus(), CPU_COUNT(&all));
  // A thread pinned to one CPU (taskset -c 0 does this to a whole process).
  int first = 0;
  while (!CPU_ISSET(first, &all))
    ++first;
  int pinned = -1;
  if (!testing::RunOnCpu(first, [&] { pinned = usable_cpus(); })) {
    GTEST_SKIP() << "a thread cannot be pinned to CPU " << first << " here";
  }
  EXPECT_EQ(pinned, 1);
}

TEST(UsableCpusTest, ReadsCgroupQuotasRoundedUp) {
  EXPECT_EQ(cpus_allowed_by_quota("max 100000\n"), 0);
  EXPECT_EQ(cpus_allowed_by_quota("100000 100000\n"), 1);
  EXPECT_EQ(cpus_allowed_by_quota("50000 100000"), 1);
  EXPECT_EQ(cpus_allowed_by_quota("150000 100000"), 2);
  EXPECT_EQ(cpus_allowed_by_quota("400000 100000"), 4);
  // Not a quota line: no limit said.
  EXPECT_EQ(cpus_allowed_by_quota(""), 0);
  EXPECT_EQ(cpus_allowed_by_quota("100000"), 0);
  EXPECT_EQ(cpus_allowed_by_quota("-5 100000"), 0);
  EXPECT_EQ(cpus_allowed_by_quota("100000 0"), 0);
  EXPECT_EQ(cpus_allowed_by_quota("lots 100000"), 0);
}

TEST(UsableCpusTest, TakesTheFewestCpusOfTheQuotasOnTheCgroupAndThoseAboveIt) {
  char dir_template[] = "/tmp/rdmabuf-cgroups-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string root = dir_template;
  const auto put = [&](const std::string& cgroup, const std::string& cpu_max) {
    std::filesystem::create_directories(root + cgroup);
    std::ofstream(root + cgroup + "/cpu.max") << cpu_max;
  };
  put("/", "300000 100000\n");  // a container's own root, in its namespace
  put("/a", "max 100000\n");
  put("/a/b", "150000 100000\n");
  std::filesystem::create_directories(root + "/a/b/c");  // no quota of its own
  EXPECT_EQ(cpus_allowed_by_cgroups("0::/a/b/c\n", root), 2);
  EXPECT_EQ(cpus_allowed_by_cgroups("0::/a/b/c", root), 2) << "no newline at the end";
  EXPECT_EQ(cpus_allowed_by_cgroups("0::/a\n", root), 3);
  EXPECT_EQ(cpus_allowed_by_cgroups("0::/\n", root), 3);
  // cgroup v1 lines beside the v2 one, as on a hybrid host.
  EXPECT_EQ(cpus_allowed_by_cgroups("12:cpu,cpuacct:/a\n0::/a/b\n", root), 2);
  // No cgroup v2 line, or a cgroup gone: no limit said.
  EXPECT_EQ(cpus_allowed_by_cgroups("12:cpu,cpuacct:/a/b\n", root), 0);
  EXPECT_EQ(cpus_allowed_by_cgroups("", root), 0);
  EXPECT_EQ(cpus_allowed_by_cgroups("0::/gone\n", root + "/nowhere"), 0);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace rdmabuf
