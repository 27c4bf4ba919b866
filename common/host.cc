#include "common/host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>

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

uint64_t pid_namespace_id() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

void secure_random(void* out, size_t size) {
  auto* p = static_cast<uint8_t*>(out);
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
