// Facts about this host and process, and secure randomness.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rdmabuf/status.h"

namespace rdmabuf {

// Identifies this running kernel: its boot id (changes on every boot), or
// the hostname where /proc does not tell.
std::string this_host_id();

// Identifies this process's PID namespace (the inode of /proc/self/ns/pid);
// 0 when it cannot be read. Two processes can address each other by pid
// only when these match.
uint64_t pid_namespace_id();

// The first `limit` bytes of a small file (a /proc or /sys entry); empty
// when it cannot be opened or read. Never throws: an entry of another
// process fails with ESRCH once that process is gone, which a C++ stream
// reports by throwing.
std::string read_small_file(const std::string& path, size_t limit = 4096);

// How many CPUs the calling thread may run on at once: the CPUs in its
// affinity mask (a whole process's under taskset or a cpuset), fewer where
// a cgroup v2 CPU quota (cpu.max, as `docker run --cpus` sets) on the
// process's cgroup or one above allows less CPU time than that, rounded
// up; at least 1. Read afresh at each call: a system call and a few small
// file reads. (cgroup v1 quotas are not read.)
int usable_cpus();

// The CPUs a cgroup v2 cpu.max line ("max 100000", "150000 100000") allows,
// rounded up; 0 for no limit, or a line it cannot read.
int cpus_allowed_by_quota(std::string_view cpu_max);

// The fewest CPUs the cgroup v2 quotas allow a process whose
// /proc/self/cgroup reads `proc_cgroup`, on its cgroup and each one above
// it, with the cgroup v2 hierarchy at `root` (/sys/fs/cgroup): 0 for no
// limit, or no cgroup v2 line. (Part of usable_cpus(), apart for tests.)
int cpus_allowed_by_cgroups(std::string_view proc_cgroup, const std::string& root);

// Fills `size` bytes from the kernel's CSPRNG (getrandom). Aborts if the
// kernel cannot supply randomness: tokens must never be predictable.
void secure_random(void* out, size_t size);
uint64_t secure_random_u64();

// This host's first non-loopback IPv4 address, for handles minted by a
// manager that listens on a wildcard address. kUnavailable when there is none.
Result<std::string> first_non_loopback_ipv4();

}  // namespace rdmabuf
