// rdmabuf read / write: move bytes between a remote buffer and stdout/stdin.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace rdmabuf::tool {
namespace {

constexpr const char* kReadHelp = R"(usage: rdmabuf read HANDLE [--offset N] [--length N]

Reads bytes of the remote buffer that HANDLE names (the line `rdmabuf
serve` prints) and writes them to stdout, unchanged.

options:
  --offset N   first byte of the buffer to read (default 0)
  --length N   bytes to read (default: the rest of the buffer after --offset)
  -h, --help   this text

N takes K/M/G suffixes (binary).
exit status: 0; 1 when the read fails; 2 for a bad command line or
RDMABUF_* variable, a malformed HANDLE, or a range past the buffer's end.
)";

constexpr const char* kWriteHelp = R"(usage: rdmabuf write HANDLE [--offset N]

Reads stdin to its end, then writes those bytes into the remote buffer that
HANDLE names (the line `rdmabuf serve` prints), starting at --offset. The
bytes after them are left as they were. Reports the count on stderr.

options:
  --offset N   first byte of the buffer to write (default 0)
  -h, --help   this text

N takes K/M/G suffixes (binary).
exit status: 0; 1 when the write fails; 2 for a bad command line or
RDMABUF_* variable, a malformed HANDLE, an --offset past the buffer's end,
or more input than fits from --offset on (then nothing is written).
)";

struct Target {
  std::unique_ptr<Manager> manager;
  RemoteBuffer remote;  // the whole view after --offset / --length
};

// Decodes the handle and narrows it to [--offset, --offset + --length).
Result<Target> open_target(const Args& args, bool with_length) {
  if (args.positional.size() != 1) return InvalidArgument("expected exactly one HANDLE");
  RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer handle, RemoteBuffer::from_text(args.positional[0]));
  RDMABUF_ASSIGN_OR_RETURN(uint64_t offset, args.size("offset", 0));
  if (offset > handle.size()) {
    return InvalidArgument("--offset " + std::to_string(offset) + " is past the end of the " +
                           std::to_string(handle.size()) + " B buffer");
  }
  uint64_t length = handle.size() - offset;
  if (with_length) {
    RDMABUF_ASSIGN_OR_RETURN(length, args.size("length", length));
  }
  RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer view, handle.slice(offset, length));
  RDMABUF_ASSIGN_OR_RETURN(auto manager, Manager::create());
  return Target{std::move(manager), std::move(view)};
}

Status write_all(int fd, const std::byte* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Unavailable("writing stdout failed");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

int cmd_read(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kReadHelp);
  auto args = parse_args(argc, argv, 2, {"offset", "length"}, {});
  if (!args.ok()) return fail(args.status());
  auto target = open_target(*args, true);
  if (!target.ok()) return fail(target.status());
  const uint64_t size = target->remote.size();
  if (size == 0) return kExitOk;
  auto local = LocalMemory::allocate(size);
  if (!local.ok()) return fail(local.status());
  Status st = target->manager->read_into(target->remote, *local);
  if (!st.ok()) return fail(st);
  st = write_all(STDOUT_FILENO, local->data(), size);
  return st.ok() ? kExitOk : fail(st);
}

int cmd_write(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kWriteHelp);
  auto args = parse_args(argc, argv, 2, {"offset"}, {});
  if (!args.ok()) return fail(args.status());
  auto target = open_target(*args, false);
  if (!target.ok()) return fail(target.status());
  std::vector<std::byte> input;
  std::byte chunk[1 << 16];
  while (true) {
    ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(Unavailable("reading stdin failed"));
    if (n == 0) break;
    input.insert(input.end(), chunk, chunk + n);
    if (input.size() > target->remote.size()) {
      return fail(InvalidArgument("stdin holds more than the " +
                                  std::to_string(target->remote.size()) +
                                  " B the remote range has room for"));
    }
  }
  Status st = target->manager->write_from(target->remote, LocalMemory::from_span(input));
  if (!st.ok()) return fail(st);
  std::fprintf(stderr, "rdmabuf: wrote %zu bytes\n", input.size());
  return kExitOk;
}

}  // namespace rdmabuf::tool
