// Writes the fuzz targets' seed corpus: one directory per target under the
// directory given (fuzz/corpus in the tree), each file a real input made by
// the library's own encoders: handles minted by a real Manager, hellos and
// ibverbs frames from the senders in common/hello.cc and
// backends/ibverbs/handshake.cc, tcp requests captured from a real
// tcp::Peer and the replies a real tcp::ServerConnection gives them, and
// endpoint frames built as docs/wire-format.md lays them out.
//
//   build-fuzz/fuzz/make_corpus fuzz/corpus
//
// Replaces what each target's directory held. Handles carry random ids,
// tokens and ports, so the files differ from run to run; any run's are fine.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/ibverbs/handle_context.h"
#include "common/buffer_access.h"
#include "common/hello.h"
#include "core/endpoint/frames.h"
#include "core/endpoint/shm_channel.h"
#include "fuzz/fuzz_support.h"
#include "rdmabuf/rdmabuf.h"
#include "tests/helpers/raw_endpoint.h"
#if RDMABUF_HAVE_IBVERBS
#include "backends/ibverbs/handshake.h"
#endif

namespace rdmabuf::fuzz {
namespace {

namespace fs = std::filesystem;

class CorpusWriter {
 public:
  explicit CorpusWriter(fs::path root) : root_(std::move(root)) {}

  // Empties (or creates) the directory of `target`; later writes go there.
  void start(const std::string& target) {
    dir_ = root_ / target;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  void write(const std::string& name, std::span<const uint8_t> bytes) {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    RDMABUF_FUZZ_CHECK(out.good());
    std::printf("%s: %zu bytes\n", (dir_ / name).c_str(), bytes.size());
  }
  void write(const std::string& name, std::string_view text) {
    write(name,
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }

 private:
  fs::path root_;
  fs::path dir_;
};

// What `send` wrote, given one end of a socket pair.
std::vector<uint8_t> captured(const std::function<Status(int)>& send) {
  SocketPair pair = socket_pair();
  send(pair.local.get()).ignore();  // a hello's sender then times out waiting for a reply
  return take_available(pair.remote.get());
}

std::vector<uint8_t> joined(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& p : parts)
    out.insert(out.end(), p.begin(), p.end());
  return out;
}

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

// --- fuzz_handle and fuzz_contexts --------------------------------------------

RemoteBuffer minted(const Config& config, size_t size) {
  auto manager = Manager::create(config);
  RDMABUF_FUZZ_CHECK(manager.ok());
  auto memory = LocalMemory::allocate(size);
  RDMABUF_FUZZ_CHECK(memory.ok());
  auto handle = (*manager)->register_buffer(*memory);
  RDMABUF_FUZZ_CHECK(handle.ok());
  return *handle;  // decoded handles outlive their manager
}

void write_handles_and_contexts(CorpusWriter& out) {
  RemoteBuffer every = minted(Config{}, 4 << 20);
  Config tcp_only;
  tcp_only.backends = {"tcp"};
  RemoteBuffer tcp = minted(tcp_only, 4096);
  auto slice = every.slice(1000, 8);
  RDMABUF_FUZZ_CHECK(slice.ok());

  ibverbs::HandleContext rdma{"mlx5_0", 0x7f3a12345000};
  detail::RemoteBufferFields fields;
  fields.id = 42;
  fields.region_size = 1 << 20;
  fields.token.fill(0x5c);
  fields.owner = PeerIdentity{0x1a2b3c4d5e6f7081, "[fd00::1]:40000",
                              "0b5e2a61-8a8f-4c2e-9d55-0f6c1c1a3e11", 4321};
  fields.contexts = {{"ibverbs", ibverbs::encode_context(rdma)}, {"tcp", {}}};
  auto ipv6_rdma = detail::RemoteBufferAccess::make(fields);
  RDMABUF_FUZZ_CHECK(ipv6_rdma.ok());

  out.start("fuzz_handle");
  out.write("manager_every_backend.bin", every.to_bytes());
  out.write("manager_every_backend.txt", every.to_text());
  out.write("manager_tcp.bin", tcp.to_bytes());
  out.write("manager_tcp.txt", tcp.to_text() + "\n");
  out.write("slice.bin", slice->to_bytes());
  out.write("ipv6_ibverbs_tcp.bin", ipv6_rdma->to_bytes());
  out.write("ipv6_ibverbs_tcp.txt", ipv6_rdma->to_text());

  out.start("fuzz_contexts");
  if (const BackendContext* memory = every.context("memory")) {
    out.write("memory_from_manager.bin", memory->data);
  }
  out.write("ibverbs_mlx5_0.bin", ibverbs::encode_context(rdma));
  out.write("ibverbs_rxe0.bin", ibverbs::encode_context({"rxe0", 0x55d0c0de0000}));
}

// --- fuzz_hello -------------------------------------------------------------

void write_hellos(CorpusWriter& out) {
  out.start("fuzz_hello");
  auto hello = [](Channel channel, uint64_t expected) {
    return captured([&](int fd) {
      return exchange_hello(fd, Hello{channel, kReaderId, expected}, Clock::now()).status();
    });
  };
  out.write("hello_tcp_data.bin", hello(Channel::kTcpData, kOwnerId));
  out.write("hello_ibverbs.bin", hello(Channel::kIbverbs, kOwnerId));
  out.write("hello_any_owner.bin", hello(Channel::kControl, 0));
  auto reply = [](const Status& status) {
    return captured([&](int fd) { return send_hello_reply(fd, kOwnerId, status, Clock::now()); });
  };
  out.write("reply_ok.bin", reply(Status::Ok()));
  out.write("reply_not_found.bin",
            reply(NotFound("the buffer's owner (manager 0123456789abcdef) is gone")));
  out.write("reply_exhausted.bin", reply(ResourceExhausted("the owner has 1024 connections open")));
}

// --- fuzz_ibverbs_frames ----------------------------------------------------

#if RDMABUF_HAVE_IBVERBS
void write_ibverbs_frames(CorpusWriter& out) {
  ibverbs::Endpoint endpoint;
  endpoint.qpn = 0x11;
  endpoint.psn = 0x123456;
  const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
  std::memcpy(endpoint.gid.raw, gid, sizeof gid);
  endpoint.mtu = IBV_MTU_1024;
  Token token;
  token.fill(0xa1);

  out.start("fuzz_ibverbs_frames");
  auto connect = captured([&](int fd) {
    return ibverbs::send_connect(fd, "rxe0", endpoint, {1, token, 32 << 10}, Clock::now(), -1);
  });
  auto query = [&](uint64_t id, uint64_t size) {
    return captured([&](int fd) {
      return ibverbs::send_query(fd, {id, token, size}, Clock::now(), -1);
    });
  };
  out.write("owner_connect_queries.bin", joined({connect, query(1, 32 << 10), query(2, 256)}));
  auto accepted = captured(
      [&](int fd) { return ibverbs::send_accepted(fd, Status::Ok(), endpoint, Clock::now(), -1); });
  auto answer = [&](uint64_t id, StatusCode code, uint32_t rkey) {
    return captured([&](int fd) { return ibverbs::send_answer(fd, {id, code, rkey}, -1); });
  };
  out.write("reader_accepted_answers.bin", joined({accepted, answer(1, StatusCode::kOk, 0x80001d42),
                                                   answer(7, StatusCode::kNotFound, 0)}));
  out.write("reader_refused.bin", captured([&](int fd) {
              return ibverbs::send_accepted(
                  fd, FailedPrecondition("this owner has no RDMA device 'mlx5_1' (it uses rxe0)"),
                  ibverbs::Endpoint{}, Clock::now(), -1);
            }));
}
#endif

// --- fuzz_tcp_server and fuzz_tcp_client --------------------------------------

// The requests a real reader sends for `plan`.
std::vector<uint8_t> requests_for(const ReaderPlan& plan) {
  ReaderOutcome outcome = run_reader(plan, {}, request_bytes(plan));
  RDMABUF_FUZZ_CHECK(outcome.requests.size() == request_bytes(plan));
  return outcome.requests;
}

void write_tcp_frames(CorpusWriter& out) {
  using Op = ReaderPlan::PlannedOp;
  struct Named {
    std::string name;
    ReaderPlan plan;
    // Whether its requests are a seed for fuzz_tcp_server too: not those of
    // over 100 KiB, which would raise that fuzzer's input length tenfold.
    bool server_seed = true;
  };
  // A scattered read or write of planned_ranges(index).
  auto scattered_op = [](bool write, size_t index) {
    uint64_t length = 0;
    for (const OpRange& r : planned_ranges(index))
      length += r.length;
    return Op{write, length, 0, static_cast<uint8_t>(index + 1)};
  };
  const std::vector<Named> plans = {
      {"reads_4k_chunks", ReaderPlan{{Op{false, 100}, Op{false, 20000}}, 4 << 10}},
      {"write_then_read", ReaderPlan{{Op{true, 4097}, Op{false, 100}}, 64 << 10}},
      {"large_read_and_write", ReaderPlan{{Op{true, 16384}, Op{false, 32768}}, 64 << 10}},
      {"four_small_ops",
       ReaderPlan{{Op{false, 1}, Op{true, 8}, Op{false, 4096}, Op{true, 2}}, 4 << 10}},
      // A large read (its payload sent from the buffer after the batch) and
      // a write to the same bytes, in one batch: the read must not see it.
      {"read_then_write_same_bytes", ReaderPlan{{Op{false, 20000}, Op{true, 8}}, 64 << 10}},
      // Atomics between a read and a write of the same word.
      {"reader_atomics",
       ReaderPlan{{Op{false, 8}, Op{false, 8, 3}, Op{false, 8, 4}, Op{true, 8}}, 4 << 10}},
      // Scattered ops: ranges across a chunk's end, out of order, many
      // small ones; then writes and a read in 64 KiB chunks; then over 4096
      // ranges, cut into two requests (137 KiB of them).
      {"scattered_reads",
       ReaderPlan{{scattered_op(false, 2), scattered_op(false, 3), scattered_op(false, 6)},
                  4 << 10}},
      {"scattered_writes_then_read",
       ReaderPlan{{scattered_op(true, 1), scattered_op(true, 4), scattered_op(false, 7)},
                  64 << 10}},
      {"scattered_many_ranges",
       ReaderPlan{{scattered_op(true, 5), scattered_op(false, 5)}, 64 << 10}, false},
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> servers, clients;
  for (const Named& n : plans) {
    std::vector<uint8_t> requests = requests_for(n.plan);
    if (n.server_seed) servers.emplace_back(n.name + ".bin", requests);
    clients.emplace_back(n.name + ".bin", joined({n.plan.encode(), serve_requests(requests)}));
  }
  // Refusals: the first request of the first plan with a wrong token, then
  // aimed at buffer 2 beyond its end, then at an unknown buffer.
  std::vector<uint8_t> refused = requests_for(plans[0].plan);
  refused[24] ^= 1;
  poke<uint64_t>(refused, 64 + 16, 2);  // the second request: buffer 2 ...
  std::memset(refused.data() + 64 + 24, 0xb2, 16);
  poke<uint64_t>(refused, 64 + 40, 256);  // ... of 256 B, at offset 0, for 4096 B
  poke<uint64_t>(refused, 128 + 16, 99);  // the third: an unknown buffer
  servers.emplace_back("refusals.bin", refused);
  clients.emplace_back("refusals.bin", joined({plans[0].plan.encode(), serve_requests(refused)}));

  // Atomics on buffer 1's word at 8: a fetch-add of 5, a compare-and-swap
  // that expects what that left (and so stores 42), one that expects
  // anything else, then a misaligned word and one past buffer 2's end.
  std::vector<uint8_t> atomics;
  auto atomic_request = [&atomics](uint8_t kind, uint64_t id, const OwnedBuffer& buffer,
                                   uint64_t offset, uint64_t first, uint64_t second) {
    std::vector<uint8_t> r(64 + 16, 0);
    r[0] = kind;
    poke<uint64_t>(r, 8, id);
    poke<uint64_t>(r, 16, buffer.id);
    std::memset(r.data() + 24, buffer.token_byte, 16);
    poke<uint64_t>(r, 40, buffer.size);
    poke<uint64_t>(r, 48, offset);
    poke<uint64_t>(r, 56, 8);
    poke<uint64_t>(r, 64, first);
    poke<uint64_t>(r, 72, second);
    atomics.insert(atomics.end(), r.begin(), r.end());
  };
  uint64_t word;
  std::memcpy(&word, initial_contents(0).data() + 8, sizeof word);
  atomic_request(3, 1, kOwnedBuffers[0], 8, 5, 0);
  atomic_request(4, 2, kOwnedBuffers[0], 8, word + 5, 42);
  atomic_request(4, 3, kOwnedBuffers[0], 8, word + 5, 43);
  atomic_request(3, 4, kOwnedBuffers[0], 12, 1, 0);
  atomic_request(4, 5, kOwnedBuffers[1], 256, 0, 1);
  servers.emplace_back("atomics.bin", atomics);

  // Scattered requests (kinds 5 and 6: the header's offset is the number
  // of ranges, its length their sum; a write's payload follows the list).
  std::vector<uint8_t> scattered;
  auto request = [&scattered](uint8_t kind, uint64_t id, const OwnedBuffer& buffer, uint64_t offset,
                              uint64_t length) {
    const size_t at = scattered.size();
    scattered.resize(at + 64, 0);
    scattered[at] = kind;
    poke<uint64_t>(scattered, at + 8, id);
    poke<uint64_t>(scattered, at + 16, buffer.id);
    std::memset(scattered.data() + at + 24, buffer.token_byte, 16);
    poke<uint64_t>(scattered, at + 40, buffer.size);
    poke<uint64_t>(scattered, at + 48, offset);
    poke<uint64_t>(scattered, at + 56, length);
  };
  auto scattered_request = [&](uint8_t kind, uint64_t id, const OwnedBuffer& buffer,
                               std::initializer_list<std::pair<uint64_t, uint64_t>> ranges,
                               uint64_t length) {
    request(kind, id, buffer, ranges.size(), length);
    for (const auto& [offset, range_length] : ranges) {
      scattered.resize(scattered.size() + 16);
      poke<uint64_t>(scattered, scattered.size() - 16, offset);
      poke<uint64_t>(scattered, scattered.size() - 8, range_length);
    }
    for (uint64_t i = 0; kind == 6 && i < length; ++i)
      scattered.push_back(static_cast<uint8_t>(0x40 + i * 3));
  };
  const OwnedBuffer& large = kOwnedBuffers[0];
  const OwnedBuffer& small = kOwnedBuffers[1];
  // A write of three ranges of buffer 1 out of order, a read of ranges
  // across them (one long enough to be sent from the buffer) and a write
  // of two overlapping ranges after it, on bytes that read returns; then a
  // read and a write with one range past buffer 2's end (refused whole,
  // the write's payload discarded) and a plain read of what that write
  // would have changed.
  scattered_request(6, 1, large, {{5000, 300}, {100, 10}, {40, 20}}, 330);
  scattered_request(5, 2, large, {{40, 20}, {95, 20}, {4900, 600}, {100, 4}}, 644);
  scattered_request(6, 3, large, {{5000, 8}, {5004, 8}}, 16);
  scattered_request(5, 4, small, {{0, 8}, {250, 8}}, 16);
  scattered_request(6, 5, small, {{200, 16}, {256, 1}}, 17);
  request(1, 6, small, 200, 16);
  servers.emplace_back("scattered.bin", std::exchange(scattered, {}));
  // A read, then lists the owner hangs up at: one with an empty range, one
  // whose lengths add up to more than the header's.
  scattered_request(5, 1, small, {{8, 8}, {0, 8}}, 16);
  scattered_request(5, 2, large, {{0, 4}, {8, 0}}, 4);
  scattered_request(6, 3, large, {{0, 4}, {8, 4}}, 4);
  servers.emplace_back("scattered_bad_lists.bin", std::exchange(scattered, {}));
  // A scattered write whose payload is cut short after its first range.
  scattered_request(6, 1, large, {{300, 16}, {100, 16}}, 32);
  scattered.resize(scattered.size() - 8);
  servers.emplace_back("scattered_write_cut.bin", std::exchange(scattered, {}));

  // A goodbye after the first reply of four_small_ops (a read of 1 byte):
  // the reader goes again on a new connection for the other three.
  std::vector<uint8_t> first_reply = serve_requests(requests_for(plans[3].plan));
  first_reply.resize(24 + 1);
  std::vector<uint8_t> goodbye(24, 0);
  goodbye[0] = 0xff;
  clients.emplace_back("goodbye.bin", joined({plans[3].plan.encode(), first_reply, goodbye}));

  out.start("fuzz_tcp_server");
  for (const auto& [name, bytes] : servers)
    out.write(name, bytes);
  out.start("fuzz_tcp_client");
  for (const auto& [name, bytes] : clients)
    out.write(name, bytes);
}

// --- fuzz_config --------------------------------------------------------------

void write_config(CorpusWriter& out) {
  out.start("fuzz_config");
  // The first byte picks the variable (fuzz_config.cc's list); the rest is its value.
  const std::pair<uint8_t, std::string_view> values[] = {
      {0, "127.0.0.1:0"}, {1, "10.0.0.7"}, {2, "tcp,memory"}, {3, "yes"},    {4, "4"},
      {5, "1M"},          {6, "mlx5_0"},   {7, "-1"},         {8, "64K"},    {9, "200"},
      {10, "30000"},      {11, "30000"},   {12, "1024"},      {13, "debug"},
  };
  for (const auto& [index, value] : values) {
    std::string input(1, static_cast<char>(index));
    input += value;
    out.write("env_" + std::to_string(index) + ".txt", input);
  }
  out.write("size.txt", "64K");
  out.write("address_v6.txt", "[::1]:40000");
}

// --- fuzz_endpoint_frames -------------------------------------------------------

// Streams of control frames a peer sends to an endpoint that posted
// receives 0 (64 B) and 1 (8 KiB), one family of frames each.
void write_endpoint_frames(CorpusWriter& out) {
  using testing::raw_frame;
  using testing::RawFrame;
  using testing::RawPayload;
  out.start("fuzz_endpoint_frames");
  Config tcp_only;
  tcp_only.backends = {"tcp"};
  const std::vector<uint8_t> handle = minted(tcp_only, 8192).to_bytes();
  auto stream = [](std::initializer_list<std::vector<uint8_t>> frames) {
    std::vector<uint8_t> all;
    for (const auto& f : frames)
      all.insert(all.end(), f.begin(), f.end());
    return all;
  };
  const uint8_t hello[] = {'h', 'e', 'l', 'l', 'o'};
  out.write("inline_answers.bin",
            stream({raw_frame(RawFrame::kSentInline, RawPayload().u64(0).bytes(hello)),
                    raw_frame(RawFrame::kSentInline, RawPayload().u64(1))}));
  out.write("sent_and_too_large.bin",
            stream({raw_frame(RawFrame::kTooLarge, RawPayload().u64(0).u64(65)),
                    raw_frame(RawFrame::kSent, RawPayload().u64(1).u64(100))}));
  out.write("message_in_parts.bin",
            stream({raw_frame(RawFrame::kSentPart, RawPayload().u64(0).u64(8).bytes(hello)),
                    raw_frame(RawFrame::kSentPart,
                              RawPayload().u64(0).u64(8).bytes(std::span(hello).first(3)))}));
  out.write("not_taken.bin", raw_frame(RawFrame::kNotTaken, RawPayload().u64(0).u64(0)));
  out.write("credits_and_withdrawal.bin",
            stream({raw_frame(RawFrame::kPosted, RawPayload().u64(0).u64(64).blob("")),
                    raw_frame(RawFrame::kPosted, RawPayload().u64(1).u64(8192).blob(handle)),
                    raw_frame(RawFrame::kWithdrawn, RawPayload().u64(0).u64(0))}));
  out.write("lend_and_renew.bin",
            stream({raw_frame(RawFrame::kLendRequest, RawPayload().u64(1).u64(4096).u64(1000)),
                    raw_frame(RawFrame::kRenew, RawPayload().u64(2).u64(1).u64(1000))}));
  out.write("notify.bin", raw_frame(RawFrame::kNotify, RawPayload().u32(7).u64(1).u64(0).u64(8)));
  out.write("buffer.bin", raw_frame(RawFrame::kBuffer, RawPayload().blob(handle)));
  out.write("handle_wanted.bin", raw_frame(RawFrame::kHandleWanted, RawPayload().u64(3).u64(1)));
  out.write(
      "replies.bin",
      stream({raw_frame(RawFrame::kLent, RawPayload().u64(0).u8(0).u64(1000).blob(handle)),
              raw_frame(RawFrame::kRenewed, RawPayload().u64(1).u8(2).u64(0).blob("gone")),
              raw_frame(RawFrame::kReceiveHandle, RawPayload().u64(2).u8(0).u64(0).blob(handle))}));
}

// --- fuzz_endpoint_handshake ----------------------------------------------------

// Handshakes, the first byte saying which side plays: even, a connecting
// peer (its hello and channel offer); odd, a listener (its hello and
// channel answer).
void write_endpoint_handshakes(CorpusWriter& out) {
  using testing::raw_frame;
  using testing::RawEndpointPeer;
  using testing::RawFrame;
  using testing::RawPayload;
  out.start("fuzz_endpoint_handshake");
  auto side = [](uint8_t role, std::initializer_list<std::vector<uint8_t>> frames) {
    std::vector<uint8_t> all = {role};
    for (const auto& f : frames)
      all.insert(all.end(), f.begin(), f.end());
    return all;
  };
  const std::vector<uint8_t> hello = RawEndpointPeer::hello(0x5eed);
  auto offer = [](uint8_t rdma) {
    return raw_frame(RawFrame::kChannelOffer,
                     RawPayload().u8(0).blob("no rings").u8(rdma).blob(rdma ? "" : "no NIC"));
  };
  out.write("peer_declines_both.bin", side(0, {hello, offer(0)}));
  out.write("peer_offers_rdma.bin",
            side(0, {hello, offer(1),
                     raw_frame(RawFrame::kChannelReady, RawPayload().u8(1).blob("address"))}));
  // Rings of a process that is not the peer (pid 1), at an fd the fuzzer
  // holds, over a socket it names: refused before anything is opened.
  out.write(
      "peer_offers_rings.bin",
      side(0, {hello,
               raw_frame(
                   RawFrame::kChannelOffer,
                   RawPayload().u8(1).u32(1).u32(3).u32(4).u64(1).u64(42).blob("host").u8(0).blob(
                       "no NIC"))}));
  auto answer = [](uint8_t taken, const std::string& address) {
    return raw_frame(RawFrame::kChannelAnswer,
                     RawPayload().u8(taken).blob("").blob("").blob(address));
  };
  out.write("listener_takes_tcp.bin", side(1, {hello, answer(0, "")}));
  out.write("listener_takes_rings.bin", side(1, {hello, answer(1, "")}));
  out.write("listener_takes_rdma.bin", side(1, {hello, answer(2, "address")}));
  out.write(
      "listener_too_new.bin",
      side(1, {raw_frame(RawFrame::kHello, RawPayload().u32(endpoint::kMagic).u16(99).u64(1))}));
}

// --- fuzz_shm_ring ----------------------------------------------------------------

// One frame each, as the codec's encoders write it: the type's byte, then
// the payload (fuzz_frame_codec.cc).
void write_frame_codec(CorpusWriter& out) {
  using endpoint::Frame;
  out.start("fuzz_frame_codec");
  Config tcp_only;
  tcp_only.backends = {"tcp"};
  const std::vector<uint8_t> handle = minted(tcp_only, 8192).to_bytes();
  auto seed = [](endpoint::FrameBuilder&& frame) {
    const Frame type = frame.type();
    const std::span<const uint8_t> bytes = frame.done();
    std::vector<uint8_t> all = {static_cast<uint8_t>(type)};
    all.insert(all.end(), bytes.begin() + endpoint::kHeaderSize, bytes.end());
    return all;
  };
  std::vector<uint8_t> credit = {static_cast<uint8_t>(Frame::kPosted)};
  endpoint::append_credit(credit, 3, 8192, handle);
  credit.erase(credit.begin() + 1, credit.begin() + 1 + endpoint::kHeaderSize);
  out.write("credit_with_handle.bin", credit);
  out.write("sent.bin", seed(endpoint::answer_frame(Frame::kSent, 3, 8000)));
  out.write("lend_request.bin",
            seed(endpoint::request_frame(Frame::kLendRequest, {1, 4096, 1000})));
  out.write("reply.bin", seed(endpoint::reply_frame(Frame::kLent, 1, Status::Ok(), 1000, handle)));
  out.write("notify.bin", seed(endpoint::notify_frame({7, 1, 0, 8})));
  out.write("buffer.bin", seed(endpoint::buffer_frame(handle)));
  out.write("hello.bin", seed(endpoint::hello_frame({0x5eed, 0x6b6579})));
  endpoint::ChannelOffer offer;
  offer.shared_memory = true;
  offer.pid = 1;
  offer.fd = 3;
  offer.socket_fd = 4;
  offer.host_id = "host";
  offer.no_rdma = "no NIC";
  out.write("offer.bin", seed(endpoint::channel_offer_frame(offer)));
  out.write("ready.bin", seed(endpoint::channel_ready_frame(Status::Ok(), handle)));
}

// Programs of {u8 op, u32 arg, u64 word} steps (fuzz_shm_ring.cc says what
// each op does) that the channel's own writer could have led to: records,
// a wrap to the next lap's start, reads in place and by copy, a write
// against a peer's head.
void write_shm_rings(CorpusWriter& out) {
  out.start("fuzz_shm_ring");
  constexpr uint64_t kRecord = uint64_t{0x52454331} << 32;  // "REC1"
  constexpr uint64_t kWrap = uint64_t{0x57524150} << 32;    // "WRAP"
  const uint32_t most = static_cast<uint32_t>(ShmChannel::most_whole_write());
  struct Step {
    uint8_t op;
    uint32_t arg;
    uint64_t word;
  };
  auto program = [](std::initializer_list<Step> steps) {
    std::vector<uint8_t> bytes;
    for (const Step& step : steps) {
      const size_t at = bytes.size();
      bytes.resize(at + 13);
      std::memcpy(bytes.data() + at, &step.op, 1);
      std::memcpy(bytes.data() + at + 1, &step.arg, 4);
      std::memcpy(bytes.data() + at + 5, &step.word, 8);
    }
    return bytes;
  };
  enum : uint8_t { kPoke = 0, kPeek = 1, kRead = 2, kWrite = 3 };
  out.write("two_records.bin", program({{kPoke, 0, kRecord | 5},
                                        {kPoke, 64, kRecord | 20},
                                        {kPeek, 2, 0},
                                        {kRead, 100, 0},
                                        {kPeek, 100, 0}}));
  // Two records of the most bytes (the second ends 128 bytes short of the
  // ring's end), then a wrap word there and a record at the lap's start.
  const uint32_t second = (8 + most + 63) / 64 * 64;
  out.write("wrap.bin", program({{kPoke, 0, kRecord | most},
                                 {kPoke, second, kRecord | most},
                                 {kPoke, 2 * second, kWrap},
                                 {kRead, 69999, 0},
                                 {kPeek, most, 0},
                                 {kRead, 69999, 0},
                                 {kPoke, 0, kRecord | 9},
                                 {kPeek, 0, 0},
                                 {kRead, 9, 0}}));
  // The same, with a record that ends exactly at the ring's end instead.
  out.write("record_at_the_end.bin", program({{kPoke, 0, kRecord | most},
                                              {kPoke, second, kRecord | most},
                                              {kPoke, 2 * second, kRecord | 120},
                                              {kRead, 69999, 0},
                                              {kPeek, most, 0},
                                              {kRead, 69999, 0},
                                              {kPeek, most, 0},
                                              {kPeek, 0, 0}}));
  out.write("write_against_a_head.bin",
            program({{kWrite, 100, 0}, {kWrite, most, 0}, {kWrite, 5000, 100000}}));
}

}  // namespace
}  // namespace rdmabuf::fuzz

int main(int argc, char** argv) {
  using namespace rdmabuf::fuzz;
  CorpusWriter out(argc > 1 ? argv[1] : "fuzz/corpus");
  write_handles_and_contexts(out);
  write_hellos(out);
#if RDMABUF_HAVE_IBVERBS
  write_ibverbs_frames(out);
#endif
  write_tcp_frames(out);
  write_config(out);
  write_endpoint_frames(out);
  write_endpoint_handshakes(out);
  write_frame_codec(out);
  write_shm_rings(out);
  return 0;
}
