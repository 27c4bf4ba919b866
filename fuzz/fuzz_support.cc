#include "fuzz/fuzz_support.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "backends/tcp/client.h"
#include "backends/tcp/server.h"
#include "common/buffer_access.h"
#include "common/event_loop.h"
#include "common/hello.h"
#include "core/registry.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::fuzz {
namespace {

using namespace std::chrono_literals;

// Longest any step of a run may take before the run counts as hung.
constexpr auto kHang = 10s;
constexpr int kHangMs = 10000;

// `size` bytes of heap memory, so that AddressSanitizer catches an access
// one byte past either end (mmap'd memory, as LocalMemory::allocate gives,
// has no redzones).
LocalMemory heap_memory(size_t size) {
  auto storage = std::make_shared<std::vector<std::byte>>(size);
  return LocalMemory(storage->data(), size, storage);
}

// Never set: the connections under test end by themselves.
std::atomic<bool> never_stopping{false};

// The owner's registry, made once per process and kept to its end.
struct Owner {
  Registry registry;
  std::vector<LocalMemory> memory;  // kOwnedBuffers' memory, in order

  Owner() {
    for (const OwnedBuffer& b : kOwnedBuffers) {
      LocalMemory m = heap_memory(b.size);
      registry.add(b.id, token_of(b), m);
      memory.push_back(m);
    }
  }
};

Owner& owner() {
  static Owner* the_owner = new Owner;  // never destroyed: serving threads may outlive exit
  return *the_owner;
}

// The loopback socket the reader target's owner listens on.
struct OwnerListener {
  Fd fd;
  HostPort address;

  OwnerListener() {
    auto listening = listen_tcp(HostPort{"127.0.0.1", 0}, 64);
    RDMABUF_FUZZ_CHECK(listening.ok());
    fd = std::move(listening).value();
    auto bound = local_address(fd.get());
    RDMABUF_FUZZ_CHECK(bound.ok());
    address = *bound;
  }
};

OwnerListener& owner_listener() {
  static OwnerListener* the_listener = new OwnerListener;
  return *the_listener;
}

// Closes with a reset rather than a FIN, so that a connection the reader
// has not hung up yet leaves no socket in TIME_WAIT behind (a fuzzer makes
// a thousand connections a second).
void close_abortively(Fd& fd) {
  linger abort_on_close{1, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
  fd.reset();
}

// Appends what is readable on `fd` now to `out`; false at end of stream or
// on an error.
bool take_into(int fd, std::vector<uint8_t>& out) {
  uint8_t chunk[16 << 10];
  while (true) {
    ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      out.insert(out.end(), chunk, chunk + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

// Takes the reader's next connection and its hello (as docs/wire-format.md
// says it) and answers it with `reply`.
Fd accept_reader(OwnerListener& listener, Deadline deadline, const Status& reply) {
  Fd conn(::accept4(listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  RDMABUF_FUZZ_CHECK(conn.valid());
  uint8_t hello[24];
  RDMABUF_FUZZ_CHECK(recv_exact(conn.get(), hello, sizeof hello, deadline).ok());
  RDMABUF_FUZZ_CHECK(std::memcmp(hello, "RBHI", 4) == 0);
  RDMABUF_FUZZ_CHECK(load<uint16_t>(hello, 4) == 1 && hello[6] == 2 && hello[7] == 0);
  RDMABUF_FUZZ_CHECK(load<uint64_t>(hello, 8) == kReaderId);
  RDMABUF_FUZZ_CHECK(load<uint64_t>(hello, 16) == kOwnerId);
  RDMABUF_FUZZ_CHECK(send_hello_reply(conn.get(), kOwnerId, reply, deadline).ok());
  return conn;
}

}  // namespace

// --- Sockets ----------------------------------------------------------------

SocketPair socket_pair() {
  int fds[2];
  RDMABUF_FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  int size = 1 << 20;
  ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  return SocketPair{Fd(fds[0]), Fd(fds[1])};
}

SocketPair fed_with(std::span<const uint8_t> bytes) {
  SocketPair pair = socket_pair();
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(pair.remote.get(), bytes.data() + sent, bytes.size() - sent,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(pair.remote.get(), SHUT_WR);
  return pair;
}

std::vector<uint8_t> take_available(int fd) {
  std::vector<uint8_t> out;
  take_into(fd, out);
  return out;
}

// --- The owner --------------------------------------------------------------

Token token_of(const OwnedBuffer& buffer) {
  Token token;
  token.fill(buffer.token_byte);
  return token;
}

// Computed once: the loops would cost a traced comparison per byte per run.
const std::vector<uint8_t>& initial_contents(size_t index) {
  static const auto* images = [] {
    auto* out = new std::vector<std::vector<uint8_t>>;
    for (const OwnedBuffer& b : kOwnedBuffers) {
      std::vector<uint8_t> bytes(b.size);
      for (size_t i = 0; i < b.size; ++i)
        bytes[i] = static_cast<uint8_t>(i * 7 + b.id * 31);
      out->push_back(std::move(bytes));
    }
    return out;
  }();
  return (*images)[index];
}

std::vector<uint8_t> serve_requests(std::span<const uint8_t> requests,
                                    std::vector<std::vector<uint8_t>>* contents) {
  Owner& o = owner();
  for (size_t b = 0; b < o.memory.size(); ++b)
    std::memcpy(o.memory[b].data(), initial_contents(b).data(), o.memory[b].size());
  SocketPair pair = socket_pair();
  tcp::ServerSettings settings{&o.registry, 0us, 2000ms, &never_stopping, -1};
  std::thread server([&settings, fd = std::move(pair.local)]() mutable {
    tcp::ServerConnection connection(std::move(fd), settings);
    serve_on_this_thread(connection);
  });  // the connection closes its socket when it returns

  // Send the requests while taking the replies; once every reply owed is
  // in, shut down, and take what comes until the server hangs up.
  const size_t owed = model_owner(requests).replies.size();
  Status nonblocking = set_nonblocking(pair.remote.get(), true);
  RDMABUF_FUZZ_CHECK(nonblocking.ok());
  std::vector<uint8_t> replies;
  size_t sent = 0;
  bool sending = true;
  bool open = true;
  while (true) {
    if (sending && sent == requests.size()) sending = false;
    if (open && !sending && replies.size() >= owed) {
      ::shutdown(pair.remote.get(), SHUT_WR);
      open = false;
    }
    pollfd p{pair.remote.get(), static_cast<short>(POLLIN | (sending ? POLLOUT : 0)), 0};
    int ready = ::poll(&p, 1, kHangMs);
    RDMABUF_FUZZ_CHECK(ready != 0);  // the server neither answers nor hangs up
    if (ready < 0) continue;
    if (sending && (p.revents & POLLOUT)) {
      ssize_t n = ::send(pair.remote.get(), requests.data() + sent, requests.size() - sent,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) sending = false;  // it hung up
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) && !take_into(pair.remote.get(), replies)) {
      break;
    }
  }
  server.join();
  if (contents) {
    contents->clear();
    for (const LocalMemory& m : o.memory) {
      const auto* data = reinterpret_cast<const uint8_t*>(m.data());
      contents->emplace_back(data, data + m.size());
    }
  }
  return replies;
}

// --- The owner's model -----------------------------------------------------

namespace {

constexpr size_t kRequest = 64;
constexpr uint64_t kMaxRequestLength = uint64_t{1} << 30;
// A scattered request's ranges: at most this many, of 16 bytes each.
constexpr uint64_t kMaxRanges = 4096;
constexpr size_t kRange = 16;

void put_reply(OwnerModel& m, uint8_t kind, StatusCode code, uint64_t id, uint64_t payload) {
  uint8_t header[24] = {};
  header[0] = static_cast<uint8_t>(kind | 0x80);
  header[1] = static_cast<uint8_t>(code);
  std::memcpy(header + 8, &id, 8);
  std::memcpy(header + 16, &payload, 8);
  m.replies.insert(m.replies.end(), header, header + sizeof header);
}

// Bytes [offset, offset + length) of a buffer.
struct Span {
  uint64_t offset, length;
};

}  // namespace

OwnerModel model_owner(std::span<const uint8_t> in) {
  OwnerModel m;
  for (size_t b = 0; b < std::size(kOwnedBuffers); ++b)
    m.buffers.push_back(initial_contents(b));
  size_t pos = 0;
  std::vector<Span> spans;
  while (in.size() - pos >= kRequest) {
    std::span<const uint8_t> h = in.subspan(pos, kRequest);
    const uint8_t kind = h[0];
    const uint64_t request_id = load<uint64_t>(h, 8);
    const uint64_t buffer_id = load<uint64_t>(h, 16);
    const uint64_t region = load<uint64_t>(h, 40);
    const uint64_t offset = load<uint64_t>(h, 48);  // a scattered request's: its ranges
    const uint64_t length = load<uint64_t>(h, 56);
    const bool atomic = kind == 3 || kind == 4;
    const bool scattered = kind == 5 || kind == 6;
    const bool read = kind == 1 || kind == 5;
    if (kind < 1 || kind > 6 || h[1] != 0 || load<uint16_t>(h, 2) != 0 ||
        load<uint32_t>(h, 4) != 0 || length == 0 || length > kMaxRequestLength ||
        (atomic && length != 8) || (scattered && (offset == 0 || offset > kMaxRanges))) {
      m.clean = false;  // the owner hangs up
      return m;
    }
    pos += kRequest;
    uint64_t operands[2] = {};
    if (atomic) {
      // Cut short: the owner hangs up without applying it; a fetch-add's
      // second operand must be 0.
      if (in.size() - pos < sizeof operands || (kind == 3 && load<uint64_t>(in, pos + 8) != 0)) {
        m.clean = false;
        return m;
      }
      operands[0] = load<uint64_t>(in, pos);
      operands[1] = load<uint64_t>(in, pos + 8);
      pos += sizeof operands;
    }
    // The bytes it moves, in payload order: a scattered request's ranges,
    // any other's one span. A list cut short is never applied, and one
    // with an empty range or whose lengths do not add up to `length` makes
    // the owner hang up: either way, with no reply.
    spans.clear();
    if (scattered) {
      if ((in.size() - pos) / kRange < offset) {
        m.clean = false;
        return m;
      }
      uint64_t sum = 0;  // at most 4096 ranges of at most 1 GiB: no overflow
      for (uint64_t k = 0; k < offset; ++k) {
        const Span r{load<uint64_t>(in, pos), load<uint64_t>(in, pos + 8)};
        if (r.length == 0 || r.length > length) {
          m.clean = false;
          return m;
        }
        sum += r.length;
        spans.push_back(r);
        pos += kRange;
      }
      if (sum != length) {
        m.clean = false;
        return m;
      }
    } else {
      spans.push_back(Span{offset, length});
    }
    StatusCode code = StatusCode::kNotFound;
    size_t buffer = 0;
    for (size_t b = 0; b < std::size(kOwnedBuffers); ++b) {
      if (kOwnedBuffers[b].id != buffer_id) continue;
      Token token = token_of(kOwnedBuffers[b]);
      const uint64_t size = m.buffers[b].size();
      buffer = b;
      auto outside = [size](const Span& s) {
        return s.offset > size || s.length > size - s.offset;
      };
      if (std::memcmp(h.data() + 24, token.data(), token.size()) != 0) {
        code = StatusCode::kPermissionDenied;
      } else if (region != size || std::any_of(spans.begin(), spans.end(), outside) ||
                 (atomic && offset % 8 != 0)) {  // the buffers are 8-byte aligned
        code = StatusCode::kInvalidArgument;
      } else {
        code = StatusCode::kOk;
      }
    }
    const bool ok = code == StatusCode::kOk;
    std::vector<uint8_t>& bytes = m.buffers[buffer];
    auto at = [&bytes](uint64_t offset_in) {
      return bytes.begin() + static_cast<ptrdiff_t>(offset_in);
    };
    if (atomic) {
      put_reply(m, kind, code, request_id, ok ? 8 : 0);
      if (!ok) continue;
      uint64_t word;
      std::memcpy(&word, &*at(offset), sizeof word);
      const uint64_t previous = word;
      if (kind == 3) {
        word += operands[0];
      } else if (word == operands[0]) {
        word = operands[1];
      }
      std::memcpy(&*at(offset), &word, sizeof word);
      const auto* p = reinterpret_cast<const uint8_t*>(&previous);
      m.replies.insert(m.replies.end(), p, p + sizeof previous);
      continue;
    }
    if (read) {  // the spans' bytes, one after the other
      put_reply(m, kind, code, request_id, ok ? length : 0);
      if (!ok) continue;
      for (const Span& s : spans)
        m.replies.insert(m.replies.end(), at(s.offset), at(s.offset + s.length));
      continue;
    }
    if (in.size() - pos < length) {  // cut short: the owner hangs up without a reply
      m.clean = false;
      if (ok) {  // it may have landed any of the spans' bytes, in part
        m.cut_buffer = buffer;
        m.cut_begin = bytes.size();
        m.cut_end = 0;
        for (const Span& s : spans) {
          m.cut_begin = std::min<size_t>(m.cut_begin, s.offset);
          m.cut_end = std::max<size_t>(m.cut_end, s.offset + s.length);
        }
      }
      return m;
    }
    if (ok) {  // span after span: a later one wins where they overlap
      for (const Span& s : spans) {
        std::copy(in.begin() + static_cast<ptrdiff_t>(pos),
                  in.begin() + static_cast<ptrdiff_t>(pos + s.length), at(s.offset));
        pos += s.length;
      }
    } else {
      pos += length;
    }
    put_reply(m, kind, code, request_id, 0);
  }
  if (pos != in.size()) m.clean = false;  // half a request, then the end
  return m;
}

// --- The reader -------------------------------------------------------------

bool ReaderPlan::parse(std::span<const uint8_t>& bytes, ReaderPlan* plan) {
  if (bytes.empty()) return false;
  size_t count = (bytes[0] & 3u) + 1;  // at most kMaxPlannedOps
  if (bytes.size() < 1 + count) return false;
  plan->chunk_size = (bytes[0] & 4u) ? 64 << 10 : 4 << 10;
  plan->ops.clear();
  for (size_t i = 0; i < count; ++i) {
    uint8_t b = bytes[1 + i];
    bool write = b & 1u;
    size_t index = (b >> 1) & 7u;
    if (b & 0x10u) {
      plan->ops.push_back(PlannedOp{false, 8, static_cast<uint8_t>((b & 0x20u) ? 4 : 3)});
      continue;
    }
    if (b & 0x40u) {
      uint64_t length = 0;
      for (const OpRange& r : planned_ranges(index))
        length += r.length;
      plan->ops.push_back(PlannedOp{write, length, 0, static_cast<uint8_t>(index + 1)});
      continue;
    }
    plan->ops.push_back(PlannedOp{write, write ? kWriteLengths[index] : kReadLengths[index]});
  }
  bytes = bytes.subspan(1 + count);
  return true;
}

std::vector<uint8_t> ReaderPlan::encode() const {
  std::vector<uint8_t> out;
  out.push_back(static_cast<uint8_t>((ops.size() - 1) | (chunk_size == (64 << 10) ? 4 : 0)));
  for (const PlannedOp& op : ops) {
    if (op.atomic != 0) {
      out.push_back(static_cast<uint8_t>(0x10 | (op.atomic == 4 ? 0x20 : 0)));
      continue;
    }
    if (op.ranges != 0) {
      out.push_back(static_cast<uint8_t>(0x40 | ((op.ranges - 1) << 1) | (op.write ? 1 : 0)));
      continue;
    }
    std::span<const uint64_t> lengths = op.write ? std::span<const uint64_t>(kWriteLengths)
                                                 : std::span<const uint64_t>(kReadLengths);
    size_t index =
        static_cast<size_t>(std::find(lengths.begin(), lengths.end(), op.length) - lengths.begin());
    out.push_back(static_cast<uint8_t>((op.write ? 1 : 0) | (index << 1)));
  }
  return out;
}

const std::vector<OpRange>& planned_ranges(size_t index) {
  static const auto* lists = [] {
    auto* out = new std::vector<std::vector<OpRange>>;
    // {remote offset, local offset, length}
    out->push_back({{100, 0, 50}});
    out->push_back({{4000, 8, 100}, {0, 200, 8}});
    out->push_back({{0, 0, 3000}, {8192, 3000, 3000}, {20000, 6000, 100}});  // across 4 KiB
    std::vector<OpRange> small;  // 16 of 8 bytes, landing in reverse order
    for (uint64_t i = 0; i < 16; ++i)
      small.push_back({i * 64 + 8, (15 - i) * 8, 8});
    out->push_back(std::move(small));
    out->push_back({{1000, 0, 10000}, {0, 10000, 1}});  // a range over 4 KiB
    // More ranges than one request holds.
    std::vector<OpRange> many;
    for (uint64_t i = 0; i < 4100; ++i)
      many.push_back({i * 4, i * 2, 2});
    out->push_back(std::move(many));
    out->push_back({{30000, 4000, 2000}, {10, 0, 4000}});
    out->push_back({{32767, 16383, 1}, {0, 0, 16383}});  // buffer 1's last byte
    return out;
  }();
  return (*lists)[index];
}

uint64_t planned_local_bytes(const ReaderPlan::PlannedOp& op) {
  if (op.ranges == 0) return op.length;
  uint64_t end = 0;
  for (const OpRange& r : planned_ranges(op.ranges - 1))
    end = std::max(end, r.local_offset + r.length);
  return end;
}

std::vector<PlannedChunk> planned_chunks(const ReaderPlan& plan) {
  constexpr size_t kMostRanges = 4096;
  std::vector<PlannedChunk> out;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    const auto& op = plan.ops[i];
    if (op.ranges == 0) {
      const uint8_t kind = op.atomic != 0 ? op.atomic : op.write ? 2 : 1;
      for (uint64_t at = 0; at < op.length; at += plan.chunk_size) {
        const uint64_t length = std::min(plan.chunk_size, op.length - at);
        out.push_back(PlannedChunk{i, kind, at, length, {{at, at, length}}});
      }
      continue;
    }
    // A new request once the last is full, in bytes or in ranges.
    const uint8_t kind = op.write ? 6 : 5;
    PlannedChunk c{i, kind, 0, 0, {}};
    for (const OpRange& r : planned_ranges(op.ranges - 1)) {
      for (uint64_t done = 0; done < r.length;) {
        if (c.length == plan.chunk_size || c.pieces.size() == kMostRanges) {
          const uint64_t next = c.op_offset + c.length;
          out.push_back(std::exchange(c, PlannedChunk{i, kind, next, 0, {}}));
        }
        const uint64_t take = std::min(r.length - done, plan.chunk_size - c.length);
        c.pieces.push_back({r.remote_offset + done, r.local_offset + done, take});
        c.length += take;
        done += take;
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

const std::vector<uint8_t>& initial_local(size_t op) {
  static const auto* images = [] {
    const uint64_t longest =
        std::max(*std::max_element(std::begin(kReadLengths), std::end(kReadLengths)),
                 *std::max_element(std::begin(kWriteLengths), std::end(kWriteLengths)));
    auto* out = new std::vector<std::vector<uint8_t>>;
    for (size_t i = 0; i < kMaxPlannedOps; ++i) {
      std::vector<uint8_t> bytes(longest);
      for (size_t j = 0; j < bytes.size(); ++j)
        bytes[j] = static_cast<uint8_t>(j * 13 + i * 101 + 5);
      out->push_back(std::move(bytes));
    }
    return out;
  }();
  return (*images)[op];
}

size_t request_bytes(const ReaderPlan& plan) {
  size_t total = 0;
  for (const PlannedChunk& c : planned_chunks(plan)) {
    total += 64 + (c.scattered() ? 16 * c.pieces.size() : 0) + (c.write() ? c.length : 0) +
             (c.kind == 3 || c.kind == 4 ? 16 : 0);
  }
  return total;
}

ReaderOutcome run_reader(const ReaderPlan& plan, std::span<const uint8_t> replies,
                         size_t expect_requests) {
  OwnerListener& listener = owner_listener();
  const OwnedBuffer& target = kOwnedBuffers[0];
  detail::RemoteBufferFields fields;
  fields.id = target.id;
  fields.region_size = target.size;
  fields.token = token_of(target);
  fields.owner = PeerIdentity{kOwnerId, listener.address.to_string(), "fuzz-host",
                              static_cast<uint32_t>(::getpid())};
  fields.contexts.push_back(BackendContext{"tcp", {}});
  auto handle = detail::RemoteBufferAccess::make(std::move(fields));
  RDMABUF_FUZZ_CHECK(handle.ok());

  std::vector<Op> ops;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    const auto& planned = plan.ops[i];
    const uint64_t local_bytes = planned_local_bytes(planned);
    RDMABUF_FUZZ_CHECK(local_bytes <= initial_local(i).size());
    LocalMemory local = heap_memory(local_bytes);
    std::memcpy(local.data(), initial_local(i).data(), local_bytes);
    if (planned.atomic != 0) {
      auto word = handle->slice(0, 8);
      RDMABUF_FUZZ_CHECK(word.ok());
      const PlannedOperands o = planned_operands(i, planned.atomic);
      ops.push_back(planned.atomic == 3 ? Op::fetch_add(*word, local, o.first)
                                        : Op::compare_and_swap(*word, local, o.first, o.second));
    } else if (planned.ranges != 0) {
      const std::vector<OpRange>& ranges = planned_ranges(planned.ranges - 1);
      ops.push_back(planned.write ? Op::write_ranges(*handle, local, ranges)
                                  : Op::read_ranges(*handle, local, ranges));
    } else if (planned.write) {
      ops.push_back(Op::write(*handle, local));
    } else {
      auto remote = handle->slice(0, planned.length);
      RDMABUF_FUZZ_CHECK(remote.ok());
      ops.push_back(Op::read(*remote, local));
    }
  }
  auto transfer = std::make_shared<TransferState>(ops, kHang, 0us);
  auto finished = make_eventfd();
  RDMABUF_FUZZ_CHECK(finished.ok());
  transfer->set_on_finish([fd = finished->get()] { signal_eventfd(fd); });

  tcp::PeerContext context;
  context.address = listener.address;
  context.owner_id = kOwnerId;
  context.self_id = kReaderId;
  context.stall_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kHang);
  context.stopping = &never_stopping;
  ReaderOutcome outcome;
  // The peer's stream runs on a loop of its own; stopping the loop after
  // the peer completes whatever the stream still held.
  auto loops = EventLoops::create(1, 0us);
  RDMABUF_FUZZ_CHECK(loops.ok());
  {
    tcp::Peer peer(context, 1, **loops);
    std::vector<uint32_t> indices(ops.size());
    for (uint32_t i = 0; i < indices.size(); ++i)
      indices[i] = i;
    peer.submit(transfer, indices, plan.chunk_size);

    // The owner: take the connection and its hello, answer it, then send
    // `replies` while taking whatever the reader sends.
    const Deadline deadline = Clock::now() + kHang;
    if (!wait_fd(listener.fd.get(), POLLIN, deadline).ok()) {
      peer.stop();
      (*loops)->stop();  // the stream has run its stop: the op has its status
      std::fprintf(stderr, "fuzz: the reader did not connect within %d ms; its first op: %s\n",
                   kHangMs, transfer->op_status(0).to_string().c_str());
      RDMABUF_FUZZ_CHECK(false);
    }
    Fd conn = accept_reader(listener, deadline, Status::Ok());
    while (outcome.requests.size() < expect_requests) {
      RDMABUF_FUZZ_CHECK(wait_fd(conn.get(), POLLIN, deadline).ok());
      RDMABUF_FUZZ_CHECK(take_into(conn.get(), outcome.requests));
    }
    size_t sent = 0;
    bool open = true;
    // A reader that read a goodbye among `replies` goes again on a new
    // connection: this owner serves one, so it refuses the others at their
    // hello (and the reader fails what it had left with kRefusedAgain).
    auto refuse_another = [&] {
      accept_reader(listener, deadline, Status(kRefusedAgain, "this owner serves one connection"));
    };
    while (open && sent < replies.size() && Clock::now() < deadline) {
      pollfd q[2] = {{conn.get(), POLLIN | POLLOUT, 0}, {listener.fd.get(), POLLIN, 0}};
      if (::poll(q, 2, kHangMs) <= 0) continue;
      if (q[0].revents & POLLOUT) {
        ssize_t n = ::send(conn.get(), replies.data() + sent, replies.size() - sent,
                           MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) sent += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EINTR) open = false;  // the reader hung up
      }
      if (q[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        open = take_into(conn.get(), outcome.requests);
      }
      if (q[1].revents & POLLIN) refuse_another();
    }
    ::shutdown(conn.get(), SHUT_WR);
    // Every op must now finish: its reply came, or the reader saw the end.
    while (!transfer->finished() && Clock::now() < deadline) {
      pollfd q[3] = {
          {finished->get(), POLLIN, 0}, {listener.fd.get(), POLLIN, 0}, {conn.get(), POLLIN, 0}};
      if (::poll(q, open ? 3 : 2, kHangMs) <= 0) continue;
      if (q[1].revents & POLLIN) refuse_another();
      if (q[2].revents) open = take_into(conn.get(), outcome.requests);
    }
    outcome.finished = transfer->finished();
    close_abortively(conn);
    peer.stop();
    (*loops)->stop();
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    outcome.op_status.push_back(transfer->op_status(i));
    const auto* data = reinterpret_cast<const uint8_t*>(ops[i].local.data());
    outcome.local.emplace_back(data, data + ops[i].local.size());
  }
  return outcome;
}

}  // namespace rdmabuf::fuzz
