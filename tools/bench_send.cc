// rdmabuf bench --op send: two-sided messages over an Endpoint, beside UCX's
// tagged messages (ucx_perftest -t tag_lat / tag_bw) over the same
// transport, in the same run; over ibverbs also beside perftest's two-sided
// verbs (ib_send_lat / ib_send_bw; see MessagePeer).
//
// Method: the peer is `rdmabuf serve --endpoint` in another process, with
// the same single backend, reached by two endpoints: one for latency, one
// for bandwidth. Latency is a ping-pong of one message (the client keeps
// receives for the echoes posted, as the peer keeps its own for the pings,
// and posts one again after each ping: tools/echo_receives.h), reported
// as half the round trip (as tag_lat reports it): the median and p99 of at
// least 1000 after a warm-up as long as ucx_perftest's (10000 round trips,
// or a second at most), timed with one clock read per trip, as tag_lat
// reads its clock once per iteration, and by the same clock where the CPU
// has one that ticks at a constant rate (the time-stamp counter:
// tools/trip_clock.h).
// Bandwidth is messages sent back to back by one
// thread that keeps --window of them posted (Endpoint::post_send, 16 by
// default, as many as the peer keeps receives posted), as tag_bw keeps a
// window of sends in flight, repeated --iters times: the median.
//
// Both run in --rounds rounds (3). In a round, each size is measured by
// rdmabuf and at once after by the peer, so that the two meet the same machine:
// here the time a cache line takes between the two cores moves by up to
// five times from one minute to the next. Each figure is the median over
// the rounds, and the table shows the lowest and highest of the rounds'
// own ratios beside the ratio of the medians.
//
// rdmabuf bench --op notify: tagged writes (Endpoint::write) and their
// notifications, beside a one-sided write whose receiver watches its last
// byte: UCX's ucp_put_lat and, over ibverbs, perftest's ib_write_lat. A
// ping-pong as theirs: this side writes `size` bytes with a tag into the
// peer's buffer; the peer, told of it (Manager::next_notification), writes
// as many back with the same tag; this side waits for that notification.
// Half the round trip is the time from a write's start to its owner's
// knowing it has landed. Latency rows only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/bench_peers.h"
#include "tools/bench_report.h"
#include "tools/commands.h"
#include "tools/echo_receives.h"
#include "tools/progress.h"
#include "tools/subprocess.h"
#include "tools/trip_clock.h"

namespace rdmabuf::tool {
namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
// Round trips before the latency samples: as many as ucx_perftest's warm-up
// (its -w default), so that both are measured equally warm; or, over a slow
// transport, kMostWarmup.
constexpr int kWarmupTrips = 10000;
constexpr auto kMostWarmup = std::chrono::seconds(1);

struct SendOptions {
  bool notify = false;  // --op notify: tagged writes, not messages
  std::optional<std::string> backend;
  std::vector<uint64_t> latency_sizes = {8, 4096, 65536};
  std::vector<uint64_t> sizes;
  int iters = 10;
  int rounds = 3;
  int window = 16;  // sends posted at once, from one thread
  bool compare_peer = true;
  bool json = false;
};

constexpr const char* kHelp =
    R"(usage: rdmabuf bench --op send|notify [--backend NAME] [--sizes LIST]
                     [--iters N] [--rounds N] [--window N]
                     [--peer auto|none] [--json]

--op send: two-sided Endpoint messages over one backend, against
`rdmabuf serve --endpoint` in another process: the latency of one message
(half its ping-pong, p50 and p99) at 8 B, 4 KiB and 64 KiB, and the
bandwidth of messages of --sizes sent back to back by one thread.
--op notify: tagged writes and their notifications (a write answered by
one from the peer once it was notified), latency alone, at the same sizes.
Beside each figure, run right after it in every round and where installed:
ucx_perftest over the same transport (tag_lat and tag_bw; ucp_put_lat for
notify) and, over ibverbs, perftest (ib_send_lat, ib_send_bw; ib_write_lat).

options:
  --op send|notify  what to measure (required in this form)
  --backend NAME    the backend to measure (default: the best viable one)
  --sizes LIST      bandwidth message sizes, comma-separated
                    (default 4K,64K,1M,4M; send only)
  --iters N         bandwidth runs per size, their median, 1..100000
                    (default 10); latency takes max(1000, 100 N) samples
  --rounds N        rounds, each of every size and peer; figures are medians
                    over them, 1..100 (default 3)
  --window N        sends kept posted at once by the sending thread,
                    1..1024 (default 16; send only)
  --peer auto|none  auto: measure UCX and perftest beside rdmabuf; none:
                    rdmabuf alone (default auto)
  --json            figures and comparisons as one JSON document on stdout
                    (the form of bench --compare's results.json)
  -h, --help        this text

Sizes take K/M/G suffixes (binary).
exit status: 0; 1 when no backend is viable (or --backend is not) or a
measurement fails; 2 for a bad command line or RDMABUF_* variable.
)";

Result<SendOptions> parse_send_options(int argc, char** argv) {
  RDMABUF_ASSIGN_OR_RETURN(
      Args args,
      parse_args(argc, argv, 2, {"op", "backend", "sizes", "iters", "rounds", "window", "peer"},
                 {"json"}));
  if (!args.positional.empty()) return InvalidArgument("bench takes no positional arguments");
  SendOptions o;
  o.notify = args.get("op") == "notify";
  o.backend = args.get("backend");
  RDMABUF_ASSIGN_OR_RETURN(o.sizes, args.size_list("sizes", "4K,64K,1M,4M"));
  RDMABUF_ASSIGN_OR_RETURN(int64_t iters, args.integer("iters", 10, 1, 100000));
  o.iters = static_cast<int>(iters);
  RDMABUF_ASSIGN_OR_RETURN(int64_t rounds, args.integer("rounds", 3, 1, 100));
  o.rounds = static_cast<int>(rounds);
  RDMABUF_ASSIGN_OR_RETURN(int64_t window, args.integer("window", 16, 1, 1024));
  o.window = static_cast<int>(window);
  std::string peer = args.get("peer").value_or("auto");
  if (peer != "auto" && peer != "none") return InvalidArgument("--peer must be auto or none");
  o.compare_peer = peer == "auto";
  o.json = args.flags.count("json") > 0;
  return o;
}

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Half round trips in us of `samples` calls of `trip` (one round trip
// each, given its number, from 0) after a warm-up, timed by `clock` (one
// read a trip, as ucx_perftest's).
template <typename Trip>
Result<std::vector<double>> half_round_trips(int samples, const TripClock& clock, Trip trip) {
  std::vector<double> half_trips;
  half_trips.reserve(static_cast<size_t>(samples));
  auto start = clock.now();  // of the next trip: where the last one ended
  const auto first = start;
  const double most_warmup_us = std::chrono::duration<double, std::micro>(kMostWarmup).count();
  bool warm = false;
  for (uint32_t i = 0; static_cast<int>(half_trips.size()) < samples; ++i) {
    RDMABUF_RETURN_IF_ERROR(trip(i));
    const auto end = clock.now();
    if (warm) half_trips.push_back(clock.micros(start, end) / 2);
    if (!warm && (i + 1 >= kWarmupTrips || clock.micros(first, end) >= most_warmup_us)) {
      warm = true;
    }
    start = end;
  }
  return half_trips;
}

// Half round trips of one `size`-byte message echoed by the peer.
Result<std::vector<double>> ping_pong(Endpoint& endpoint, uint64_t size, int samples,
                                      const TripClock& clock) {
  RDMABUF_ASSIGN_OR_RETURN(LocalMemory ping, LocalMemory::allocate(size));
  RDMABUF_ASSIGN_OR_RETURN(LocalMemory pong, LocalMemory::allocate(size));
  std::memset(ping.data(), 'E', size);  // 'E': echo it
  RDMABUF_ASSIGN_OR_RETURN(EchoReceives echoes, EchoReceives::post(endpoint, pong));
  return half_round_trips(samples, clock, [&](uint32_t) -> Status {
    RDMABUF_RETURN_IF_ERROR(endpoint.send(ping, kTimeout));
    RDMABUF_ASSIGN_OR_RETURN(PendingReceive echo, echoes.next());
    RDMABUF_ASSIGN_OR_RETURN(uint64_t got, echo.wait(kTimeout));
    if (got != size || pong.data()[0] != std::byte{'E'}) {
      return Internal("the echo came back with " + std::to_string(got) + " bytes, not " +
                      std::to_string(size));
    }
    pong.data()[0] = std::byte{0};  // so that the next echo's byte is its own
    return Status::Ok();
  });
}

// Half round trips of tagged writes of `size` bytes into `theirs`, each
// answered by the peer's tagged write back once it was notified (the
// peer's `rdmabuf serve --endpoint`, on an endpoint whose first message was
// 'N' and this side's handle).
Result<std::vector<double>> notify_ping_pong(Manager& manager, Endpoint& endpoint,
                                             const RemoteBuffer& theirs, uint64_t size, int samples,
                                             const TripClock& clock) {
  RDMABUF_ASSIGN_OR_RETURN(LocalMemory data, LocalMemory::allocate(size));
  std::memset(data.data(), 'W', size);
  RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer into, theirs.slice(0, size));
  return half_round_trips(samples, clock, [&](uint32_t tag) -> Status {
    RDMABUF_RETURN_IF_ERROR(endpoint.write(into, data, tag, kTimeout));
    RDMABUF_ASSIGN_OR_RETURN(Notification back, manager.next_notification(kTimeout));
    if (back.tag != tag || back.length != size) {
      return Internal("the answer to write " + std::to_string(tag) + " came with tag " +
                      std::to_string(back.tag) + ", " + std::to_string(back.length) + " bytes");
    }
    return Status::Ok();
  });
}

// GB/s of `count` messages of `size` bytes sent by one thread that keeps
// `window` of them posted.
Result<double> stream(Endpoint& endpoint, uint64_t size, int count, int window) {
  RDMABUF_ASSIGN_OR_RETURN(LocalMemory message, LocalMemory::allocate(size));
  std::memset(message.data(), 'S', size);  // 'S': the peer drops it
  std::deque<PendingSend> in_flight;
  auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    if (static_cast<int>(in_flight.size()) == window) {
      RDMABUF_RETURN_IF_ERROR(in_flight.front().wait(kTimeout));
      in_flight.pop_front();
    }
    RDMABUF_ASSIGN_OR_RETURN(PendingSend sending, endpoint.post_send(message));
    in_flight.push_back(std::move(sending));
  }
  for (PendingSend& sending : in_flight)
    RDMABUF_RETURN_IF_ERROR(sending.wait(kTimeout));
  return static_cast<double>(size) * count / (micros_since(start) * 1e3);
}

// A system measured beside rdmabuf's messages over `backend`, on the same
// transport: UCX's tagged messages over TCP, shared memory or RDMA (the
// issue's peer), and over ibverbs also perftest's raw two-sided verbs, the
// floor a library over verbs can only approach.
struct MessagePeer {
  std::string name;     // in the table: "UCX tcp", "UCX rc_verbs", "perftest"
  std::string program;  // what runs: "ucx_perftest", "perftest"
  std::string latency_test, bandwidth_test;
  int latency_iterations = kWarmupTrips;
  // Bandwidth: messages per run, at most as many as rdmabuf sends (`count`).
  std::function<int(uint64_t size, int count)> bandwidth_iterations = [](uint64_t, int count) {
    return count;
  };
  std::string why_not;  // why it does not run here; empty when it does
  std::string note;     // printed under the table when it runs
  std::function<Result<UcxFigure>(const std::string& test, uint64_t size, int iterations)> run;
  // Before the rounds, when set: a short run that fails fast where the
  // peer cannot run at all here (so that no row waits for its time limit).
  std::function<Status()> probe;
};

// Few messages over RDMA, as beside the one-sided ops: Soft-RoCE moves tens
// of MB/s.
constexpr int kRdmaLatencyIterations = 1000;

// perftest's two-sided verbs (ib_send_lat / ib_send_bw) on `device`.
MessagePeer perftest_peer(const std::optional<IbDevice>& device) {
  MessagePeer peer;
  peer.name = peer.program = "perftest";
  peer.latency_test = "ib_send_lat";
  peer.bandwidth_test = "ib_send_bw";
  peer.latency_iterations = kRdmaLatencyIterations;
  peer.bandwidth_iterations = [](uint64_t size, int) {
    return perftest_bandwidth_iterations(size);
  };
  if (!on_path("ib_send_lat") || !on_path("ib_send_bw")) {
    peer.why_not = "not found: install perftest to see it beside rdmabuf";
  }
  if (!device) peer.why_not = "has no RDMA device in use";
  peer.note = "perftest: raw verbs SEND/RECV, no library (ib_send_bw at its default queue depth)";
  if (device) {
    peer.run = [device = *device](const std::string& test, uint64_t size,
                                  int iterations) -> Result<UcxFigure> {
      RDMABUF_ASSIGN_OR_RETURN(double figure, run_perftest(test, device, size, iterations));
      UcxFigure f;
      (test.find("_lat") != std::string::npos ? f.p50_us : f.gbps) = figure;
      return f;
    };
  }
  return peer;
}

// UCX's tagged messages between two processes of this host, with `env`
// (UCX_TLS and the rest) in both.
MessagePeer ucx_peer(std::string name, const UcxEnv& env) {
  MessagePeer peer;
  peer.name = std::move(name);
  peer.program = "ucx_perftest";
  peer.latency_test = "tag_lat";
  peer.bandwidth_test = "tag_bw";
  if (!on_path("ucx_perftest"))
    peer.why_not = "not found: install ucx-utils to see UCX beside rdmabuf";
  peer.run = [env](const std::string& test, uint64_t size, int iterations) {
    return run_ucx_perftest(test, size, iterations, env);
  };
  return peer;
}

// UCX over rc_verbs on the device, port and GID the backend uses. UCX sets
// its reliable connections up through a datagram transport (ud_verbs),
// which on Soft-RoCE answers only on the IPv6 GIDs: over an IPv4 one (GID
// index 1 there, the one rdmabuf picks) the set-up times out after about
// 30 s. So a short run first says whether it works at all.
MessagePeer ucx_rdma_peer(const std::optional<IbDevice>& device) {
  UcxEnv env = {{"UCX_TLS", "rc_verbs,ud_verbs"}};
  if (device) {
    env.emplace_back("UCX_NET_DEVICES", device->name + ":" + std::to_string(device->port));
    env.emplace_back("UCX_IB_GID_INDEX", std::to_string(device->gid_index));
  }
  MessagePeer peer = ucx_peer("UCX rc_verbs", env);
  if (!device) peer.why_not = "has no RDMA device in use";
  peer.latency_iterations = kRdmaLatencyIterations;
  peer.bandwidth_iterations = [](uint64_t size, int) {
    return perftest_bandwidth_iterations(size);
  };
  peer.note =
      "UCX rc_verbs: its tagged messages over reliable connections (UCX_TLS=rc_verbs,ud_verbs)";
  peer.probe = [env, device] {
    Status st = run_ucx_perftest("tag_lat", 8, 100, env, std::chrono::seconds(60)).status();
    if (st.ok() || !device) return st;
    return Unavailable(st.message() + " over " + device->name + " port " +
                       std::to_string(device->port) + " GID[" + std::to_string(device->gid_index) +
                       "] (on Soft-RoCE UCX connects only over an IPv6 GID: "
                       "RDMABUF_IB_GID_INDEX=0 runs both there)");
  };
  return peer;
}

// The peers for --op notify: the systems of message_peers(), each timing a
// one-sided write that its receiver watches the last byte of.
std::vector<MessagePeer> notify_peers(std::vector<MessagePeer> peers) {
  for (MessagePeer& p : peers) {
    if (p.program == "perftest") {
      p.latency_test = "ib_write_lat";
      p.note = "perftest: raw verbs RDMA WRITE, the receiver polls the last byte, no library";
      if (p.why_not.empty() && !on_path("ib_write_lat")) {
        p.why_not = "not found: install perftest to see it beside rdmabuf";
      }
    } else {
      p.latency_test = "ucp_put_lat";
      p.note = p.name + ": ucp_put_lat, a put whose receiver polls its last byte";
    }
    p.bandwidth_test.clear();
  }
  return peers;
}

std::vector<MessagePeer> message_peers(const std::string& backend,
                                       const std::vector<BackendInfo>& backends) {
  if (backend == "ibverbs") {
    const std::optional<IbDevice> device = ibverbs_device(backends);
    return {ucx_rdma_peer(device), perftest_peer(device)};
  }
  if (backend == "tcp") return {ucx_peer("UCX tcp", {{"UCX_TLS", "tcp,self"}})};
  if (backend == "memory") return {ucx_peer("UCX shm", {{"UCX_TLS", "posix,sysv,self"}})};
  MessagePeer none;
  none.name = none.program = "UCX";
  none.why_not = "has no transport like " + backend;
  return {none};
}

}  // namespace

int cmd_bench_send(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kHelp);
  auto parsed = parse_send_options(argc, argv);
  if (!parsed.ok()) return fail(parsed.status());
  const SendOptions o = *parsed;
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  if (o.backend) config->backends = {*o.backend};
  auto manager = Manager::create(*config);
  if (!manager.ok()) return fail(manager.status());
  std::string backend;
  for (const BackendInfo& b : (*manager)->backends()) {
    if (o.backend && b.name == *o.backend && !b.viable) {
      return fail(FailedPrecondition("backend " + b.name + " is not viable here: " + b.reason));
    }
    if (b.viable && backend.empty()) backend = b.name;
  }
  if (backend.empty()) return fail(FailedPrecondition("no viable backend"));
  std::vector<MessagePeer> peer_systems;
  if (o.compare_peer) peer_systems = message_peers(backend, (*manager)->backends());
  if (o.notify) peer_systems = notify_peers(std::move(peer_systems));
  // --op notify times latency alone.
  const std::vector<uint64_t> bandwidth_sizes = o.notify ? std::vector<uint64_t>{} : o.sizes;
  for (MessagePeer& p : peer_systems) {
    if (!p.why_not.empty() || !p.probe) continue;
    std::fprintf(stderr, "rdmabuf bench: a first short run of %s ...\n", p.name.c_str());
    Status st = p.probe();
    if (!st.ok()) p.why_not = "failed: " + st.message();
  }
  std::vector<const MessagePeer*> running;  // the peers measured, in the table's order
  for (const MessagePeer& p : peer_systems) {
    if (p.why_not.empty()) running.push_back(&p);
  }

  uint64_t max_size = 4096;
  for (uint64_t s : bandwidth_sizes)
    max_size = std::max(max_size, s);
  for (uint64_t s : o.latency_sizes)
    max_size = std::max(max_size, s);
  Child::Options options;
  options.env.emplace_back("RDMABUF_BACKENDS", backend);
  options.quiet_stderr = true;
  auto peer = Child::spawn({"/proc/self/exe", "serve", "--size", std::to_string(max_size),
                            "--pattern", "zero", "--endpoint"},
                           options);
  if (!peer.ok()) return fail(peer.status());
  std::string address;
  std::optional<RemoteBuffer> peer_buffer;  // what it serves: the target of tagged writes
  for (int line = 0; line < 2; ++line) {
    auto text = peer->read_line(std::chrono::seconds(30));
    if (!text.ok()) return fail(text.status().with_context("the peer process did not start"));
    if (text->rfind("endpoint ", 0) == 0) {
      address = text->substr(9);
    } else if (auto handle = RemoteBuffer::from_text(*text); handle.ok()) {
      peer_buffer = *handle;
    }
  }
  if (!peer_buffer) return fail(Internal("the peer process printed no handle"));
  // Two endpoints: the peer echoes every message on an endpoint whose first
  // message starts with 'E' (the pings), and drops, unread, every message
  // on any other (the streams). On one endpoint, a ping sent right after a
  // bandwidth run would land in memory a streamed message still occupies.
  auto for_latency = (*manager)->connect(address, kTimeout);
  if (!for_latency.ok()) return fail(for_latency.status().with_context("connecting to the peer"));
  auto for_bandwidth = (*manager)->connect(address, kTimeout);
  if (!for_bandwidth.ok())
    return fail(for_bandwidth.status().with_context("connecting to the peer"));
  Endpoint& endpoint = **for_latency;
  Endpoint& sink = **for_bandwidth;
  // --op notify: the peer answers tagged writes on an endpoint whose first
  // message is 'N' and the handle of this side's buffer.
  std::unique_ptr<Endpoint> for_notify;
  if (o.notify) {
    auto mine = LocalMemory::allocate(max_size);
    if (!mine.ok()) return fail(mine.status());
    auto handle = (*manager)->register_buffer(*mine);
    if (!handle.ok()) return fail(handle.status());
    auto connected = (*manager)->connect(address, kTimeout);
    if (!connected.ok()) return fail(connected.status().with_context("connecting to the peer"));
    std::vector<uint8_t> hello = handle->to_bytes();
    hello.insert(hello.begin(), 'N');
    auto bytes = LocalMemory::allocate(hello.size());
    if (!bytes.ok()) return fail(bytes.status());
    std::memcpy(bytes->data(), hello.data(), hello.size());
    Status sent = (*connected)->send(*bytes, kTimeout);
    if (!sent.ok()) return fail(sent.with_context("sending the peer this side's handle"));
    for_notify = std::move(connected).value();
  }

  const std::string system = "rdmabuf " + backend;
  const std::string op_name = o.notify ? "notify" : "send";
  const TripClock trip_clock;
  Progress progress(o.rounds * static_cast<int>(o.latency_sizes.size() + bandwidth_sizes.size()) *
                    (1 + static_cast<int>(running.size())));
  // A peer's figure at `size`: none when it failed (said on stderr; the
  // round goes on without it).
  auto run_peer = [&](const MessagePeer& p, bool latency, uint64_t size,
                      int iterations) -> std::optional<UcxFigure> {
    const std::string& test = latency ? p.latency_test : p.bandwidth_test;
    progress.step(p.program + " " + test + " " + format_bytes(size));
    auto u = p.run(test, size, iterations);
    if (!u.ok()) {
      std::fprintf(stderr, "rdmabuf bench: %s %s: %s\n", p.program.c_str(), test.c_str(),
                   u.status().to_string().c_str());
      return std::nullopt;
    }
    return *u;
  };
  // One round: every size by rdmabuf, each followed at once by the peer's.
  auto run_round = [&](std::vector<Figure>& out) -> Status {
    for (uint64_t size : o.latency_sizes) {
      progress.step("latency: " + format_bytes(size));
      const int samples = std::max(1000, o.iters * 100);
      RDMABUF_ASSIGN_OR_RETURN(std::vector<double> trips,
                               o.notify ? notify_ping_pong(**manager, *for_notify, *peer_buffer,
                                                           size, samples, trip_clock)
                                        : ping_pong(endpoint, size, samples, trip_clock));
      Figure f = Figure::of(system, "latency", op_name, size);
      f.note = "frames: " + endpoint.channel();
      f.p50_us = percentile(trips, 50);
      f.p99_us = percentile(trips, 99);
      out.push_back(f);
      for (const MessagePeer* p : running) {
        auto u = run_peer(*p, true, size, p->latency_iterations);
        if (!u) continue;
        Figure g = Figure::of(p->name, "latency", op_name, size);
        g.p50_us = u->p50_us;
        g.note = p->latency_test + ": half a round trip";
        out.push_back(g);
      }
    }
    for (uint64_t size : bandwidth_sizes) {
      progress.step("bandwidth: " + format_bytes(size));
      const int count = static_cast<int>(std::clamp<uint64_t>((256u << 20) / size, 64, 20000));
      std::vector<double> gbps;
      for (int r = 0; r < o.iters + 1; ++r) {
        RDMABUF_ASSIGN_OR_RETURN(double g, stream(sink, size, count, o.window));
        if (r > 0) gbps.push_back(g);  // the first is the warm-up
      }
      Figure f = Figure::of(system, "bandwidth", "send", size);
      f.note = "frames: " + sink.channel();
      f.gbps = percentile(gbps, 50);
      out.push_back(f);
      for (const MessagePeer* p : running) {
        auto u = run_peer(*p, false, size, p->bandwidth_iterations(size, count));
        if (!u) continue;
        Figure g = Figure::of(p->name, "bandwidth", "send", size);
        g.gbps = u->gbps;
        out.push_back(g);
      }
    }
    return Status::Ok();
  };

  std::map<std::string, std::vector<std::string>> peers = {{backend, {}}};
  for (const MessagePeer* p : running)
    peers[backend].push_back(p->name);
  std::vector<Figure> runs;
  // The lowest and highest of the rounds' own ratios, by (peer, kind, size).
  std::map<std::tuple<std::string, std::string, uint64_t>, std::pair<double, double>>
      round_speedups;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<Figure> figures;
    Status st = run_round(figures);
    if (!st.ok()) {
      progress.finish();
      return fail(st);
    }
    for (const Comparison& c : compare(figures, peers)) {
      auto it = round_speedups.try_emplace({c.peer, c.kind, c.size}, c.speedup, c.speedup).first;
      it->second.first = std::min(it->second.first, c.speedup);
      it->second.second = std::max(it->second.second, c.speedup);
    }
    runs.insert(runs.end(), figures.begin(), figures.end());
  }
  const std::vector<Figure> figures = median_of_runs(runs);
  progress.finish();
  endpoint.close();
  sink.close();
  if (for_notify) for_notify->close();

  const auto comparisons = compare(figures, peers);
  if (o.json) {
    RunInfo info;
    info.command = "rdmabuf bench --op " + op_name;
    info.rounds = o.rounds;
    info.rdmabuf_reps = o.iters;
    std::fputs(render_json(info, figures, comparisons, {}).c_str(), stdout);
    return kExitOk;
  }
  std::printf("rdmabuf bench --op %s: %s over %s (frames: %s), peer %s process %d\n\n",
              op_name.c_str(),
              o.notify ? "tagged writes and their notifications" : "Endpoint messages",
              backend.c_str(), endpoint.channel().c_str(), "local", peer->pid());
  // Each peer's group of columns: its figure, x and x by round.
  std::printf("%-9s %-9s %14s %9s", "measure", "size", "rdmabuf", "p99");
  for (const MessagePeer* p : running)
    std::printf("  %14s %6s  %-11s", p->name.c_str(), "x", "x by round");
  std::printf("\n");
  for (const Figure& f : figures) {
    if (f.system != system) continue;
    const bool latency = f.kind == "latency";
    // Three decimals for GB/s (six under 0.01: Soft-RoCE moves small
    // messages at kB/s) and for latencies under 10 us (shared memory
    // answers in tenths of a microsecond), else one.
    auto decimals = [latency](double v) { return !latency ? (v < 0.01 ? 6 : 3) : v < 10 ? 3 : 1; };
    const char* unit = latency ? "us" : "GB/s";
    std::printf("%-9s %-9s %9.*f %-4s", latency ? "latency" : "bandwidth",
                format_bytes(f.size).c_str(), decimals(headline(f)), headline(f), unit);
    if (latency) {
      std::printf(" %9.*f", decimals(f.p99_us), f.p99_us);
    } else {
      std::printf(" %9s", "-");
    }
    for (const MessagePeer* p : running) {
      auto c = std::find_if(comparisons.begin(), comparisons.end(), [&](const Comparison& each) {
        return each.peer == p->name && each.kind == f.kind && each.size == f.size;
      });
      if (c == comparisons.end()) {
        std::printf("  %14s %6s  %-11s", "-", "-", "");  // it failed in every round
        continue;
      }
      std::printf("  %9.*f %-4s %6.2f", decimals(c->peer_figure), c->peer_figure, unit, c->speedup);
      char spread_text[32] = "";
      auto spread = round_speedups.find({c->peer, c->kind, c->size});
      if (spread != round_speedups.end()) {
        std::snprintf(spread_text, sizeof spread_text, "%.2f-%.2f", spread->second.first,
                      spread->second.second);
      }
      std::printf("  %-11s", spread_text);
    }
    std::printf("\n");
  }
  std::string latency_tests = "tag_lat";  // what the latency rows match
  std::string names;                      // "UCX rc_verbs and perftest"
  for (const MessagePeer* p : running) {
    if (p == running.front()) {
      latency_tests = p->latency_test;
      names = p->name;
    } else {
      latency_tests += " and " + p->latency_test;
      names += " and " + p->name;
    }
  }
  if (o.notify) {
    std::printf(
        "\nlatency: a tagged write answered by one from the peer once it was notified, half\n"
        "the round trip (as %s %s it for a write answered once its last byte was seen), "
        "p50 and p99;\n",
        latency_tests.c_str(), running.size() > 1 ? "report" : "reports");
  } else {
    std::printf(
        "\nlatency: one message, half its ping-pong round trip (as %s %s), p50 and p99;\n"
        "bandwidth: messages sent back to back, %d posted at once by one thread, median of %d "
        "runs;\n",
        latency_tests.c_str(), running.size() > 1 ? "report" : "reports", o.window, o.iters);
  }
  if (!running.empty()) {
    std::printf(
        "each figure: the median of %d rounds, in each of which %s ran right after rdmabuf;\n"
        "x: how many times faster rdmabuf is (above 1: faster), from those medians; x by "
        "round:\n"
        "the lowest and highest of the rounds' own ratios. GB/s = 1e9 bytes/s.\n",
        o.rounds, names.c_str());
  } else {
    std::printf("each figure: the median of %d rounds. GB/s = 1e9 bytes/s.\n", o.rounds);
  }
  for (const MessagePeer& p : peer_systems) {
    if (!p.why_not.empty()) {
      std::printf("(%s %s)\n", p.name.c_str(), p.why_not.c_str());
    } else if (!p.note.empty()) {
      std::printf("%s\n", p.note.c_str());
    }
  }
  if (backend == "ibverbs" && o.notify) {
    std::printf(
        "rdmabuf's notices travel as SENDs behind the WRITEs on the same queue pair\n"
        "(docs/wire-format.md, \"Notices\")\n");
  } else if (backend == "ibverbs") {
    std::printf(
        "rdmabuf's frames travel as SENDs (messages up to 64 KiB in them, copied through\n"
        "receives kept posted), larger messages by RDMA WRITE (docs/endpoints.md)\n");
  }
  return kExitOk;
}

}  // namespace rdmabuf::tool
