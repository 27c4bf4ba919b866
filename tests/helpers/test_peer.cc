// rdmabuf_test_peer: the owner process that integration tests spawn.
//
//   rdmabuf_test_peer [--gpu] [--buffer SIZE[:SEED]]... [--listen HOST:PORT]
//
// With --gpu its buffers, and the memory it reads into and writes from, are
// on GPU 0 (the driver RDMABUF_CUDA_DRIVER names, as tests/helpers/gpu.h
// sets it); the commands that look at bytes copy them to host memory first.
// Creates a Manager from the RDMABUF_* environment (so a test can set, e.g.,
// RDMABUF_MAX_CONNECTIONS), with --listen overriding the listen address.
// Registers one buffer per --buffer (SIZE accepts K/M/G; SEED defaults to
// the buffer's index + 1) filled with pattern SEED (tests/helpers/pattern.h),
// then prints, one per line:
//
//   address HOST:PORT
//   handle I TEXT        (one per buffer, TEXT = RemoteBuffer::to_text())
//   ready
//
// and answers one line per command read from stdin:
//
//   ping                          -> pong
//   release I                     -> ok | error STATUS
//   release-watch I MS            -> stable | changed AT | error STATUS
//                                    (releases buffer I, copies its bytes the
//                                    moment release() returns, and after MS
//                                    ms reports the first byte that changed)
//   crc I OFF LEN                 -> crc XXXXXXXX   (CRC-32C of the range)
//   check I OFF LEN SEED START    -> ok | mismatch AT   (byte OFF+k must be
//                                    pattern SEED at index START+k)
//   zeros I OFF LEN               -> ok | mismatch AT
//   words I OFF LEN SEED START    -> words N   (aligned 8-byte words equal to
//                                    pattern SEED; see count_pattern_words)
//   fill I SEED                   -> ok   (the whole buffer, pattern index 0)
//   register SIZE SEED            -> handle I TEXT
//   count                         -> count N   (Manager::registered_count)
//   alias I                       -> handle J TEXT   (registers buffer I's memory
//                                    again, as a new buffer J sharing its bytes)
//   detail BACKEND KEY            -> detail VALUE | error ...   (the detail KEY,
//                                    which may hold spaces, of BACKEND in
//                                    Manager::backends(), e.g.
//                                    "detail ibverbs handshakes served")
//   read TEXT                     -> crc XXXXXXXX BACKEND | error STATUS
//                                    (reads the whole handle TEXT, minted by
//                                    another process, into fresh memory with
//                                    this peer's manager, timeout 30 s; the
//                                    CRC-32C of the bytes and the backend used)
//   write TEXT SEED               -> ok BACKEND | error STATUS   (writes pattern
//                                    SEED, index 0, over the whole handle TEXT)
//   endpoint-connect ADDRESS      -> ok | error STATUS   (Manager::connect to an
//                                    endpoint listener; the endpoint is kept)
//   endpoint-send SIZE SEED       -> started | error ...   (on that endpoint, in
//                                    a thread of its own, sends one message of
//                                    SIZE bytes of pattern SEED, index 0; the
//                                    answer does not wait for it)
//   add TEXT COUNT BATCH          -> added SUM SUMSQ BACKEND | error STATUS
//                                    (COUNT fetch-adds of 1 on the 8-byte word
//                                    TEXT, BATCH to a transfer; SUM and SUMSQ:
//                                    the sum of the previous values and of
//                                    their squares, mod 2^64)
//   locked-add LOCK WORD COUNT ID -> ok BACKEND | error ...   (COUNT times:
//                                    takes the lock word LOCK by compare-and-
//                                    swap from 0 to ID, reads the word WORD,
//                                    writes it back plus 1, and frees the lock
//                                    by compare-and-swap from ID to 0; BACKEND
//                                    carried the read)
//   exit                          -> bye, then shuts the manager down and exits 0
//
// With RDMABUF_TEST_PRIVATE_HOST=1 its host memory is anonymous and private
// (tests/helpers/gpu.h), which the memory transport copies through the
// kernel, instead of LocalMemory::allocate's shared file, which it maps.
//
// With RDMABUF_TEST_NONDUMPABLE=1 in its environment it makes itself
// non-dumpable first, so that same-user readers cannot attach to it.
//
// Anything unparsable answers "error ...". End of stdin (the test died)
// exits at once. Buffers stay allocated after release, so a test can check
// that a refused write left them unchanged.
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/gpu.h"
#include "tests/helpers/pattern.h"
#include "tests/helpers/sanitizer.h"

namespace {

using rdmabuf::LocalMemory;
using rdmabuf::RemoteBuffer;

struct Buffer {
  LocalMemory memory;
  RemoteBuffer handle;
};

// Where this peer's memory is (--gpu).
rdmabuf::MemoryKind g_kind = rdmabuf::MemoryKind::kHost;

void say(const std::string& line) {
  std::string out = line + "\n";
  const char* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    ssize_t n = ::write(STDOUT_FILENO, p, left);
    if (n <= 0) std::_Exit(3);  // the test is gone
    p += n;
    left -= static_cast<size_t>(n);
  }
}

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "rdmabuf_test_peer: %s\n", why.c_str());
  std::exit(2);
}

bool add_buffer(rdmabuf::Manager& manager, std::vector<Buffer>& buffers, uint64_t size,
                uint64_t seed, std::string* error) {
  auto memory = rdmabuf::testing::with_pattern_of(g_kind, size, seed);
  if (!memory.data()) {
    *error = "cannot allocate " + std::to_string(size) + " bytes of " +
             rdmabuf::memory_kind_name(g_kind) + " memory";
    return false;
  }
  auto handle = manager.register_buffer(memory);
  if (!handle.ok()) {
    *error = handle.status().to_string();
    return false;
  }
  buffers.push_back(Buffer{memory, *handle});
  return true;
}

// Parses "I OFF LEN" against the buffers; false when out of range.
bool parse_range(std::istringstream& in, const std::vector<Buffer>& buffers, size_t* index,
                 uint64_t* offset, uint64_t* length) {
  if (!(in >> *index >> *offset >> *length)) return false;
  if (*index >= buffers.size()) return false;
  uint64_t size = buffers[*index].memory.size();
  return *offset <= size && *length <= size - *offset;
}

// The endpoint of endpoint-connect, and the threads sending on it.
std::unique_ptr<rdmabuf::Endpoint> g_endpoint;
std::vector<std::thread> g_senders;

// Before the manager goes: the endpoint's calls end, its threads stop.
void close_endpoint() {
  if (g_endpoint) g_endpoint->close();
  for (std::thread& t : g_senders)
    t.join();
  g_endpoint.reset();
}

// One transfer of `ops`; its status, with the backend of op 0 in `backend`.
rdmabuf::Status run_ops(rdmabuf::Manager& manager, std::vector<rdmabuf::Op> ops,
                        std::string* backend = nullptr,
                        std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  rdmabuf::Transfer t = manager.submit(std::move(ops), timeout);
  rdmabuf::Status st = t.wait();
  if (backend) *backend = std::string(t.op_backend(0));
  return st;
}

uint64_t load_word(const LocalMemory& m, size_t at = 0) {
  uint64_t word;
  std::memcpy(&word, m.data() + at, sizeof word);
  return word;
}

// The commands of remote atomics: add and locked-add.
std::string answer_atomics(rdmabuf::Manager& manager, const std::string& cmd,
                           std::istringstream& in) {
  using rdmabuf::Op;
  if (cmd == "add") {
    std::string text;
    uint64_t count = 0, batch = 0;
    if (!(in >> text >> count >> batch) || batch == 0) return "error usage: add TEXT COUNT BATCH";
    auto word = RemoteBuffer::from_text(text);
    if (!word.ok()) return "error " + word.status().to_string();
    auto previous = LocalMemory::allocate(batch * 8);
    if (!previous.ok()) return "error " + previous.status().to_string();
    uint64_t sum = 0, sum_of_squares = 0;
    std::string backend;
    for (uint64_t done = 0; done < count;) {
      const uint64_t n = std::min(batch, count - done);
      std::vector<Op> ops;
      for (uint64_t i = 0; i < n; ++i)
        ops.push_back(Op::fetch_add(*word, *previous->slice(i * 8, 8), 1));
      rdmabuf::Status st = run_ops(manager, std::move(ops), &backend);
      if (!st.ok()) return "error " + st.to_string();
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t v = load_word(*previous, i * 8);
        sum += v;
        sum_of_squares += v * v;
      }
      done += n;
    }
    return "added " + std::to_string(sum) + " " + std::to_string(sum_of_squares) + " " + backend;
  }
  // locked-add
  std::string lock_text, word_text;
  uint64_t count = 0, id = 0;
  if (!(in >> lock_text >> word_text >> count >> id) || id == 0) {
    return "error usage: locked-add LOCK WORD COUNT ID";
  }
  auto lock = RemoteBuffer::from_text(lock_text);
  auto word = RemoteBuffer::from_text(word_text);
  if (!lock.ok() || !word.ok()) return "error a bad handle";
  auto local = LocalMemory::allocate(8);
  if (!local.ok()) return "error " + local.status().to_string();
  std::string backend;
  for (uint64_t i = 0; i < count; ++i) {
    while (true) {  // take the lock
      rdmabuf::Status st = run_ops(manager, {Op::compare_and_swap(*lock, *local, 0, id)});
      if (!st.ok()) return "error " + st.to_string();
      if (load_word(*local) == 0) break;
      std::this_thread::yield();
    }
    rdmabuf::Status st = run_ops(manager, {Op::read(*word, *local)}, &backend);
    if (!st.ok()) return "error " + st.to_string();
    const uint64_t next = load_word(*local) + 1;
    std::memcpy(local->data(), &next, sizeof next);
    st = run_ops(manager, {Op::write(*word, *local)});
    if (!st.ok()) return "error " + st.to_string();
    st = run_ops(manager, {Op::compare_and_swap(*lock, *local, id, 0)});
    if (!st.ok()) return "error " + st.to_string();
    if (load_word(*local) != id) {
      return "error the lock held " + std::to_string(load_word(*local)) + ", not " +
             std::to_string(id) + ", when this peer freed it";
    }
  }
  return "ok " + backend;
}

std::string answer(rdmabuf::Manager& manager, std::vector<Buffer>& buffers, const std::string& line,
                   bool* exit_now) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  size_t index = 0;
  uint64_t offset = 0, length = 0, seed = 0, start = 0;
  if (cmd == "ping") return "pong";
  if (cmd == "add" || cmd == "locked-add") return answer_atomics(manager, cmd, in);
  if (cmd == "endpoint-connect") {
    std::string address;
    if (!(in >> address)) return "error usage: endpoint-connect ADDRESS";
    auto endpoint = manager.connect(address, std::chrono::seconds(30));
    if (!endpoint.ok()) return "error " + endpoint.status().to_string();
    g_endpoint = std::move(endpoint).value();
    return "ok";
  }
  if (cmd == "endpoint-send") {
    if (!(in >> length >> seed)) return "error usage: endpoint-send SIZE SEED";
    if (!g_endpoint) return "error no endpoint (endpoint-connect first)";
    auto message = LocalMemory::allocate(length);
    if (!message.ok()) return "error " + message.status().to_string();
    rdmabuf::testing::fill_pattern(message->span(), seed);
    g_senders.emplace_back(
        [message = *message] { g_endpoint->send(message, std::chrono::seconds(60)).ignore(); });
    return "started";
  }
  if (cmd == "release") {
    if (!(in >> index) || index >= buffers.size()) return "error bad buffer index";
    rdmabuf::Status st = manager.release(buffers[index].handle);
    return st.ok() ? "ok" : "error " + st.to_string();
  }
  if (cmd == "release-watch") {
    uint64_t ms = 0;
    if (!(in >> index >> ms) || index >= buffers.size()) return "error usage: release-watch I MS";
    rdmabuf::Status st = manager.release(buffers[index].handle);
    if (!st.ok()) return "error " + st.to_string();
    rdmabuf::testing::ScopedIgnoreReads quiet;  // bytes written by other processes
    const auto& memory = buffers[index].memory;
    std::vector<std::byte> then(memory.data(), memory.data() + memory.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    for (size_t at = 0; at < then.size(); ++at) {
      if (memory.data()[at] != then[at]) return "changed " + std::to_string(at);
    }
    return "stable";
  }
  if (cmd == "count") return "count " + std::to_string(manager.registered_count());
  if (cmd == "exit") {
    *exit_now = true;
    return "bye";
  }
  if (cmd == "register") {
    if (!(in >> length >> seed) || length == 0) return "error usage: register SIZE SEED";
    std::string error;
    if (!add_buffer(manager, buffers, length, seed, &error)) return "error " + error;
    return "handle " + std::to_string(buffers.size() - 1) + " " + buffers.back().handle.to_text();
  }
  if (cmd == "alias") {
    if (!(in >> index) || index >= buffers.size()) return "error usage: alias I";
    auto handle = manager.register_buffer(buffers[index].memory);
    if (!handle.ok()) return "error " + handle.status().to_string();
    buffers.push_back(Buffer{buffers[index].memory, *handle});
    return "handle " + std::to_string(buffers.size() - 1) + " " + handle->to_text();
  }
  if (cmd == "detail") {
    std::string backend, key;
    if (!(in >> backend)) return "error usage: detail BACKEND KEY";
    std::getline(in >> std::ws, key);
    for (const rdmabuf::BackendInfo& info : manager.backends()) {
      if (info.name != backend) continue;
      for (const auto& [name, value] : info.details) {
        if (name == key) return "detail " + value;
      }
      return "error backend " + backend + " has no detail '" + key + "'";
    }
    return "error no backend " + backend;
  }
  if (cmd == "read" || cmd == "write") {
    std::string text;
    if (!(in >> text)) return "error usage: " + cmd + " TEXT";
    if (cmd == "write" && !(in >> seed)) return "error usage: write TEXT SEED";
    auto handle = RemoteBuffer::from_text(text);
    if (!handle.ok()) return "error " + handle.status().to_string();
    LocalMemory local = cmd == "write"
                            ? rdmabuf::testing::with_pattern_of(g_kind, handle->size(), seed)
                            : rdmabuf::testing::allocate_of(g_kind, handle->size());
    if (!local.data()) return "error cannot allocate the local memory";
    std::string backend;
    rdmabuf::Status st = run_ops(
        manager,
        {cmd == "read" ? rdmabuf::Op::read(*handle, local) : rdmabuf::Op::write(*handle, local)},
        &backend, std::chrono::seconds(30));
    if (!st.ok()) return "error " + st.to_string();
    if (cmd == "write") return "ok " + backend;
    char text_crc[32];
    const rdmabuf::testing::HostBytes got(local);
    std::snprintf(text_crc, sizeof text_crc, "crc %08" PRIx32,
                  rdmabuf::crc32c(got.data(), got.size()));
    return text_crc + std::string(" ") + backend;
  }
  if (cmd == "fill") {
    if (!(in >> index >> seed) || index >= buffers.size()) return "error usage: fill I SEED";
    rdmabuf::testing::ScopedIgnoreAccesses quiet;
    std::vector<std::byte> bytes(buffers[index].memory.size());
    rdmabuf::testing::fill_pattern(bytes, seed);
    rdmabuf::testing::put_bytes(buffers[index].memory, 0, bytes);
    return "ok";
  }
  if (!parse_range(in, buffers, &index, &offset, &length)) return "error bad range";
  // Remote writes landed here through the manager's threads and a socket;
  // see sanitizer.h.
  rdmabuf::testing::ScopedIgnoreReads quiet;
  const rdmabuf::testing::HostBytes held(buffers[index].memory);
  std::span<const std::byte> range = held.span().subspan(offset, length);
  if (cmd == "crc") {
    char text[32];
    std::snprintf(text, sizeof text, "crc %08" PRIx32, rdmabuf::crc32c(range.data(), range.size()));
    return text;
  }
  if (cmd == "zeros") {
    auto at = rdmabuf::testing::find_not(range, std::byte{0});
    return at ? "mismatch " + std::to_string(*at) : "ok";
  }
  if (!(in >> seed >> start)) return "error usage: " + cmd + " I OFF LEN SEED START";
  if (cmd == "check") {
    auto at = rdmabuf::testing::find_mismatch(range, seed, start);
    return at ? "mismatch " + std::to_string(*at) : "ok";
  }
  if (cmd == "words") {
    return "words " + std::to_string(rdmabuf::testing::count_pattern_words(range, seed, start));
  }
  return "error unknown command '" + cmd + "'";
}

}  // namespace

int main(int argc, char** argv) {
  struct Spec {
    uint64_t size;
    uint64_t seed;
  };
  std::vector<Spec> specs;
  std::string listen;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--buffer" && i + 1 < argc) {
      std::string spec = argv[++i];
      size_t colon = spec.find(':');
      auto size = rdmabuf::parse_size(spec.substr(0, colon));
      if (!size.ok() || *size == 0) die("bad --buffer size '" + spec + "'");
      uint64_t seed = specs.size() + 1;
      if (colon != std::string::npos) seed = std::stoull(spec.substr(colon + 1));
      specs.push_back(Spec{*size, seed});
    } else if (arg == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (arg == "--gpu") {
      g_kind = rdmabuf::MemoryKind::kCuda;
    } else {
      die("usage: rdmabuf_test_peer [--gpu] [--buffer SIZE[:SEED]]... [--listen HOST:PORT]");
    }
  }
  if (g_kind == rdmabuf::MemoryKind::kCuda) {
    rdmabuf::Status gpu = rdmabuf::testing::use_test_gpu();
    if (!gpu.ok()) die("--gpu: " + gpu.to_string());
  }

  // RDMABUF_TEST_NONDUMPABLE=1: other processes of this user may not
  // attach to this one (so the memory backend cannot reach it).
  if (const char* nd = std::getenv("RDMABUF_TEST_NONDUMPABLE"); nd && std::string(nd) == "1") {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  }
  auto config = rdmabuf::Config::from_env();
  if (!config.ok()) die(config.status().to_string());
  if (!listen.empty()) config->listen_address = listen;
  auto manager = rdmabuf::Manager::create(*config);
  if (!manager.ok()) die("cannot start a manager: " + manager.status().to_string());

  std::vector<Buffer> buffers;
  for (const Spec& spec : specs) {
    std::string error;
    if (!add_buffer(**manager, buffers, spec.size, spec.seed, &error)) die(error);
  }
  say("address " + (*manager)->address());
  for (size_t i = 0; i < buffers.size(); ++i)
    say("handle " + std::to_string(i) + " " + buffers[i].handle.to_text());
  say("ready");

  std::string line;
  while (std::getline(std::cin, line)) {
    bool exit_now = false;
    say(answer(**manager, buffers, line, &exit_now));
    if (exit_now) {
      close_endpoint();
      (*manager)->shutdown();
      return 0;
    }
  }
  // stdin closed: the test that started us is gone.
  close_endpoint();
  return 0;
}
