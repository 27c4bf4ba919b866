// rdmabuf bench: bandwidth, small-op latency and batched op rate against a
// peer process, beside iperf3 on the same loopback (BENCHMARKS.md).
//
// Method: every figure is a median over repetitions after warm-up ones;
// latency is reported as p50/p99 of single round trips; setup costs (first
// transfer to a peer, registration) are reported apart. Reads are checked
// byte for byte against the peer's pattern, so a fast wrong answer fails.
#include <sys/socket.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/bench_peers.h"
#include "tools/bench_report.h"
#include "tools/commands.h"
#include "tools/host_memory.h"
#include "tools/pattern.h"
#include "tools/progress.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {
namespace {

constexpr auto kOpTimeout = std::chrono::seconds(60);
constexpr int kWarmupReps = 2;
// A stride that puts every op of a batch on the same range, [0, size).
constexpr uint64_t kOneRange = ~uint64_t{0};

// How the ops of a bandwidth row lie in memory: "spread" over a --window of
// distinct ranges (data that is not in any cache, as a user's usually is
// not), or "one-range": every op reads its bytes from the same range (the
// remote one for reads, the local one for writes), the shape iperf3,
// qperf, ucx_perftest and perftest measure (one buffer, reused). Their
// destinations stay distinct: ops in flight together must not write the
// same bytes.
const std::vector<std::string> kLayouts = {"spread", "one-range"};

// ucx_perftest iterations beside the latency rows (its median of as many
// ops, after min(10000, a tenth) warm-ups: milliseconds over shared
// memory) and beside the rate rows (its message rate over as many).
constexpr int kUcxLatencyIterations = 10000;
constexpr int kUcxRateIterations = 100000;

constexpr const char* kHelp = R"(usage: rdmabuf bench [--backend NAME] [--sizes LIST] [--batch N]
                     [--streams N] [--iters N] [--window BYTES]
                     [--layouts LIST] [--connect HANDLE] [--peer auto|none]
                     [--host-memory shared|private] [--json] [--quiet]
       rdmabuf bench --op send|notify ...  (rdmabuf bench --op send --help)
       rdmabuf bench --compare ...         (rdmabuf bench --compare --help)
       rdmabuf bench --gpu ...             (rdmabuf bench --gpu --help)
       rdmabuf bench --pattern ...         (rdmabuf bench --pattern all --help)

Measures one-sided reads and writes over one backend against a peer
process it starts here (`rdmabuf serve`), or against the buffer behind
--connect: setup costs, the latency of single 8 B and 4 KiB ops (p50, p99),
the rate of --batch 64 B ops submitted at once (and of --batch 8 B
fetch-and-adds on one word, over tcp and memory), one scattered op of
--batch 4 KiB ranges beside the same bytes as separate ops and as one
contiguous op, and bandwidth at each of --sizes; medians after warm-up.
Reads from its own peer are checked byte for byte. With its own peer it
also measures, in the same run and where installed: iperf3 beside tcp,
memcpy and ucx_perftest beside memory, perftest beside ibverbs; and
prints the ratio to each (above 1: rdmabuf is faster).

options:
  --backend NAME    the backend to measure (default: the best viable one)
  --sizes LIST      bandwidth sizes, comma-separated
                    (default 4K,64K,1M,4M,16M,64M)
  --batch N         ops submitted at once in the rate rows, 1..65536
                    (default 1024)
  --streams N       TCP connections per peer, 1..64 (default:
                    RDMABUF_TCP_STREAMS, else 4); iperf3 runs as many
  --iters N         repetitions per bandwidth row, 1..100000 (default 20);
                    latency rows take max(1000, 100 N) samples
  --window BYTES    bytes of ops in one bandwidth repetition, --window / size
                    ops, 1 to 1024 of them (default 64M)
  --layouts LIST    where a repetition's ops lie: spread, on distinct ranges;
                    one-range, all on one, as the peer tools measure; or
                    both, comma-separated (default spread)
  --connect HANDLE  measure against this buffer (from `rdmabuf serve`,
                    maybe on another host): its bytes are overwritten, reads
                    are not checked, no peer tool runs
  --peer auto|none  auto: measure the peer tools beside rdmabuf; none: skip
                    them (default auto)
  --host-memory shared|private
                    where this process's buffers and its peer's come from:
                    shared, memory a peer on this host maps and copies
                    directly; private, anonymous memory it copies with a
                    system call per range (default shared)
  --json            one JSON object per measurement per line on stdout,
                    instead of the tables
  --quiet           no progress on stderr
  --op send|notify  measure endpoint messages or tagged writes instead
  --compare         measure every backend beside its peers instead
  --gpu             measure GPU memory beside torch and host memory instead
  --pattern P       measure p2p, fan-in, fan-out, all-to-all or ring across
                    ranks and hosts beside torch.distributed's gloo instead
  -h, --help        this text

Sizes take K/M/G suffixes (binary).
exit status: 0; 1 when no backend is viable (or --backend is not) or a
measurement fails; 2 for a bad command line or RDMABUF_* variable.
)";

struct Options {
  std::optional<std::string> backend;
  std::vector<uint64_t> sizes;
  int batch = 1024;
  std::optional<int> streams;
  int iters = 20;
  uint64_t window = 64 << 20;
  std::optional<std::string> connect;
  bool compare_peer = true;
  HostMemory host_memory = HostMemory::kShared;
  std::vector<std::string> layouts = {"spread"};
  bool json = false;
  bool quiet = false;  // no progress on stderr
};

// One row: an rdmabuf measurement and, when one ran, its peer's figure for
// the same shape in the same run.
struct Sample {
  std::string system = "rdmabuf";
  std::string op;
  uint64_t size = 0;
  uint64_t batch = 1;
  double gbps = 0;
  double p50_us = 0;
  double p99_us = 0;
  double ops_per_s = 0;
  size_t reps = 0;
  std::string kind;    // "setup", "latency", "rate", "bandwidth", "single"
  std::string layout;  // for bandwidth rows: "spread" or "one-range"
  std::string peer;    // e.g. "iperf3 -P 2", "memcpy", "ucx posix ucp_get"
  double peer_gbps = 0;
  // For latency rows: the peer's median, a round trip or the half of one
  // as the peer reports it (the footnotes say which).
  double peer_p50_us = 0;
  double peer_ops_per_s = 0;  // for rate rows: the peer's message rate
};

// A one-off setup cost (first connection, registration).
Sample setup_sample(const std::string& op, uint64_t size, double us) {
  Sample s;
  s.op = op;
  s.size = size;
  s.p50_us = s.p99_us = us;
  s.reps = 1;
  s.kind = "setup";
  return s;
}

double median(const std::vector<double>& v) {
  return percentile(v, 50);
}

Result<Options> parse_options(int argc, char** argv) {
  RDMABUF_ASSIGN_OR_RETURN(
      Args args, parse_args(argc, argv, 2,
                            {"backend", "sizes", "batch", "streams", "iters", "window", "connect",
                             "peer", "layouts", "host-memory"},
                            {"json", "quiet"}));
  if (!args.positional.empty()) return InvalidArgument("bench takes no positional arguments");
  Options o;
  o.backend = args.get("backend");
  RDMABUF_ASSIGN_OR_RETURN(o.sizes, args.size_list("sizes", "4K,64K,1M,4M,16M,64M"));
  RDMABUF_ASSIGN_OR_RETURN(int64_t batch, args.integer("batch", 1024, 1, 65536));
  o.batch = static_cast<int>(batch);
  if (args.has("streams")) {
    RDMABUF_ASSIGN_OR_RETURN(int64_t streams, args.integer("streams", 2, 1, 64));
    o.streams = static_cast<int>(streams);
  }
  RDMABUF_ASSIGN_OR_RETURN(int64_t iters, args.integer("iters", 20, 1, 100000));
  o.iters = static_cast<int>(iters);
  RDMABUF_ASSIGN_OR_RETURN(o.window, args.size("window", 64 << 20));
  if (o.window == 0) return InvalidArgument("--window must be > 0");
  o.connect = args.get("connect");
  if (args.has("layouts")) o.layouts = split_list(*args.get("layouts"));
  if (o.layouts.empty()) return InvalidArgument("--layouts is empty");
  for (const std::string& layout : o.layouts) {
    if (std::find(kLayouts.begin(), kLayouts.end(), layout) == kLayouts.end()) {
      return InvalidArgument("--layouts: '" + layout + "' is not spread or one-range");
    }
  }
  std::string peer = args.get("peer").value_or("auto");
  if (peer != "auto" && peer != "none") return InvalidArgument("--peer must be auto or none");
  o.compare_peer = peer == "auto";
  RDMABUF_ASSIGN_OR_RETURN(o.host_memory,
                           parse_host_memory(args.get("host-memory").value_or("shared")));
  o.json = args.flags.count("json") > 0;
  o.quiet = args.flags.count("quiet") > 0;
  return o;
}

// Runs against one remote buffer. Local memory is reused across
// measurements; ops of one batch use disjoint ranges on both sides.
class Bench {
 public:
  Bench(Manager& manager, RemoteBuffer remote, LocalMemory local, bool verify)
      : manager_(manager), remote_(std::move(remote)), local_(std::move(local)), verify_(verify) {
    if (verify_) {
      reference_.resize(remote_.size());
      fill_seq(reference_, 0);
    }
  }

  // Submits `batch` ops of `size` and waits; returns microseconds. Op j
  // covers [j * stride, + size) on both sides; stride == size lays the ops
  // end to end (a backend may then merge them), a larger stride keeps them
  // apart; kOneRange takes every op's source from [0, size) and spreads the
  // destinations as size would.
  Result<double> run_batch(OpKind kind, uint64_t size, uint64_t batch, uint64_t stride = 0) {
    if (stride == 0) stride = size;
    std::vector<Op> ops;
    ops.reserve(batch);
    for (uint64_t j = 0; j < batch; ++j) {
      const bool one_range = stride == kOneRange;
      const uint64_t offset = (j * (one_range ? size : stride)) % span_limit(size);
      const bool read = kind == OpKind::kReadIntoLocal;
      RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer r, remote_.slice(one_range && read ? 0 : offset, size));
      // A slice shares the buffer's keepalive, as a user's should: backends
      // that register memory with a NIC cache the registration by it.
      RDMABUF_ASSIGN_OR_RETURN(LocalMemory l, local_.slice(one_range && !read ? 0 : offset, size));
      ops.push_back(Op{kind, std::move(r), std::move(l)});
    }
    auto start = Clock::now();
    Transfer t = manager_.submit(std::move(ops), kOpTimeout);
    Status st = t.wait();
    auto end = Clock::now();
    if (!st.ok()) return st;
    return std::chrono::duration<double, std::micro>(end - start).count();
  }

  // Where op j's range may start, on both sides: [0, span_limit(size)).
  uint64_t span_limit(uint64_t size) const {
    return std::min(remote_.size(), local_.size()) - size + 1;
  }

  // Checks that local [offset, +bytes) holds the peer's pattern of
  // [remote_offset, +bytes).
  Status verify(uint64_t offset, uint64_t bytes, uint64_t remote_offset) const {
    if (!verify_) return Status::Ok();
    if (remote_offset + bytes > reference_.size()) return Status::Ok();
    if (std::memcmp(local_.data() + offset, reference_.data() + remote_offset, bytes) != 0) {
      return Internal("bench read back bytes that differ from the peer's pattern");
    }
    return Status::Ok();
  }

  // `row_kind` labels the row: "bandwidth", "single" or "rate".
  Result<Sample> bandwidth(OpKind kind, uint64_t size, uint64_t window, int reps,
                           const char* row_kind = "bandwidth", uint64_t stride = 0) {
    uint64_t batch = std::clamp<uint64_t>(window / size, 1, 1024);
    batch = std::min<uint64_t>(batch, std::max<uint64_t>(1, local_.size() / size));
    if (stride == 0) stride = size;
    const uint64_t span = stride == kOneRange ? size : (batch - 1) * stride + size;
    if (kind == OpKind::kWriteFromLocal && verify_) fill_seq(local_.span().first(span), 0);
    std::vector<double> gbps, us;
    for (int r = 0; r < kWarmupReps + reps; ++r) {
      RDMABUF_ASSIGN_OR_RETURN(double t, run_batch(kind, size, batch, stride));
      if (r < kWarmupReps) continue;
      us.push_back(t);
      gbps.push_back(static_cast<double>(size * batch) / (t * 1e3));
    }
    if (kind == OpKind::kWriteFromLocal && stride == kOneRange && verify_) {
      // One source over many destinations broke the peer's pattern there:
      // put it back (untimed), so that later reads can be checked.
      fill_seq(local_.span().first(batch * size), 0);
      RDMABUF_RETURN_IF_ERROR(run_batch(kind, size, batch, size).status());
    }
    if (kind == OpKind::kReadIntoLocal) {
      for (uint64_t j = 0; j < batch; ++j) {
        const uint64_t offset = (j * (stride == kOneRange ? size : stride)) % span_limit(size);
        RDMABUF_RETURN_IF_ERROR(verify(offset, size, stride == kOneRange ? 0 : offset));
      }
    }
    Sample s;
    s.op = op_kind_name(kind);
    s.size = size;
    s.batch = batch;
    s.gbps = median(gbps);
    s.p50_us = median(us);
    s.p99_us = percentile(us, 99);
    s.ops_per_s = static_cast<double>(batch) * 1e6 / s.p50_us;
    s.reps = static_cast<size_t>(reps);
    s.kind = row_kind;
    if (s.kind == "bandwidth") s.layout = stride == kOneRange ? "one-range" : "spread";
    return s;
  }

  Result<Sample> latency(OpKind kind, uint64_t size, int samples) {
    std::vector<double> us;
    for (int r = 0; r < kWarmupReps * 50 + samples; ++r) {
      RDMABUF_ASSIGN_OR_RETURN(double t, run_batch(kind, size, 1));
      if (r >= kWarmupReps * 50) us.push_back(t);
    }
    if (kind == OpKind::kReadIntoLocal) RDMABUF_RETURN_IF_ERROR(verify(0, size, 0));
    return timed_sample(kind, size, 1, us, "latency");
  }

  Result<Sample> rate(OpKind kind, uint64_t size, uint64_t batch, int reps) {
    // Apart, not end to end: this row is about the cost of each op.
    return bandwidth(kind, size, size * batch, reps, "rate", 2 * size);
  }

  // One scattered op of `count` ranges of `size`, every other `size` on
  // both sides, beside the same bytes moved as `count` ops in one batch, as
  // one contiguous op, and as `count` ops one at a time, rep by rep
  // (interleaved, so that the figures share the machine's moods, in a
  // shuffled order): one row per comparison, the scattered op's figures
  // in each.
  Result<std::vector<Sample>> scattered(OpKind kind, uint64_t size, uint64_t count, int reps) {
    count = std::min(count, std::min(remote_.size(), local_.size()) / (2 * size));
    if (count == 0) return InvalidArgument("bench: no room for scattered ranges");
    std::vector<OpRange> ranges;
    std::vector<Op> apart;
    for (uint64_t k = 0; k < count; ++k) {
      ranges.push_back(OpRange{2 * k * size, 2 * k * size, size});
      RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer r, remote_.slice(2 * k * size, size));
      RDMABUF_ASSIGN_OR_RETURN(LocalMemory l, local_.slice(2 * k * size, size));
      apart.push_back(Op{kind, std::move(r), std::move(l)});
    }
    Op one = Op{kind, remote_, local_};
    one.ranges = std::make_shared<const OpRanges>(std::move(ranges));
    RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer r, remote_.slice(0, count * size));
    RDMABUF_ASSIGN_OR_RETURN(LocalMemory l, local_.slice(0, count * size));
    const Op contiguous{kind, std::move(r), std::move(l)};
    // Writes put the peer's own pattern back, so that later reads check.
    if (kind == OpKind::kWriteFromLocal && verify_)
      fill_seq(local_.span().first(2 * count * size), 0);
    auto timed = [&](std::vector<Op> ops) -> Result<double> {
      auto start = Clock::now();
      Transfer t = manager_.submit(std::move(ops), kOpTimeout);
      RDMABUF_RETURN_IF_ERROR(t.wait());
      return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    };
    auto scattered_op = [&]() -> Result<double> {
      RDMABUF_ASSIGN_OR_RETURN(double t, timed({one}));
      if (kind == OpKind::kReadIntoLocal) {
        for (uint64_t k = 0; k < count; ++k)
          RDMABUF_RETURN_IF_ERROR(verify(2 * k * size, size, 2 * k * size));
        std::memset(local_.data(), 0, 2 * count * size);  // each rep must bring them again
      }
      return t;
    };
    auto one_by_one = [&]() -> Result<double> {
      double total = 0;
      for (const Op& op : apart) {
        RDMABUF_ASSIGN_OR_RETURN(double t, timed({op}));
        total += t;
      }
      return total;
    };
    // The shapes run in a shuffled order each rep: whichever follows the
    // one-by-one shape (a thousand round trips that leave most streams, and
    // on a small machine the CPUs, idle) pays the machine's wake-up from
    // idle, about 0.5 ms for 4 MiB here, for a raw TCP socket too. A fixed
    // order, or a rotation of one, puts that cost on the same shape every time.
    const std::function<Result<double>()> shapes[] = {scattered_op, [&] { return timed(apart); },
                                                      [&] { return timed({contiguous}); },
                                                      one_by_one};
    constexpr int kShapes = std::size(shapes);
    std::vector<double> us[kShapes];
    std::array<int, kShapes> order;
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 shuffler(kShapes);  // the same orders in every run
    for (int rep = 0; rep < kWarmupReps + reps; ++rep) {
      std::shuffle(order.begin(), order.end(), shuffler);
      for (int shape : order) {
        RDMABUF_ASSIGN_OR_RETURN(double t, shapes[shape]());
        if (rep >= kWarmupReps) us[shape].push_back(t);
      }
    }
    const std::vector<double>& us_one = us[0];
    if (kind == OpKind::kWriteFromLocal && verify_)
      fill_seq(local_.span().first(2 * count * size), 0);
    const uint64_t bytes = count * size;
    const std::string n = std::to_string(count);
    std::vector<Sample> rows;
    for (const auto& [peer, peer_us] : {std::pair{n + " ops, one batch", &us[1]},
                                        std::pair{"one op of " + format_bytes(bytes), &us[2]},
                                        std::pair{n + " ops, one by one", &us[3]}}) {
      Sample s = timed_sample(kind, size, count, us_one, "scattered");
      s.gbps = static_cast<double>(bytes) / (s.p50_us * 1e3);
      s.ops_per_s = 1e6 / s.p50_us;
      s.peer = peer;
      s.peer_gbps = static_cast<double>(bytes) / (median(*peer_us) * 1e3);
      rows.push_back(s);
    }
    return rows;
  }

  // `batch` fetch-and-adds of 1 on the remote buffer's first word at once,
  // their previous values side by side in local memory; checks that each
  // batch saw every value from the one before it exactly once, and puts
  // the word back afterwards (untimed).
  Result<Sample> atomic_rate(uint64_t batch, int reps) {
    const uint64_t word = Op::kAtomicWordBytes;
    batch = std::min<uint64_t>(batch, local_.size() / word);
    RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer target, remote_.slice(0, word));
    std::vector<double> us;
    std::vector<uint64_t> seen(batch);
    for (int r = 0; r < kWarmupReps + reps; ++r) {
      std::vector<Op> ops;
      ops.reserve(batch);
      for (uint64_t j = 0; j < batch; ++j) {
        RDMABUF_ASSIGN_OR_RETURN(LocalMemory previous, local_.slice(j * word, word));
        ops.push_back(Op::fetch_add(target, std::move(previous), 1));
      }
      auto start = Clock::now();
      Transfer t = manager_.submit(std::move(ops), kOpTimeout);
      RDMABUF_RETURN_IF_ERROR(t.wait());
      const double took = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (r >= kWarmupReps) us.push_back(took);
      std::memcpy(seen.data(), local_.data(), batch * word);
      std::sort(seen.begin(), seen.end());
      for (uint64_t j = 1; j < batch; ++j) {
        if (seen[j] != seen[0] + j) return Internal("bench: fetch-adds saw a value twice");
      }
    }
    // The word as the peer's pattern has it, for later reads to check.
    RDMABUF_ASSIGN_OR_RETURN(LocalMemory original, local_.slice(0, word));
    fill_seq(original.span(), 0);
    Transfer t = manager_.submit({Op::write(target, original)}, kOpTimeout);
    RDMABUF_RETURN_IF_ERROR(t.wait());
    return timed_sample(OpKind::kFetchAdd, word, batch, us, "rate");
  }

 private:
  // The row of `batch` ops of `size` each, timed `us` per batch: medians
  // and rates from the p50.
  static Sample timed_sample(OpKind kind, uint64_t size, uint64_t batch,
                             const std::vector<double>& us, const char* row_kind) {
    Sample s;
    s.op = op_kind_name(kind);
    s.size = size;
    s.batch = batch;
    s.p50_us = median(us);
    s.p99_us = percentile(us, 99);
    s.gbps = static_cast<double>(size * batch) / (s.p50_us * 1e3);
    s.ops_per_s = static_cast<double>(batch) * 1e6 / s.p50_us;
    s.reps = us.size();
    s.kind = row_kind;
    return s;
  }

  Manager& manager_;
  RemoteBuffer remote_;
  LocalMemory local_;
  bool verify_;
  std::vector<std::byte> reference_;
};

std::string json_line(const std::string& backend, int streams, HostMemory host_memory,
                      const Sample& s) {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "{\"system\":\"%s\",\"backend\":\"%s\",\"op\":\"%s\",\"kind\":\"%s\","
                "\"size\":%llu,\"batch\":%llu,\"streams\":%d,\"gbps\":%.4f,\"p50_us\":%.2f,"
                "\"p99_us\":%.2f,\"ops_per_s\":%.0f,\"reps\":%zu",
                s.system.c_str(), backend.c_str(), s.op.c_str(), s.kind.c_str(),
                static_cast<unsigned long long>(s.size), static_cast<unsigned long long>(s.batch),
                streams, s.gbps, s.p50_us, s.p99_us, s.ops_per_s, s.reps);
  std::string line = buf;
  if (s.system == "rdmabuf") {
    line += ",\"host_memory\":\"" + std::string(host_memory_name(host_memory)) + "\"";
  }
  if (!s.layout.empty()) line += ",\"layout\":\"" + s.layout + "\"";
  if (s.peer_gbps > 0) {
    std::snprintf(buf, sizeof buf, ",\"peer\":\"%s\",\"peer_gbps\":%.4f,\"ratio\":%.3f",
                  s.peer.c_str(), s.peer_gbps, s.gbps / s.peer_gbps);
    line += buf;
  }
  if (s.peer_p50_us > 0) {  // a latency: the ratio is rdmabuf's over the peer's
    std::snprintf(buf, sizeof buf, ",\"peer\":\"%s\",\"peer_p50_us\":%.3f,\"latency_ratio\":%.3f",
                  s.peer.c_str(), s.peer_p50_us, s.p50_us / s.peer_p50_us);
    line += buf;
  }
  if (s.peer_ops_per_s > 0) {  // a rate: rdmabuf's ops/s over the peer's
    std::snprintf(buf, sizeof buf, ",\"peer\":\"%s\",\"peer_ops_per_s\":%.0f,\"ratio\":%.3f",
                  s.peer.c_str(), s.peer_ops_per_s, s.ops_per_s / s.peer_ops_per_s);
    line += buf;
  }
  return line + "}";
}

// Microseconds as the tables print them: 3 decimals below 1 us.
std::string format_us(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", us >= 100 ? 0 : us >= 1 ? 1 : 3, us);
  return buf;
}

std::string human_rate(double ops) {
  char buf[32];
  if (ops >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", ops / 1e6);
  } else if (ops >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", ops / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", ops);
  }
  return buf;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--compare") == 0) return cmd_bench_compare(argc, argv);
    if (std::strcmp(argv[i], "--gpu") == 0) return cmd_bench_gpu(argc, argv);
    if (std::strcmp(argv[i], "--pattern") == 0) return cmd_bench_patterns(argc, argv);
    if (std::strcmp(argv[i], "--op") == 0) {
      // `--op --help` and `--op bogus --help` too: the help of --op.
      if (wants_help(argc, argv) || (i + 1 < argc && (std::strcmp(argv[i + 1], "send") == 0 ||
                                                      std::strcmp(argv[i + 1], "notify") == 0))) {
        return cmd_bench_send(argc, argv);
      }
      return fail(
          InvalidArgument("--op takes send or notify (one-sided reads and writes need no --op)"));
    }
  }
  if (wants_help(argc, argv)) return print_help(kHelp);
  auto parsed = parse_options(argc, argv);
  if (!parsed.ok()) return fail(parsed.status());
  Options o = *parsed;

  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  if (o.backend) config->backends = {*o.backend};
  if (o.streams) config->tcp_streams = *o.streams;
  auto manager_or = Manager::create(*config);
  if (!manager_or.ok()) return fail(manager_or.status());
  Manager& manager = **manager_or;

  std::string backend;
  for (const BackendInfo& b : manager.backends()) {
    if (o.backend && b.name == *o.backend && !b.viable) {
      return fail(FailedPrecondition("backend " + b.name + " is not viable here: " + b.reason));
    }
    if (b.viable && backend.empty()) backend = b.name;
  }
  if (backend.empty()) return fail(FailedPrecondition("no viable backend"));
  const int streams = config->tcp_streams;
  const uint64_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());

  // The peer: a process of our own, or the one behind --connect.
  Child peer;
  RemoteBuffer remote;
  bool verify = false;
  if (o.connect) {
    auto handle = RemoteBuffer::from_text(*o.connect);
    if (!handle.ok()) return fail(handle.status());
    remote = *handle;
    std::fprintf(stderr, "rdmabuf bench: writes go into the buffer behind --connect\n");
  } else {
    uint64_t peer_size = std::max<uint64_t>(
        {max_size, o.window, uint64_t{1} << 20, static_cast<uint64_t>(o.batch) * 128});
    Child::Options options;
    options.env.emplace_back("RDMABUF_BACKENDS", backend);
    options.quiet_stderr = o.quiet;
    auto child =
        Child::spawn({"/proc/self/exe", "serve", "--size", std::to_string(peer_size), "--pattern",
                      "seq", "--host-memory", host_memory_name(o.host_memory)},
                     options);
    if (!child.ok()) return fail(child.status());
    peer = std::move(child).value();
    auto line = peer.read_line(std::chrono::seconds(30));
    if (!line.ok()) return fail(line.status().with_context("the peer process did not start"));
    auto handle = RemoteBuffer::from_text(*line);
    if (!handle.ok()) return fail(handle.status().with_context("the peer printed a bad handle"));
    remote = *handle;
    verify = true;
  }
  // Peers measured in the same run: iperf3 beside tcp; memcpy (the copy
  // limit) and UCX over shared memory beside memory.
  const bool local_peer = o.compare_peer && !o.connect;
  const bool run_iperf = local_peer && backend == "tcp" && on_path("iperf3");
  const bool run_memcpy = local_peer && backend == "memory";
  const bool run_ucx = local_peer && backend == "memory" && on_path("ucx_perftest");
  // perftest beside ibverbs, on the device and GID the backend uses.
  const std::optional<IbDevice> ib = ibverbs_device(manager.backends());
  const bool perftest_peer = local_peer && backend == "ibverbs" && ib && on_path("ib_read_bw") &&
                             on_path("ib_write_bw") && on_path("ib_read_lat");

  // Setup costs, apart from transfer figures.
  std::vector<Sample> setup;
  {
    auto local = allocate_host_memory(max_size, o.host_memory);
    if (!local.ok()) return fail(local.status());
    std::memset(local->data(), 1, local->size());
    auto t0 = Clock::now();
    auto h1 = manager.register_buffer(*local);
    auto t1 = Clock::now();
    auto h2 = manager.register_buffer(*local);
    auto t2 = Clock::now();
    if (!h1.ok() || !h2.ok()) return fail(h1.ok() ? h2.status() : h1.status());
    auto us = [](auto a, auto b) {
      return std::chrono::duration<double, std::micro>(b - a).count();
    };
    setup.push_back(setup_sample("register_first", max_size, us(t0, t1)));
    setup.push_back(setup_sample("register_again", max_size, us(t1, t2)));
    manager.release(*h1).ignore();
    manager.release(*h2).ignore();
  }

  const uint64_t local_size =
      std::max<uint64_t>({o.window, max_size, static_cast<uint64_t>(o.batch) * 128});
  auto local = allocate_host_memory(local_size, o.host_memory);
  if (!local.ok()) return fail(local.status());
  std::memset(local->data(), 0, local->size());  // fault the pages in now, not while timing
  Bench bench(manager, remote, *local, verify);

  {
    auto t0 = Clock::now();
    auto first = bench.run_batch(OpKind::kReadIntoLocal, 8, 1);
    if (!first.ok()) return fail(first.status().with_context("first transfer to the peer"));
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    setup.push_back(setup_sample("first_transfer", 8, us));
  }

  const int latency_samples = std::max(1000, o.iters * 100);
  const int rate_reps = std::max(50, o.iters * 5);
  // UCX's perftest repeats one op on one range: compare that shape at each
  // of --sizes up to 4 MiB, and at 64 MiB, when asked for.
  std::vector<uint64_t> single_sizes;
  for (uint64_t size : o.sizes) {
    if (run_ucx && (size <= (4u << 20) || size == (64u << 20))) single_sizes.push_back(size);
  }
  const bool measure_atomics =
      backend == "tcp" || (backend == "memory" && o.host_memory == HostMemory::kShared);
  int total = 4 + 2 + 2 + (measure_atomics ? 1 : 0) +
              2 * static_cast<int>(o.sizes.size() * o.layouts.size() + single_sizes.size()) +
              (run_iperf ? 3 : 0);
  Progress progress(total, o.quiet);
  std::vector<Sample> results;
  std::vector<double> iperf;
  auto iperf_once = [&] {
    progress.step("iperf3, " + std::to_string(streams) + " stream(s)");
    auto g = run_iperf3(streams, 2);
    if (g.ok()) {
      iperf.push_back(*g);
    } else {
      std::fprintf(stderr, "\nrdmabuf bench: iperf3 failed: %s\n", g.status().to_string().c_str());
    }
  };
  auto record = [&](Result<Sample> s) -> Status {
    if (!s.ok()) return s.status();
    results.push_back(*s);
    return Status::Ok();
  };
  // ucx_perftest's `test` over shared memory, or nothing (said on stderr:
  // the run goes on without that figure).
  auto ucx = [&](const char* test, uint64_t size, int iterations) -> std::optional<UcxFigure> {
    auto figure = run_ucx_perftest(test, size, iterations, "posix,sysv,self");
    if (figure.ok()) return *figure;
    std::fprintf(stderr, "\nrdmabuf bench: ucx_perftest %s failed: %s\n", test,
                 figure.status().to_string().c_str());
    return std::nullopt;
  };
  // Beside reads, ucp_get; beside writes, the put test `put_test` names.
  auto ucx_test = [](OpKind kind, const char* put_test) {
    return kind == OpKind::kReadIntoLocal ? "ucp_get" : put_test;
  };

  Status st;
  for (uint64_t size : {uint64_t{8}, uint64_t{4096}}) {
    for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
      const char* test = ucx_test(kind, "ucp_put_lat");
      progress.step(std::string("latency: ") + op_kind_name(kind) + " " + format_bytes(size) +
                    (run_ucx ? std::string(", and ucx_perftest ") + test : ""));
      st = record(bench.latency(kind, size, latency_samples));
      if (!st.ok()) return fail(st);
      // ucp_get: the median time of one get, one at a time; ucp_put_lat: the
      // median half round trip of a put answered by a put, as UCX prints it.
      if (run_ucx) {
        if (auto figure = ucx(test, size, kUcxLatencyIterations)) {
          results.back().peer = std::string("ucx posix ") + test;
          results.back().peer_p50_us = figure->p50_us;
        }
      }
      if (perftest_peer && kind == OpKind::kReadIntoLocal && size == 8) {
        auto lat = run_perftest("ib_read_lat", *ib, size, latency_samples);
        if (lat.ok()) {
          results.back().peer = "perftest ib_read_lat";
          results.back().peer_p50_us = *lat;
        } else {
          std::fprintf(stderr, "\nrdmabuf bench: ib_read_lat failed: %s\n",
                       lat.status().to_string().c_str());
        }
      }
    }
  }
  for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
    const char* test = ucx_test(kind, "ucp_put_bw");
    progress.step(std::string("rate: ") + op_kind_name(kind) + " 64 B x " +
                  std::to_string(o.batch) +
                  (run_ucx ? std::string(", and ucx_perftest ") + test : ""));
    st = record(bench.rate(kind, 64, static_cast<uint64_t>(o.batch), rate_reps));
    if (!st.ok()) return fail(st);
    if (run_ucx) {
      if (auto figure = ucx(test, 64, kUcxRateIterations)) {
        results.back().peer = std::string("ucx posix ") + test;
        results.back().peer_ops_per_s = figure->ops_per_s;
      }
    }
  }
  for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
    progress.step(std::string("scattered: ") + op_kind_name(kind) + " " + std::to_string(o.batch) +
                  " x 4 KiB in one op, and apart, and contiguous");
    auto rows = bench.scattered(kind, 4096, static_cast<uint64_t>(o.batch), o.iters);
    if (!rows.ok()) return fail(rows.status());
    results.insert(results.end(), rows->begin(), rows->end());
  }
  // Atomics, where this backend carries them (tcp; memory, on a buffer in a
  // shared file), beside UCX's fetch-and-add over the same kind of
  // transport with as many in flight.
  if (measure_atomics) {
    const bool ucx_fadd = local_peer && on_path("ucx_perftest");
    progress.step("rate: fetch-add 8 B x " + std::to_string(o.batch) +
                  (ucx_fadd ? ", and ucx_perftest ucp_fadd" : ""));
    auto atomics = bench.atomic_rate(static_cast<uint64_t>(o.batch), rate_reps);
    if (atomics.status().code() == StatusCode::kFailedPrecondition) {
      std::fprintf(stderr, "\nrdmabuf bench: no fetch-add row: %s\n",
                   atomics.status().to_string().c_str());
    } else {
      st = record(atomics);
      if (!st.ok()) return fail(st);
    }
    const char* transports = backend == "tcp" ? "tcp" : "posix,sysv,self";
    if (ucx_fadd && atomics.ok()) {
      auto figure =
          run_ucx_perftest("ucp_fadd", 8, kUcxRateIterations, UcxEnv{{"UCX_TLS", transports}},
                           std::chrono::seconds(120), o.batch);
      if (figure.ok()) {
        results.back().peer =
            std::string("ucx ") + (backend == "tcp" ? "tcp" : "posix") + " ucp_fadd";
        results.back().peer_ops_per_s = figure->ops_per_s;
      } else {
        std::fprintf(stderr, "\nrdmabuf bench: ucx_perftest ucp_fadd failed: %s\n",
                     figure.status().to_string().c_str());
      }
    }
  }
  if (run_iperf) iperf_once();
  for (size_t l = 0; l < o.layouts.size(); ++l) {
    const bool one_range = o.layouts[l] == "one-range";
    for (size_t i = 0; i < o.sizes.size(); ++i) {
      if (run_iperf && l == 0 && i == o.sizes.size() / 2) iperf_once();
      for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
        progress.step(std::string("bandwidth: ") + op_kind_name(kind) + " " +
                      format_bytes(o.sizes[i]) + ", " + o.layouts[l]);
        st = record(bench.bandwidth(kind, o.sizes[i], o.window, o.iters, "bandwidth",
                                    one_range ? kOneRange : 0));
        if (!st.ok()) return fail(st);
        Sample& s = results.back();
        if (run_memcpy) {
          s.peer = "memcpy";
          s.peer_gbps = measure_memcpy(s.size, s.batch, o.iters, one_range);
        }
        // perftest reuses one buffer: beside the first layout only, once.
        if (perftest_peer && l == 0) {
          const char* test = kind == OpKind::kReadIntoLocal ? "ib_read_bw" : "ib_write_bw";
          auto bw = run_perftest(test, *ib, s.size, perftest_bandwidth_iterations(s.size));
          if (bw.ok()) {
            s.peer = std::string("perftest ") + test;
            s.peer_gbps = *bw;
          } else {
            std::fprintf(stderr, "\nrdmabuf bench: %s failed: %s\n", test,
                         bw.status().to_string().c_str());
          }
        }
      }
    }
  }
  if (run_iperf) iperf_once();
  for (uint64_t size : single_sizes) {
    for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
      const char* test = ucx_test(kind, "ucp_put_bw");
      progress.step(std::string("one op at a time: ") + op_kind_name(kind) + " " +
                    format_bytes(size) + ", and ucx_perftest " + test);
      st = record(bench.bandwidth(kind, size, size, std::max(o.iters, 50), "single"));
      if (!st.ok()) return fail(st);
      // 2 GiB in all, 20 to 1000 ops: a small size costs UCX milliseconds.
      const int iterations = static_cast<int>(std::clamp<uint64_t>((1ull << 31) / size, 20, 1000));
      if (auto figure = ucx(test, size, iterations)) {
        results.back().peer = std::string("ucx posix ") + test;
        results.back().peer_gbps = figure->gbps;
      }
    }
  }
  progress.finish();
  if (!iperf.empty()) {
    for (Sample& s : results) {
      if (s.kind != "bandwidth") continue;
      s.peer = "iperf3 -P " + std::to_string(streams);
      s.peer_gbps = median(iperf);
    }
  }

  if (o.json) {
    for (const Sample& s : setup)
      std::printf("%s\n", json_line(backend, streams, o.host_memory, s).c_str());
    for (const Sample& s : results)
      std::printf("%s\n", json_line(backend, streams, o.host_memory, s).c_str());
    if (!iperf.empty()) {
      Sample p;
      p.system = "iperf3";
      p.op = "stream";
      p.batch = 0;
      p.gbps = median(iperf);
      p.reps = iperf.size();
      p.kind = "bandwidth";
      std::printf("%s\n", json_line("tcp", streams, o.host_memory, p).c_str());
    }
    return kExitOk;
  }

  std::printf("rdmabuf bench: backend %s%s, peer %s, host memory: %s%s, medians of %d reps\n\n",
              backend.c_str(),
              backend == "tcp" ? (", " + std::to_string(streams) + " stream(s)").c_str() : "",
              o.connect ? remote.owner().to_string().c_str()
                        : ("local process " + std::to_string(peer.pid())).c_str(),
              host_memory_name(o.host_memory), o.connect ? " (this side)" : "", o.iters);
  std::printf(
      "setup: first transfer to the peer %.0f us; register %s: first %.1f us, again %.1f us\n",
      setup[2].p50_us, format_bytes(max_size).c_str(), setup[0].p50_us, setup[1].p50_us);
  std::string last_kind;
  for (const Sample& s : results) {
    if (s.kind + s.layout != last_kind) {
      last_kind = s.kind + s.layout;
      if (s.kind == "latency") std::printf("\nsingle round trips (submit, then wait):\n");
      if (s.kind == "rate") std::printf("\nsmall ops, --batch at a time:\n");
      if (s.kind == "scattered") {
        std::printf(
            "\none scattered op of --batch ranges (every other 4 KiB on both sides), beside the\n"
            "same bytes moved as separate ops and as one contiguous op; ops/s: scattered ops:\n");
      }
      if (s.layout == "spread") {
        std::printf("\nbandwidth, --window (%s) of ops on distinct ranges per repetition:\n",
                    format_bytes(o.window).c_str());
      }
      if (s.layout == "one-range") {
        std::printf("\nbandwidth, --window (%s) of ops on one range per repetition:\n",
                    format_bytes(o.window).c_str());
      }
      if (s.kind == "single") {
        std::printf("\none op at a time on one range (the shape ucx_perftest measures):\n");
      }
      // The peer's figure: its p50 beside latency rows, its message rate
      // beside rate rows, its GB/s beside the others.
      const char* peer_unit = s.kind == "latency" ? "p50 us" : s.kind == "rate" ? "ops/s" : "GB/s";
      std::printf("%-9s %-9s %6s %9s %9s %9s %9s  %-20s %9s %6s\n", "op", "size", "batch", "GB/s",
                  "p50 us", "p99 us", "ops/s", "peer, same run", peer_unit, "ratio");
    }
    std::printf("%-9s %-9s %6llu %9.3f %9.1f %9.1f %9s", s.op.c_str(), format_bytes(s.size).c_str(),
                static_cast<unsigned long long>(s.batch), s.gbps, s.p50_us, s.p99_us,
                human_rate(s.ops_per_s).c_str());
    // Every ratio reads the same way: how many times faster rdmabuf is.
    if (s.peer_gbps > 0) {
      std::printf("  %-20s %9.3f %6.2f", s.peer.c_str(), s.peer_gbps, s.gbps / s.peer_gbps);
    }
    if (s.peer_p50_us > 0) {
      std::printf("  %-20s %9s %6.2f", s.peer.c_str(), format_us(s.peer_p50_us).c_str(),
                  s.peer_p50_us / s.p50_us);
    }
    if (s.peer_ops_per_s > 0) {
      std::printf("  %-20s %9s %6.2f", s.peer.c_str(), human_rate(s.peer_ops_per_s).c_str(),
                  s.ops_per_s / s.peer_ops_per_s);
    }
    std::printf("\n");
  }
  const bool any_peer = std::any_of(results.begin(), results.end(), [](const Sample& s) {
    return s.peer_gbps > 0 || s.peer_p50_us > 0 || s.peer_ops_per_s > 0;
  });
  if (any_peer) {
    std::printf(
        "\nratio: how many times faster rdmabuf is than the peer (above 1: rdmabuf is faster):\n"
        "rdmabuf's GB/s or ops/s over the peer's; beside latency, the peer's p50 over "
        "rdmabuf's.\n");
  }
  if (!iperf.empty()) {
    std::printf("\niperf3 -P %d on loopback: median of %zu runs of 2 s, between the rows above.\n",
                streams, iperf.size());
  } else if (local_peer && backend == "tcp") {
    std::printf("\n(iperf3 not found: install it to see raw TCP beside rdmabuf)\n");
  }
  if (run_memcpy) {
    std::printf("\nmemcpy: the same bytes in the same layout, copied in this process.\n");
  }
  if (perftest_peer) {
    std::printf(
        "\nperftest: the same sizes on the same device and GID, its default queue "
        "depth; latency\nrows compare medians.\n");
  }
  if (run_ucx) {
    std::printf(
        "\nucx posix: ucx_perftest between two processes over shared memory\n"
        "(UCX_TLS=posix,sysv,self), in buffers of its own, at its default windows: ucp_get\n"
        "one get at a time, ucp_put_bw up to 32 puts. Beside latency: ucp_get's median time\n"
        "of one get; ucp_put_lat's median HALF round trip (a put answered by a put, halved\n"
        "as UCX prints it) beside rdmabuf's whole write. Beside small ops: the message rate\n"
        "of 64 B ops issued back to back (ucp_get, ucp_put_bw). Beside one op at a time:\n"
        "their bandwidth.\n");
  }
  if (local_peer && backend == "memory" && !run_ucx) {
    std::printf("(ucx_perftest not found: install ucx-utils to see UCX over shared memory)\n");
  }
  std::printf("GB/s = 1e9 bytes per second.\n");
  return kExitOk;
}

}  // namespace rdmabuf::tool
