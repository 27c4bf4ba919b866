// rdmabuf_test_reader: reads (or writes) through a handle from a process of
// its own, for tests that need a peer with other credentials than the
// test's, or one they can stop, trace or kill at will.
//
//   RDMABUF_TEST_UID=N rdmabuf_test_reader [--write BYTE] [--wait] [--loop] [--offset N]
//                                          HANDLE_TEXT LENGTH
//
// With RDMABUF_TEST_UID set (the test runs as root), it first drops to that
// uid and gid. It reads LENGTH bytes of the handle, from --offset (default
// 0), with a Manager
// configured from the RDMABUF_* environment; with --write BYTE (hex) it
// writes LENGTH bytes of BYTE there instead. --wait: prints "ready" once its
// manager runs, and starts only when a line comes on stdin. --loop: repeats
// the op until one fails, and reports that one. It prints:
//
//   status CODE MESSAGE
//   backend NAME
//   note NOTE
//   crc XXXXXXXX          (CRC-32C of the bytes read, or written)
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/crc32c.h"
#include "rdmabuf/rdmabuf.h"

int main(int argc, char** argv) {
  bool write = false, wait = false, loop = false;
  int fill = 0;
  uint64_t offset = 0;
  int arg = 1;
  for (; arg < argc && std::strncmp(argv[arg], "--", 2) == 0; ++arg) {
    if (std::strcmp(argv[arg], "--write") == 0 && arg + 1 < argc) {
      write = true;
      fill = static_cast<int>(std::strtoul(argv[++arg], nullptr, 16));
    } else if (std::strcmp(argv[arg], "--wait") == 0) {
      wait = true;
    } else if (std::strcmp(argv[arg], "--loop") == 0) {
      loop = true;
    } else if (std::strcmp(argv[arg], "--offset") == 0 && arg + 1 < argc) {
      offset = std::strtoull(argv[++arg], nullptr, 10);
    } else {
      break;
    }
  }
  if (argc - arg != 2) {
    std::fprintf(stderr,
                 "usage: rdmabuf_test_reader [--write BYTE] [--wait] [--loop] [--offset N] "
                 "HANDLE_TEXT LENGTH\n");
    return 2;
  }
  if (const char* uid = std::getenv("RDMABUF_TEST_UID")) {
    auto id = static_cast<uid_t>(std::strtoul(uid, nullptr, 10));
    if (setgid(id) != 0 || setuid(id) != 0) {
      std::perror("rdmabuf_test_reader: dropping privileges");
      return 2;
    }
  }
  auto handle = rdmabuf::RemoteBuffer::from_text(argv[arg]);
  if (!handle.ok()) {
    std::printf("status %s\n", handle.status().to_string().c_str());
    return 0;
  }
  auto length = std::strtoull(argv[arg + 1], nullptr, 10);
  auto view = handle->slice(offset, length);
  auto manager = rdmabuf::Manager::create();
  auto local = rdmabuf::LocalMemory::allocate(length);
  if (!view.ok() || !manager.ok() || !local.ok()) {
    std::printf("status setup failed\n");
    return 2;
  }
  if (write) std::memset(local->data(), fill, length);
  if (wait) {
    std::printf("ready\n");
    std::fflush(stdout);
    char line[16];
    if (!std::fgets(line, sizeof line, stdin)) return 2;
  }
  rdmabuf::Status st;
  std::string backend, note;
  do {
    std::vector<rdmabuf::Op> ops;
    ops.push_back(write ? rdmabuf::Op::write(*view, *local) : rdmabuf::Op::read(*view, *local));
    rdmabuf::Transfer t = (*manager)->submit(std::move(ops), std::chrono::seconds(30));
    st = t.wait();
    backend = t.op_backend(0);
    note = t.op_note(0);
  } while (loop && st.ok());
  std::printf("status %s\n", st.to_string().c_str());
  std::printf("backend %s\n", backend.c_str());
  std::printf("note %s\n", note.c_str());
  std::printf("crc %08" PRIx32 "\n", rdmabuf::crc32c(local->data(), length));
  std::fflush(stdout);
  return 0;
}
