// rdmabuf bench: bandwidth, small-op latency and batched op rate against a
// peer process, beside iperf3 on the same loopback (BENCHMARKS.md).
//
// Method: every figure is a median over repetitions after warm-up ones;
// latency is reported as p50/p99 of single round trips; setup costs (first
// transfer to a peer, registration) are reported apart. Reads are checked
// byte for byte against the peer's pattern, so a fast wrong answer fails.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/pattern.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {
namespace {

constexpr auto kOpTimeout = std::chrono::seconds(60);
constexpr int kWarmupReps = 2;

struct Options {
  std::optional<std::string> backend;
  std::vector<uint64_t> sizes;
  int batch = 1024;
  std::optional<int> streams;
  int iters = 20;
  uint64_t window = 64 << 20;
  std::optional<std::string> connect;
  bool compare_peer = true;
  bool json = false;
};

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
  std::string note;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double median(const std::vector<double>& v) {
  return percentile(v, 50);
}

class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(STDERR_FILENO)) {}
  void step(const std::string& what) {
    ++done_;
    std::fprintf(stderr, "%s[%2d/%d] %-60s%s", tty_ ? "\r" : "", done_, total_, what.c_str(),
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\r%80s\r", "");
  }

 private:
  int total_;
  int done_ = 0;
  bool tty_;
};

Result<Options> parse_options(int argc, char** argv) {
  RDMABUF_ASSIGN_OR_RETURN(Args args, parse_args(argc, argv, 2,
                                                 {"backend", "sizes", "batch", "streams", "iters",
                                                  "window", "connect", "peer"},
                                                 {"json"}));
  if (!args.positional.empty()) return InvalidArgument("bench takes no positional arguments");
  Options o;
  o.backend = args.get("backend");
  std::string sizes = args.get("sizes").value_or("4K,64K,1M,4M,16M,64M");
  for (const std::string& s : split_list(sizes)) {
    auto size = parse_size(s);
    if (!size.ok() || *size == 0) return InvalidArgument("--sizes: '" + s + "' is not a size > 0");
    o.sizes.push_back(*size);
  }
  if (o.sizes.empty()) return InvalidArgument("--sizes is empty");
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
  std::string peer = args.get("peer").value_or("auto");
  if (peer != "auto" && peer != "none") return InvalidArgument("--peer must be auto or none");
  o.compare_peer = peer == "auto";
  o.json = args.flags.count("json") > 0;
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

  // Submits `batch` ops of `size` and waits; returns microseconds.
  Result<double> run_batch(OpKind kind, uint64_t size, uint64_t batch) {
    std::vector<Op> ops;
    ops.reserve(batch);
    for (uint64_t j = 0; j < batch; ++j) {
      uint64_t offset = (j * size) % (remote_.size() - size + 1);
      RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer r, remote_.slice(offset, size));
      LocalMemory l(local_.data() + offset, size, nullptr);
      ops.push_back(Op{kind, std::move(r), std::move(l)});
    }
    auto start = Clock::now();
    Transfer t = manager_.submit(std::move(ops), kOpTimeout);
    Status st = t.wait();
    auto end = Clock::now();
    if (!st.ok()) return st;
    return std::chrono::duration<double, std::micro>(end - start).count();
  }

  // Checks that the first `bytes` of local memory hold the peer's pattern.
  Status verify(uint64_t bytes) const {
    if (!verify_) return Status::Ok();
    bytes = std::min<uint64_t>(bytes, reference_.size());
    if (std::memcmp(local_.data(), reference_.data(), bytes) != 0) {
      return Internal("bench read back bytes that differ from the peer's pattern");
    }
    return Status::Ok();
  }

  Result<Sample> bandwidth(OpKind kind, uint64_t size, uint64_t window, int reps) {
    uint64_t batch = std::clamp<uint64_t>(window / size, 1, 1024);
    batch = std::min<uint64_t>(batch, std::max<uint64_t>(1, local_.size() / size));
    if (kind == OpKind::kWriteFromLocal && verify_) fill_seq(local_.span().first(size * batch), 0);
    std::vector<double> gbps, us;
    for (int r = 0; r < kWarmupReps + reps; ++r) {
      RDMABUF_ASSIGN_OR_RETURN(double t, run_batch(kind, size, batch));
      if (r < kWarmupReps) continue;
      us.push_back(t);
      gbps.push_back(static_cast<double>(size * batch) / (t * 1e3));
    }
    if (kind == OpKind::kReadIntoLocal) RDMABUF_RETURN_IF_ERROR(verify(size * batch));
    Sample s;
    s.op = op_kind_name(kind);
    s.size = size;
    s.batch = batch;
    s.gbps = median(gbps);
    s.p50_us = median(us);
    s.p99_us = percentile(us, 99);
    s.ops_per_s = static_cast<double>(batch) * 1e6 / s.p50_us;
    s.reps = static_cast<size_t>(reps);
    return s;
  }

  Result<Sample> latency(OpKind kind, uint64_t size, int samples) {
    std::vector<double> us;
    for (int r = 0; r < kWarmupReps * 50 + samples; ++r) {
      RDMABUF_ASSIGN_OR_RETURN(double t, run_batch(kind, size, 1));
      if (r >= kWarmupReps * 50) us.push_back(t);
    }
    if (kind == OpKind::kReadIntoLocal) RDMABUF_RETURN_IF_ERROR(verify(size));
    Sample s;
    s.op = op_kind_name(kind);
    s.size = size;
    s.batch = 1;
    s.p50_us = median(us);
    s.p99_us = percentile(us, 99);
    s.gbps = static_cast<double>(size) / (s.p50_us * 1e3);
    s.ops_per_s = 1e6 / s.p50_us;
    s.reps = us.size();
    s.note = "latency";
    return s;
  }

  Result<Sample> rate(OpKind kind, uint64_t size, uint64_t batch, int reps) {
    RDMABUF_ASSIGN_OR_RETURN(Sample s, bandwidth(kind, size, size * batch, reps));
    s.note = "rate";
    return s;
  }

 private:
  Manager& manager_;
  RemoteBuffer remote_;
  LocalMemory local_;
  bool verify_;
  std::vector<std::byte> reference_;
};

// iperf3 on loopback with `streams` parallel streams for `seconds`: GB/s.
Result<double> run_iperf3(int streams, int seconds) {
  // Find a free port; iperf3 binds it right after (a benign race).
  auto listener = listen_tcp(HostPort{"127.0.0.1", 0}, 1);
  if (!listener.ok()) return listener.status();
  uint16_t port = local_address(listener->get())->port;
  listener->reset();
  std::string p = std::to_string(port);
  Child::Options quiet;
  quiet.capture_stdout = false;
  quiet.quiet_stderr = true;
  RDMABUF_ASSIGN_OR_RETURN(Child server, Child::spawn({"iperf3", "-s", "-1", "-p", p}, quiet));
  for (int attempt = 0; attempt < 50; ++attempt) {
    Child::Options capture;
    capture.quiet_stderr = true;
    RDMABUF_ASSIGN_OR_RETURN(
        Child client, Child::spawn({"iperf3", "-c", "127.0.0.1", "-p", p, "-t",
                                    std::to_string(seconds), "-P", std::to_string(streams), "-J"},
                                   capture));
    auto out = client.read_all(std::chrono::seconds(seconds + 30));
    int rc = client.wait();
    if (rc == 0 && out.ok()) {
      // The receiver's total: "sum_received": { ... "bits_per_second": N
      size_t at = out->find("\"sum_received\"");
      if (at != std::string::npos) at = out->find("\"bits_per_second\"", at);
      if (at == std::string::npos) return Internal("cannot parse iperf3's JSON output");
      at = out->find(':', at);
      double bits = std::strtod(out->c_str() + at + 1, nullptr);
      server.terminate();
      return bits / 8 / 1e9;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // server not up yet
  }
  return Unavailable("iperf3 did not run");
}

std::string json_line(const std::string& backend, int streams, const Sample& s,
                      std::optional<double> peer_gbps) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"system\":\"%s\",\"backend\":\"%s\",\"op\":\"%s\",\"size\":%llu,\"batch\":%llu,"
                "\"streams\":%d,\"gbps\":%.4f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
                "\"ops_per_s\":%.0f,\"reps\":%zu",
                s.system.c_str(), backend.c_str(), s.op.c_str(),
                static_cast<unsigned long long>(s.size), static_cast<unsigned long long>(s.batch),
                streams, s.gbps, s.p50_us, s.p99_us, s.ops_per_s, s.reps);
  std::string line = buf;
  if (peer_gbps && *peer_gbps > 0 && s.system == "rdmabuf" && s.gbps > 0 && s.note.empty()) {
    std::snprintf(buf, sizeof buf, ",\"iperf3_gbps\":%.4f,\"ratio_vs_iperf3\":%.3f", *peer_gbps,
                  s.gbps / *peer_gbps);
    line += buf;
  }
  return line + "}";
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
        {max_size, o.window, uint64_t{1} << 20, static_cast<uint64_t>(o.batch) * 64});
    Child::Options options;
    options.env.emplace_back("RDMABUF_BACKENDS", backend);
    auto child = Child::spawn(
        {"/proc/self/exe", "serve", "--size", std::to_string(peer_size), "--pattern", "seq"},
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
  const bool run_iperf = o.compare_peer && !o.connect && backend == "tcp" && on_path("iperf3");

  // Setup costs, apart from transfer figures.
  std::vector<Sample> setup;
  {
    auto local = LocalMemory::allocate(max_size);
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
    setup.push_back(
        Sample{"rdmabuf", "register_first", max_size, 1, 0, us(t0, t1), us(t0, t1), 0, 1, "setup"});
    setup.push_back(
        Sample{"rdmabuf", "register_again", max_size, 1, 0, us(t1, t2), us(t1, t2), 0, 1, "setup"});
    manager.release(*h1).ignore();
    manager.release(*h2).ignore();
  }

  const uint64_t local_size =
      std::max<uint64_t>({o.window, max_size, static_cast<uint64_t>(o.batch) * 64});
  auto local = LocalMemory::allocate(local_size);
  if (!local.ok()) return fail(local.status());
  std::memset(local->data(), 0, local->size());  // fault the pages in now, not while timing
  Bench bench(manager, remote, *local, verify);

  {
    auto t0 = Clock::now();
    auto first = bench.run_batch(OpKind::kReadIntoLocal, 8, 1);
    if (!first.ok()) return fail(first.status().with_context("first transfer to the peer"));
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    setup.push_back(Sample{"rdmabuf", "first_transfer", 8, 1, 0, us, us, 0, 1, "setup"});
  }

  const int latency_samples = std::max(1000, o.iters * 100);
  const int rate_reps = std::max(50, o.iters * 5);
  int total = 4 + 2 + 2 * static_cast<int>(o.sizes.size()) + (run_iperf ? 3 : 0);
  Progress progress(total);
  std::vector<Sample> results;
  std::vector<double> iperf;
  auto iperf_once = [&]() -> Status {
    progress.step("iperf3, " + std::to_string(streams) + " stream(s)");
    auto g = run_iperf3(streams, 2);
    if (!g.ok()) return g.status();
    iperf.push_back(*g);
    return Status::Ok();
  };
  auto record = [&](Result<Sample> s) -> Status {
    if (!s.ok()) return s.status();
    results.push_back(*s);
    return Status::Ok();
  };

  Status st;
  for (uint64_t size : {uint64_t{8}, uint64_t{4096}}) {
    for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
      progress.step(std::string("latency: ") + op_kind_name(kind) + " " + format_bytes(size));
      st = record(bench.latency(kind, size, latency_samples));
      if (!st.ok()) return fail(st);
    }
  }
  for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
    progress.step(std::string("rate: ") + op_kind_name(kind) + " 64 B x " +
                  std::to_string(o.batch));
    st = record(bench.rate(kind, 64, static_cast<uint64_t>(o.batch), rate_reps));
    if (!st.ok()) return fail(st);
  }
  if (run_iperf && !iperf_once().ok()) std::fprintf(stderr, "\nrdmabuf bench: iperf3 failed\n");
  for (size_t i = 0; i < o.sizes.size(); ++i) {
    if (run_iperf && i == o.sizes.size() / 2 && !iperf_once().ok()) {
      std::fprintf(stderr, "\nrdmabuf bench: iperf3 failed\n");
    }
    for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
      progress.step(std::string("bandwidth: ") + op_kind_name(kind) + " " +
                    format_bytes(o.sizes[i]));
      st = record(bench.bandwidth(kind, o.sizes[i], o.window, o.iters));
      if (!st.ok()) return fail(st);
    }
  }
  if (run_iperf && !iperf_once().ok()) std::fprintf(stderr, "\nrdmabuf bench: iperf3 failed\n");
  progress.finish();
  std::optional<double> iperf_gbps;
  if (!iperf.empty()) iperf_gbps = median(iperf);

  if (o.json) {
    for (const Sample& s : setup)
      std::printf("%s\n", json_line(backend, streams, s, {}).c_str());
    for (const Sample& s : results) {
      std::printf("%s\n", json_line(backend, streams, s, iperf_gbps).c_str());
    }
    if (iperf_gbps) {
      Sample p{"iperf3", "stream", 0, 0, *iperf_gbps, 0, 0, 0, iperf.size(), ""};
      std::printf("%s\n", json_line("tcp", streams, p, {}).c_str());
    }
    return kExitOk;
  }

  std::printf("rdmabuf bench: backend %s, %d stream(s), peer %s, medians of %d reps\n\n",
              backend.c_str(), streams,
              o.connect ? remote.owner().to_string().c_str()
                        : ("local process " + std::to_string(peer.pid())).c_str(),
              o.iters);
  std::printf(
      "setup: first transfer to the peer %.0f us; register %s: first %.1f us, again %.1f us\n\n",
      setup[2].p50_us, format_bytes(max_size).c_str(), setup[0].p50_us, setup[1].p50_us);
  std::printf("%-6s %-9s %6s %9s %9s %9s %9s", "op", "size", "batch", "GB/s", "p50 us", "p99 us",
              "ops/s");
  if (iperf_gbps) std::printf("  %11s %6s", "iperf3 GB/s", "ratio");
  std::printf("\n");
  for (const Sample& s : results) {
    std::printf("%-6s %-9s %6llu %9.3f %9.1f %9.1f %9s", s.op.c_str(), format_bytes(s.size).c_str(),
                static_cast<unsigned long long>(s.batch), s.gbps, s.p50_us, s.p99_us,
                human_rate(s.ops_per_s).c_str());
    if (iperf_gbps && s.note.empty()) {
      std::printf("  %11.3f %6.2f", *iperf_gbps, s.gbps / *iperf_gbps);
    }
    std::printf("\n");
  }
  if (iperf_gbps) {
    std::printf("\niperf3 -P %d on loopback, same run: %.3f GB/s (median of %zu runs of 2 s)\n",
                streams, *iperf_gbps, iperf.size());
  } else if (o.compare_peer && !o.connect && backend == "tcp") {
    std::printf("\n(iperf3 not found: install it to see the raw TCP figure beside rdmabuf's)\n");
  }
  std::printf(
      "\nlatency rows (8 B, 4 KiB, batch 1): single round trips, submit to wait; rate rows\n"
      "(64 B): --batch ops submitted at once; bandwidth rows: --window (%s) of ops in flight\n"
      "per repetition, or one op when it is larger. GB/s = 1e9 bytes per second.\n",
      format_bytes(o.window).c_str());
  return kExitOk;
}

}  // namespace rdmabuf::tool
