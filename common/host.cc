#include "common/host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "common/strings.h"

namespace rdmabuf {

std::string this_host_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in && std::getline(in, id) && !trim(id).empty()) return std::string(trim(id));
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return std::string("host:") + name;
}

std::string read_small_file(const std::string& path, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text(limit, '\0');
  size_t got = 0;
  while (got < limit) {
    const ssize_t n = ::read(fd, text.data() + got, limit - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0) got = 0;  // a read error: nothing trustworthy
      break;
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return text;
}

uint64_t pid_namespace_id() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

int cpus_allowed_by_quota(std::string_view cpu_max) {
  const std::vector<std::string> words = split_list(trim(cpu_max), ' ');
  if (words.size() != 2 || words[0] == "max") return 0;
  const std::optional<int64_t> quota = parse_int(words[0], 1, int64_t{1} << 40);
  const std::optional<int64_t> period = parse_int(words[1], 1, int64_t{1} << 40);
  if (!quota || !period) return 0;
  return static_cast<int>(std::min<int64_t>((*quota + *period - 1) / *period, 1 << 20));
}

int cpus_allowed_by_cgroups(std::string_view proc_cgroup, const std::string& root) {
  // "0::/some/path" is the cgroup v2 line.
  const std::string lines = "\n" + std::string(proc_cgroup);
  const size_t at = lines.find("\n0::/");
  if (at == std::string::npos) return 0;
  const size_t begin = at + 4;  // the path's first '/'
  std::string path(trim(std::string_view(lines).substr(begin, lines.find('\n', begin) - begin)));
  int fewest = 0;
  while (true) {
    const int cpus = cpus_allowed_by_quota(read_small_file(root + path + "/cpu.max", 64));
    if (cpus > 0 && (fewest == 0 || cpus < fewest)) fewest = cpus;
    if (path.empty() || path == "/") break;
    path.resize(path.rfind('/'));  // the parent's: "/a/b" to "/a", "/a" to ""
  }
  return fewest;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  const int quota = cpus_allowed_by_cgroups(read_small_file("/proc/self/cgroup"), "/sys/fs/cgroup");
  return std::max(1, quota > 0 ? std::min(cpus, quota) : cpus);
}

namespace {

// Random bytes from getrandom, drawn kRandomPool at a time: one system call
// per 256 tokens instead of one per token. The pool is emptied in a forked
// child, which must not hand out the bytes its parent may hand out too.
constexpr size_t kRandomPool = 4096;
std::mutex g_random_mu;
uint8_t g_random_pool[kRandomPool];
size_t g_random_left = 0;

void fill_from_kernel(uint8_t* p, size_t size) {
  while (size > 0) {
    ssize_t n = getrandom(p, size, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "rdmabuf: getrandom failed; refusing to mint predictable tokens\n");
      std::abort();
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void secure_random(void* out, size_t size) {
  static const bool at_fork = [] {
    pthread_atfork([] { g_random_mu.lock(); }, [] { g_random_mu.unlock(); },
                   [] {
                     g_random_left = 0;
                     g_random_mu.unlock();
                   });
    return true;
  }();
  (void)at_fork;
  auto* p = static_cast<uint8_t*>(out);
  if (size > kRandomPool / 4) return fill_from_kernel(p, size);
  std::lock_guard lock(g_random_mu);
  if (g_random_left < size) {
    fill_from_kernel(g_random_pool, kRandomPool);
    g_random_left = kRandomPool;
  }
  uint8_t* taken = g_random_pool + (kRandomPool - g_random_left);
  std::memcpy(p, taken, size);
  std::memset(taken, 0, size);  // handed out once
  g_random_left -= size;
}

uint64_t secure_random_u64() {
  uint64_t v = 0;
  secure_random(&v, sizeof v);
  return v;
}

Result<std::string> first_non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Unavailable("getifaddrs failed");
  std::string found;
  for (ifaddrs* p = list; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET) continue;
    if (p->ifa_flags & IFF_LOOPBACK) continue;
    if (!(p->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
    break;
  }
  freeifaddrs(list);
  if (found.empty()) return Unavailable("this host has no non-loopback IPv4 address");
  return found;
}

}  // namespace rdmabuf
