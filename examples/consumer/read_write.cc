// A minimal two-process read and write with rdmabuf.
//
//   read_write owner          registers a buffer, prints its handle on one line,
//                             and serves peers until its stdin closes
//   read_write reader HANDLE  reads the buffer, checks it, writes new content
//                             into it, reads it back, checks again, prints OK
//
// Both take their configuration from the RDMABUF_* environment variables.
#include <rdmabuf/rdmabuf.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

namespace {

constexpr size_t kSize = 4 << 20;

// Byte i holds (i + start) mod 251.
void fill(const rdmabuf::LocalMemory& memory, uint8_t start) {
  for (size_t i = 0; i < memory.size(); ++i)
    memory.data()[i] = std::byte((i + start) % 251);
}

bool holds(const rdmabuf::LocalMemory& memory, uint8_t start) {
  for (size_t i = 0; i < memory.size(); ++i) {
    if (memory.data()[i] != std::byte((i + start) % 251)) return false;
  }
  return true;
}

int fail(const rdmabuf::Status& status) {
  std::cerr << "read_write: " << status.to_string() << "\n";
  return 1;
}

int owner() {
  auto created = rdmabuf::Manager::create();  // configured from RDMABUF_*
  if (!created.ok()) return fail(created.status());
  rdmabuf::Manager& manager = **created;
  auto memory = rdmabuf::LocalMemory::allocate(kSize);
  if (!memory.ok()) return fail(memory.status());
  fill(*memory, 0);

  auto handle = manager.register_buffer(*memory);
  if (!handle.ok()) return fail(handle.status());
  std::cout << handle->to_text() << std::endl;

  // The manager's threads serve readers and writers; this thread just waits.
  for (std::string line; std::getline(std::cin, line);) {
  }
  rdmabuf::Status st = manager.release(*handle);
  return st.ok() ? 0 : fail(st);
}

int reader(const std::string& text) {
  auto handle = rdmabuf::RemoteBuffer::from_text(text);
  if (!handle.ok()) return fail(handle.status());
  auto created = rdmabuf::Manager::create();
  if (!created.ok()) return fail(created.status());
  rdmabuf::Manager& manager = **created;
  auto local = rdmabuf::LocalMemory::allocate(handle->size());
  if (!local.ok()) return fail(local.status());

  // Read the whole remote buffer into local memory.
  rdmabuf::Status st = manager.read_into(*handle, *local);
  if (!st.ok()) return fail(st);
  if (!holds(*local, 0)) return fail(rdmabuf::Internal("read: unexpected content"));

  // Write new content into it, then read it back into fresh memory.
  fill(*local, 1);
  st = manager.write_from(*handle, *local);
  if (!st.ok()) return fail(st);
  auto check = rdmabuf::LocalMemory::allocate(handle->size());
  if (!check.ok()) return fail(check.status());
  st = manager.read_into(*handle, *check);
  if (!st.ok()) return fail(st);
  if (!holds(*check, 1)) return fail(rdmabuf::Internal("read after write: unexpected content"));

  std::cout << "OK" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role = argc > 1 ? argv[1] : "";
  if (role == "owner" && argc == 2) return owner();
  if (role == "reader" && argc == 3) return reader(argv[2]);
  std::cerr << "usage: read_write owner | read_write reader HANDLE\n";
  return 2;
}
