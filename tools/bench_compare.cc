// rdmabuf bench --compare: rdmabuf over every viable backend beside the
// systems people already trust, in one run, over the same sizes
// (BENCHMARKS.md): iperf3 and qperf (raw TCP), ucx_perftest over TCP and
// over shared memory, memcpy, and perftest, on this machine's RDMA device or
// inside the project's Soft-RoCE VM when it has none.
//
// Method: the measurements run in rounds; each round runs every system
// once, so that a machine that gets busier for a while slows all of them,
// and every figure is the median over the rounds (rdmabuf's own figure in
// each round is already a median of --iters repetitions after warm-up).
// rdmabuf is measured by `rdmabuf bench --json` in a child process per
// backend, so each backend starts from a fresh manager, as a user's would.
// The VM run is one round with small sizes: its CPU is emulated, so only its
// ratios mean anything.
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "rdmabuf/version.h"
#include "tools/args.h"
#include "tools/bench_peers.h"
#include "tools/bench_plot.h"
#include "tools/bench_report.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {
namespace {

constexpr const char* kVmSystem = "ibverbs (Soft-RoCE VM)";
constexpr const char* kPerftest = "perftest";
constexpr const char* kVmPerftest = "perftest (Soft-RoCE VM)";

struct CompareOptions {
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> vm_sizes;
  int rounds = 3;
  int iters = 20;   // rdmabuf's repetitions per size in each round
  int seconds = 1;  // per iperf3 and qperf run
  std::string out_dir = "bench-results";
  bool install = true;
  bool vm = true;
  std::string command;  // as given, to reproduce the run
};

constexpr const char* kHelp =
    R"(usage: rdmabuf bench --compare [--out DIR] [--sizes LIST] [--rounds N]
                     [--iters N] [--seconds N] [--vm-sizes LIST]
                     [--no-vm] [--no-install]

Measures rdmabuf over every viable backend beside the tools people already
trust, over the same sizes: iperf3 and qperf (raw TCP), ucx_perftest over
TCP and shared memory, memcpy, and perftest (on this machine's RDMA device,
or beside rdmabuf's ibverbs inside scripts/softroce-vm when it has none).
Runs --rounds rounds of every system and reports medians over them. Prints
one table with rdmabuf's speedup against each peer, and writes table.txt,
results.json and bandwidth.svg into --out. Progress goes to stderr. Takes
minutes; the VM adds a few more.

options:
  --out DIR        where the files go, created if missing
                   (default bench-results)
  --sizes LIST     bandwidth sizes, comma-separated
                   (default 4K,16K,64K,256K,1M,4M,16M,64M)
  --rounds N       rounds of every system, 1..100 (default 3)
  --iters N        rdmabuf's repetitions per size in each round, 1..100000
                   (default 20)
  --seconds N      length of each iperf3 and qperf run, 1..60 (default 1)
  --vm-sizes LIST  sizes measured in the Soft-RoCE VM, one round
                   (default 4K,64K,1M)
  --no-vm          do not start the Soft-RoCE VM when there is no RDMA device
  --no-install     do not install missing peers (Debian's iperf3, qperf,
                   ucx-utils; perftest with an RDMA device) with apt-get
  --compare        this form of bench
  -h, --help       this text

Sizes take K/M/G suffixes (binary). RDMABUF_SOFTROCE_VM names the VM runner.
exit status: 0 when an rdmabuf figure was measured (peers that could not
run are listed as not measured, and why); 1 when none was, or the files
cannot be written; 2 for a bad command line or RDMABUF_* variable.
)";

Result<CompareOptions> parse_compare_options(int argc, char** argv) {
  RDMABUF_ASSIGN_OR_RETURN(
      Args args,
      parse_args(argc, argv, 2, {"out", "sizes", "vm-sizes", "rounds", "iters", "seconds"},
                 {"compare", "no-install", "no-vm"}));
  if (!args.positional.empty()) return InvalidArgument("bench takes no positional arguments");
  CompareOptions o;
  RDMABUF_ASSIGN_OR_RETURN(o.sizes, args.size_list("sizes", "4K,16K,64K,256K,1M,4M,16M,64M"));
  RDMABUF_ASSIGN_OR_RETURN(o.vm_sizes, args.size_list("vm-sizes", "4K,64K,1M"));
  RDMABUF_ASSIGN_OR_RETURN(int64_t rounds, args.integer("rounds", 3, 1, 100));
  RDMABUF_ASSIGN_OR_RETURN(int64_t iters, args.integer("iters", 20, 1, 100000));
  RDMABUF_ASSIGN_OR_RETURN(int64_t seconds, args.integer("seconds", 1, 1, 60));
  o.rounds = static_cast<int>(rounds);
  o.iters = static_cast<int>(iters);
  o.seconds = static_cast<int>(seconds);
  o.out_dir = args.get("out").value_or(o.out_dir);
  o.install = !args.flags.count("no-install");
  o.vm = !args.flags.count("no-vm");
  o.command = "rdmabuf bench";
  for (int i = 2; i < argc; ++i)
    o.command += std::string(" ") + argv[i];
  return o;
}

std::string join_sizes(const std::vector<uint64_t>& sizes) {
  std::string out;
  for (uint64_t s : sizes)
    out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

// --- The machine and the run ---------------------------------------------------

std::string first_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    size_t at = line.find_first_of(":=", key.size());
    if (at == std::string::npos) continue;
    std::string value(trim(line.substr(at + 1)));
    if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
    return value;
  }
  return "";
}

std::string describe_machine() {
  std::string cpu = first_value("/proc/cpuinfo", "model name");
  std::string memory = first_value("/proc/meminfo", "MemTotal");  // "24598036 kB"
  std::string os = first_value("/etc/os-release", "PRETTY_NAME");
  utsname u{};
  ::uname(&u);
  std::string out = cpu.empty() ? "unknown CPU" : cpu;
  out += ", " + std::to_string(std::thread::hardware_concurrency()) + " cores";
  if (!memory.empty()) {
    out += ", " + format_bytes(std::strtoull(memory.c_str(), nullptr, 10) * 1024) + " memory";
  }
  out += std::string(", Linux ") + u.release;
  if (!os.empty()) out += ", " + os;
  return out;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Internal("cannot write " + path);
  return Status::Ok();
}

Status make_directories(const std::string& path) {
  std::string prefix;
  for (const std::string& part : split_list(path, '/')) {
    prefix += (prefix.empty() && path[0] != '/' ? "" : "/") + part;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Internal("cannot create " + prefix + ": " + errno_text(errno));
    }
  }
  return Status::Ok();
}

// --- Peers from Debian ------------------------------------------------------------

// Installs, with apt-get (through sudo when not root), the packages of the
// peer programs that are not on PATH. What cannot be installed is left to
// be reported as not measured.
void install_missing(const std::vector<std::pair<std::string, std::string>>& program_packages) {
  std::vector<std::string> missing;
  for (const auto& [program, package] : program_packages) {
    if (!on_path(program) && std::find(missing.begin(), missing.end(), package) == missing.end()) {
      missing.push_back(package);
    }
  }
  if (missing.empty()) return;
  std::string list;
  for (const std::string& p : missing)
    list += " " + p;
  if (!on_path("apt-get")) {
    std::fprintf(stderr, "rdmabuf bench: not a Debian system; install%s to compare with them\n",
                 list.c_str());
    return;
  }
  std::vector<std::string> prefix;
  if (::geteuid() != 0) {
    if (!on_path("sudo")) {
      std::fprintf(stderr, "rdmabuf bench: not root and no sudo; cannot install%s\n", list.c_str());
      return;
    }
    prefix = {"sudo", "-n"};  // no password prompt hidden behind the progress
  }
  std::fprintf(stderr, "rdmabuf bench: installing%s from Debian's packages\n", list.c_str());
  auto apt = [&prefix](std::vector<std::string> args) {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), {"env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q"});
    argv.insert(argv.end(), args.begin(), args.end());
    Child::Options options;
    options.quiet_stderr = true;
    auto child = Child::spawn(argv, options);
    if (!child.ok()) return false;
    child->read_all(std::chrono::minutes(15)).status().ignore();
    return child->wait() == 0;
  };
  std::vector<std::string> install = {"install", "-y", "--no-install-recommends"};
  install.insert(install.end(), missing.begin(), missing.end());
  // The package lists of a fresh machine may be empty or stale: update once.
  if (!apt(install) && !(apt({"update"}) && apt(install))) {
    std::fprintf(stderr, "rdmabuf bench: apt-get could not install%s\n", list.c_str());
  }
}

// --- rdmabuf, measured by `rdmabuf bench --json` in a child ---------------------------

double number(const std::map<std::string, std::string>& row, const std::string& key) {
  auto it = row.find(key);
  return it == row.end() ? 0 : std::strtod(it->second.c_str(), nullptr);
}

std::string text(const std::map<std::string, std::string>& row, const std::string& key) {
  auto it = row.find(key);
  return it == row.end() ? "" : it->second;
}

// The figures of one line of `rdmabuf bench --json`: rdmabuf's as `system`,
// and the perftest figure beside it, if any, as `perftest_system`.
void add_bench_line(const std::map<std::string, std::string>& row, const std::string& system,
                    const std::string& perftest_system, std::vector<Figure>& figures) {
  const std::string kind = text(row, "kind");
  // Scattered rows compare rdmabuf with itself: no peer's column here.
  if (text(row, "system") != "rdmabuf" || kind == "single" || kind == "scattered") return;
  // The peers reuse one buffer: rdmabuf's figure beside theirs is the one
  // of the same shape; the spread one is shown apart.
  Figure f = Figure::of(
      system, kind == "bandwidth" && text(row, "layout") == "spread" ? "bandwidth_spread" : kind,
      text(row, "op"), static_cast<uint64_t>(number(row, "size")));
  f.gbps = kind == "bandwidth" ? number(row, "gbps") : 0;  // both layouts
  f.p50_us = number(row, "p50_us");
  f.p99_us = number(row, "p99_us");
  f.ops_per_s = kind == "rate" ? number(row, "ops_per_s") : 0;
  figures.push_back(f);
  if (text(row, "peer").rfind("perftest", 0) != 0) return;
  Figure p = f;
  p.system = perftest_system;
  p.p99_us = 0;
  if (number(row, "peer_gbps") > 0) {
    p.gbps = number(row, "peer_gbps");
    p.p50_us = 0;
    p.note = "ib_read_bw / ib_write_bw at their default queue depth";
  } else if (number(row, "peer_p50_us") > 0) {
    p.p50_us = number(row, "peer_p50_us");
    p.note = "latency: ib_read_lat's typical (median) round trip";
  } else {
    return;
  }
  figures.push_back(p);
}

struct BenchChild {
  std::vector<std::string> prefix;  // e.g. the VM runner and its options
  std::string backend;
  std::vector<uint64_t> sizes;
  int iters = 20;
  uint64_t window = 64 << 20;
  bool with_perftest = false;  // let the child run perftest beside ibverbs
  std::string system;
  std::string perftest_system;
  std::chrono::seconds limit{600};
};

// Runs the child and adds its figures. Lines that are not JSON (the VM's
// console, errors) go to stderr.
Status run_bench_child(const BenchChild& spec, std::vector<Figure>& figures) {
  std::vector<std::string> argv = spec.prefix;
  argv.insert(argv.end(),
              {"/proc/self/exe", "bench", "--backend", spec.backend, "--json", "--quiet", "--sizes",
               join_sizes(spec.sizes), "--iters", std::to_string(spec.iters), "--window",
               std::to_string(spec.window), "--layouts", "one-range,spread", "--peer",
               spec.with_perftest ? "auto" : "none"});
  if (!spec.prefix.empty()) {  // the VM runs this program by its path, not /proc/self/exe
    char self[4096];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return Internal("cannot find this program's path: " + errno_text(errno));
    argv[spec.prefix.size()] = std::string(self, static_cast<size_t>(n));
  }
  RDMABUF_ASSIGN_OR_RETURN(Child child, Child::spawn(argv, Child::Options{}));
  const Deadline deadline = Clock::now() + spec.limit;
  size_t parsed = 0;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto line = child.read_line(std::max(left, std::chrono::milliseconds(1)));
    if (!line.ok() && line.status().code() == StatusCode::kUnavailable) break;  // end of output
    if (!line.ok()) return line.status().with_context(spec.system + " did not finish");
    size_t open = line->find("{\"system\"");
    size_t close = line->rfind('}');
    if (open == std::string::npos || close == std::string::npos || close < open) {
      if (!trim(*line).empty()) std::fprintf(stderr, "  | %s\n", line->c_str());
      continue;
    }
    auto row = parse_flat_json_object(std::string_view(*line).substr(open, close - open + 1));
    if (!row.ok()) return row.status().with_context(spec.system + " printed a bad line");
    add_bench_line(*row, spec.system, spec.perftest_system, figures);
    ++parsed;
  }
  int rc = child.wait();
  if (rc != 0) {
    return Status(rc == 125 ? StatusCode::kUnavailable : StatusCode::kInternal,
                  spec.system + " exited with status " + std::to_string(rc) +
                      (rc == 125 ? " (the Soft-RoCE VM cannot be set up here)" : ""));
  }
  if (parsed == 0) return Internal(spec.system + " printed no figures");
  return Status::Ok();
}

// --- Peers, one run each per round -------------------------------------------------

// One system's runs in one round; adds its figures.
struct PeerTask {
  std::string label;
  std::string system;
  std::function<Status(std::vector<Figure>&)> run;
};

Figure bandwidth_figure(const std::string& system, const std::string& op, uint64_t size,
                        double gbps) {
  Figure f = Figure::of(system, "bandwidth", op, size);
  f.gbps = gbps;
  return f;
}

Figure latency_figure(const std::string& system, const std::string& op, uint64_t size,
                      double round_trip_us, const std::string& note) {
  Figure f = Figure::of(system, "latency", op, size);
  f.p50_us = round_trip_us;
  f.note = note;
  return f;
}

PeerTask iperf3_task(int streams, const CompareOptions& o) {
  const std::string system = "iperf3 -P " + std::to_string(streams);
  return {system, system, [=](std::vector<Figure>& out) -> Status {
            for (uint64_t size : o.sizes) {
              RDMABUF_ASSIGN_OR_RETURN(
                  double gbps, run_iperf3(streams, o.seconds, std::min(size, kIperf3MaxLength)));
              out.push_back(bandwidth_figure(system, "stream", size, gbps));
              out.back().note = "-l SIZE (bytes per write; iperf3 allows 1 MiB at most), " +
                                std::to_string(o.seconds) + " s per size";
            }
            return Status::Ok();
          }};
}

PeerTask qperf_task(const CompareOptions& o) {
  return {"qperf", "qperf", [=](std::vector<Figure>& out) -> Status {
            for (uint64_t size : o.sizes) {
              RDMABUF_ASSIGN_OR_RETURN(double gbps, run_qperf("tcp_bw", size, o.seconds));
              out.push_back(bandwidth_figure("qperf", "stream", size, gbps));
            }
            for (uint64_t size : {uint64_t{8}, uint64_t{4096}}) {
              RDMABUF_ASSIGN_OR_RETURN(double one_way, run_qperf("tcp_lat", size, o.seconds));
              out.push_back(latency_figure("qperf", "stream", size, 2 * one_way,
                                           "latency: 2 x tcp_lat (qperf reports one way)"));
            }
            return Status::Ok();
          }};
}

// ucx_perftest over `transports`: ucp_get beside reads, ucp_put_bw beside
// writes; read latency is ucp_get's median, write latency twice
// ucp_put_lat's (a half round trip); the rate row is the message rate of
// 64 B gets and puts.
PeerTask ucx_task(const std::string& system, const std::string& transports, bool over_tcp,
                  const CompareOptions& o) {
  return {
      system + " (ucx_perftest)", system, [=](std::vector<Figure>& out) -> Status {
        // UCX over TCP serves a get in about a millisecond: fewer of them.
        const int get_cap = over_tcp ? 1000 : 100000;
        const uint64_t budget = over_tcp ? (128u << 20) : (512u << 20);
        auto iterations = [&](uint64_t size, int cap) {
          return static_cast<int>(std::clamp<uint64_t>(budget / size, 20, cap));
        };
        for (uint64_t size : o.sizes) {
          RDMABUF_ASSIGN_OR_RETURN(
              UcxFigure get,
              run_ucx_perftest("ucp_get", size, iterations(size, get_cap), transports));
          out.push_back(bandwidth_figure(system, "read", size, get.gbps));
          RDMABUF_ASSIGN_OR_RETURN(
              UcxFigure put,
              run_ucx_perftest("ucp_put_bw", size, iterations(size, 100000), transports));
          out.push_back(bandwidth_figure(system, "write", size, put.gbps));
        }
        for (uint64_t size : {uint64_t{8}, uint64_t{4096}}) {
          RDMABUF_ASSIGN_OR_RETURN(
              UcxFigure get, run_ucx_perftest("ucp_get", size, over_tcp ? 200 : 10000, transports));
          out.push_back(
              latency_figure(system, "read", size, get.p50_us, "read latency: ucp_get's median"));
          RDMABUF_ASSIGN_OR_RETURN(UcxFigure put,
                                   run_ucx_perftest("ucp_put_lat", size, 10000, transports));
          out.push_back(latency_figure(system, "write", size, 2 * put.p50_us,
                                       "write latency: 2 x ucp_put_lat (a half round trip)"));
        }
        for (const char* test : {"ucp_get", "ucp_put_bw"}) {
          const bool get = std::string(test) == "ucp_get";
          RDMABUF_ASSIGN_OR_RETURN(UcxFigure rate,
                                   run_ucx_perftest(test, 64, get ? get_cap : 200000, transports));
          Figure f;
          f.system = system;
          f.kind = "rate";
          f.op = get ? "read" : "write";
          f.size = 64;
          f.ops_per_s = rate.ops_per_s;
          f.note = "rate: the message rate of 64 B ucp_get / ucp_put_bw";
          out.push_back(f);
        }
        return Status::Ok();
      }};
}

PeerTask memcpy_task(const CompareOptions& o) {
  return {"memcpy", "memcpy", [=](std::vector<Figure>& out) -> Status {
            for (uint64_t size : o.sizes) {
              // rdmabuf's one-range rows: a 64 MiB window of ops on one range.
              uint64_t batch = std::clamp<uint64_t>((64u << 20) / size, 1, 1024);
              double gbps = measure_memcpy(size, batch, 10, true);
              if (gbps <= 0) return ResourceExhausted("memcpy: cannot map the buffers");
              out.push_back(bandwidth_figure("memcpy", "stream", size, gbps));
              out.back().note = "one range copied again and again in one process";
            }
            return Status::Ok();
          }};
}

// The Soft-RoCE VM runner: RDMABUF_SOFTROCE_VM, else the source tree's.
std::optional<std::string> find_softroce_vm() {
  if (const char* env = std::getenv("RDMABUF_SOFTROCE_VM")) return std::string(env);
#ifdef RDMABUF_SOURCE_DIR
  std::string path = std::string(RDMABUF_SOURCE_DIR) + "/scripts/softroce-vm";
  if (::access(path.c_str(), X_OK) == 0) return path;
#endif
  return std::nullopt;
}

void note_skip(std::vector<Skipped>& skipped, const std::string& system, const Status& why) {
  for (const Skipped& s : skipped) {
    if (s.system == system) return;  // the first reason is enough
  }
  skipped.push_back({system, why.to_string()});
}

}  // namespace

int cmd_bench_compare(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kHelp);
  auto parsed = parse_compare_options(argc, argv);
  if (!parsed.ok()) return fail(parsed.status());
  const CompareOptions o = *parsed;
  Status made = make_directories(o.out_dir);
  if (!made.ok()) return fail(made);

  // Which backends are viable here, as a user's manager would see them.
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  std::vector<std::string> backends;
  bool host_ibverbs = false;
  {
    auto manager = Manager::create(*config);
    if (!manager.ok()) return fail(manager.status());
    for (const BackendInfo& b : (*manager)->backends()) {
      if (!b.viable) continue;
      backends.push_back(b.name);
      host_ibverbs |= b.name == "ibverbs";
    }
  }
  const int streams = config->tcp_streams;
  auto viable = [&](const char* name) {
    return std::find(backends.begin(), backends.end(), name) != backends.end();
  };

  if (o.install) {
    std::vector<std::pair<std::string, std::string>> wanted = {
        {"iperf3", "iperf3"}, {"qperf", "qperf"}, {"ucx_perftest", "ucx-utils"}};
    if (host_ibverbs) wanted.push_back({"ib_read_bw", "perftest"});
    install_missing(wanted);
  }

  std::vector<Skipped> skipped;
  std::vector<PeerTask> tasks;  // in the order they run in each round
  auto rdmabuf_task = [&](const std::string& backend) {
    BenchChild spec;
    spec.backend = backend;
    spec.sizes = o.sizes;
    spec.iters = o.iters;
    spec.system = "rdmabuf " + backend;
    spec.with_perftest = backend == "ibverbs";
    spec.perftest_system = kPerftest;
    return PeerTask{spec.system, spec.system,
                    [spec](std::vector<Figure>& out) { return run_bench_child(spec, out); }};
  };
  auto add_peer = [&](PeerTask task, const char* program, const char* package) {
    if (on_path(program)) {
      tasks.push_back(std::move(task));
    } else {
      note_skip(
          skipped, task.system,
          NotFound(std::string(program) + " is not installed (Debian package " + package + ")"));
    }
  };
  if (viable("tcp")) {
    tasks.push_back(rdmabuf_task("tcp"));
    add_peer(iperf3_task(streams, o), "iperf3", "iperf3");
    add_peer(qperf_task(o), "qperf", "qperf");
    add_peer(ucx_task("UCX tcp", "tcp,self", true, o), "ucx_perftest", "ucx-utils");
  }
  if (viable("memory")) {
    tasks.push_back(rdmabuf_task("memory"));
    add_peer(ucx_task("UCX shm", "posix,sysv,self", false, o), "ucx_perftest", "ucx-utils");
    tasks.push_back(memcpy_task(o));
  }
  if (host_ibverbs) tasks.push_back(rdmabuf_task("ibverbs"));

  std::optional<std::string> vm;
  if (!host_ibverbs && o.vm) {
    vm = find_softroce_vm();
    if (!vm) {
      note_skip(skipped, std::string("rdmabuf ") + kVmSystem,
                NotFound("scripts/softroce-vm not found (set RDMABUF_SOFTROCE_VM to its path)"));
    }
  } else if (!host_ibverbs) {
    note_skip(skipped, std::string("rdmabuf ") + kVmSystem, Cancelled("--no-vm"));
  }

  Progress progress(o.rounds * static_cast<int>(tasks.size()) + (vm ? 1 : 0));
  std::vector<Figure> runs;
  for (int round = 1; round <= o.rounds; ++round) {
    for (const PeerTask& task : tasks) {
      progress.step("round " + std::to_string(round) + "/" + std::to_string(o.rounds) + ": " +
                    task.label);
      std::vector<Figure> figures;
      Status st = task.run(figures);
      if (!st.ok()) {
        progress.finish();
        std::fprintf(stderr, "rdmabuf bench: %s: %s\n", task.label.c_str(), st.to_string().c_str());
        note_skip(skipped, task.system, st);
        continue;  // a round with a failed run leaves that system's figures out
      }
      runs.insert(runs.end(), figures.begin(), figures.end());
    }
  }
  if (vm) {
    progress.step("rdmabuf ibverbs and perftest in the Soft-RoCE VM (a few minutes)");
    BenchChild spec;
    spec.prefix = {*vm, "--timeout", "1500", "--"};
    spec.backend = "ibverbs";
    spec.sizes = o.vm_sizes;
    spec.iters = 5;
    spec.window = 4 << 20;  // the emulated CPU moves tens of MB/s
    spec.with_perftest = true;
    spec.system = std::string("rdmabuf ") + kVmSystem;
    spec.perftest_system = kVmPerftest;
    spec.limit = std::chrono::seconds(1600);
    Status st = run_bench_child(spec, runs);
    if (!st.ok()) {
      progress.finish();
      std::fprintf(stderr, "rdmabuf bench: %s\n", st.to_string().c_str());
      note_skip(skipped, spec.system, st);
    }
  }
  progress.finish();

  const std::vector<Figure> figures = median_of_runs(runs);
  auto peers = peers_by_backend(streams, kPerftest);
  peers[kVmSystem] = {kVmPerftest};
  const std::vector<Comparison> comparisons = compare(figures, peers);
  RunInfo info;
  info.date = utc_now();
  info.machine = describe_machine();
  info.command = o.command;
  info.version = version();
  info.rounds = o.rounds;
  info.rdmabuf_reps = o.iters;

  const std::string table = render_table(info, figures, comparisons, peers, skipped);
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
  const std::string title = "rdmabuf " + info.version + " and its peers: bandwidth by size";
  Status wrote = write_file(o.out_dir + "/table.txt", table);
  if (wrote.ok()) {
    wrote =
        write_file(o.out_dir + "/results.json", render_json(info, figures, comparisons, skipped));
  }
  if (wrote.ok()) {
    wrote = write_file(
        o.out_dir + "/bandwidth.svg",
        render_bandwidth_svg(title, info.machine + ", " + info.date, bandwidth_panels(figures)));
  }
  if (!wrote.ok()) return fail(wrote);
  std::fprintf(stderr, "rdmabuf bench: wrote %s/table.txt, results.json and bandwidth.svg\n",
               o.out_dir.c_str());
  bool any_rdmabuf = std::any_of(figures.begin(), figures.end(), [](const Figure& f) {
    return f.system.rfind("rdmabuf ", 0) == 0;
  });
  return any_rdmabuf ? kExitOk : fail(Internal("no rdmabuf figure was measured"));
}

}  // namespace rdmabuf::tool
