// rdmabuf_test_reader: reads through a handle from a process of its own, for
// tests that need a reader with other credentials than the test's.
//
//   RDMABUF_TEST_UID=N rdmabuf_test_reader HANDLE_TEXT LENGTH
//
// With RDMABUF_TEST_UID set (the test runs as root), it first drops to that
// uid and gid. It reads the first LENGTH bytes of the handle with a Manager
// configured from the RDMABUF_* environment and prints:
//
//   status CODE MESSAGE
//   backend NAME
//   note NOTE
//   crc XXXXXXXX          (CRC-32C of the bytes read)
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/crc32c.h"
#include "rdmabuf/rdmabuf.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: rdmabuf_test_reader HANDLE_TEXT LENGTH\n");
    return 2;
  }
  if (const char* uid = std::getenv("RDMABUF_TEST_UID")) {
    auto id = static_cast<uid_t>(std::strtoul(uid, nullptr, 10));
    if (setgid(id) != 0 || setuid(id) != 0) {
      std::perror("rdmabuf_test_reader: dropping privileges");
      return 2;
    }
  }
  auto handle = rdmabuf::RemoteBuffer::from_text(argv[1]);
  if (!handle.ok()) {
    std::printf("status %s\n", handle.status().to_string().c_str());
    return 0;
  }
  auto length = std::strtoull(argv[2], nullptr, 10);
  auto view = handle->slice(0, length);
  auto manager = rdmabuf::Manager::create();
  auto local = rdmabuf::LocalMemory::allocate(length);
  if (!view.ok() || !manager.ok() || !local.ok()) {
    std::printf("status setup failed\n");
    return 2;
  }
  std::vector<rdmabuf::Op> ops;
  ops.push_back(rdmabuf::Op::read(*view, *local));
  rdmabuf::Transfer t = (*manager)->submit(std::move(ops), std::chrono::seconds(30));
  rdmabuf::Status st = t.wait();
  std::printf("status %s\n", st.to_string().c_str());
  std::printf("backend %s\n", std::string(t.op_backend(0)).c_str());
  std::printf("note %s\n", t.op_note(0).c_str());
  std::printf("crc %08" PRIx32 "\n", rdmabuf::crc32c(local->data(), length));
  std::fflush(stdout);
  return 0;
}
