// rdmabuf soak: the coordinator (see tools/soak.h). Starts one owner process
// and --clients client processes of --managers peers each, lets them run
// --seconds, samples the owner's resources throughout, and fails on any op
// error, any byte read back wrong, a hang, or resources that grew after
// warm-up.
#include "tools/soak.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/host.h"
#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {
namespace soak {

Layout plan_layout(int inflight, int buffers, uint64_t max_op) {
  max_op = std::max(max_op, kMinOpBytes);
  int classes = 1;  // capacities max_op, max_op / 2, ... down to >= kMinOpBytes
  while ((max_op >> classes) >= kMinOpBytes)
    ++classes;
  Layout layout;
  layout.region_bytes.assign(static_cast<size_t>(buffers), 0);
  for (int k = 0; k < inflight; ++k) {
    SlotPlan slot;
    // Classes cycle through the slots; the buffer advances one more per
    // cycle, so that every buffer gets every class when there are enough
    // slots.
    slot.capacity = max_op >> (k % classes);
    slot.buffer = (k + k / classes) % buffers;
    uint64_t& region = layout.region_bytes[static_cast<size_t>(slot.buffer)];
    slot.offset = region;
    region += (slot.capacity + 63) & ~uint64_t{63};  // slots start 64-byte aligned
    layout.slots.push_back(slot);
  }
  for (uint64_t& bytes : layout.region_bytes)
    bytes = std::max<uint64_t>(bytes, 64);  // a buffer no slot uses still exists
  return layout;
}

Usage usage_of(pid_t pid) {
  Usage usage;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream status(proc + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) usage.rss_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
    if (line.rfind("Threads:", 0) == 0) {
      usage.threads = std::strtoull(line.c_str() + 8, nullptr, 10);
    }
  }
  if (DIR* dir = ::opendir((proc + "/fd").c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') ++usage.fds;
    }
    ::closedir(dir);
  }
  return usage;
}

std::string usage_fields(const Usage& usage) {
  return " rss_kib=" + std::to_string(usage.rss_kib) + " fds=" + std::to_string(usage.fds) +
         " threads=" + std::to_string(usage.threads);
}

std::map<std::string, std::string> parse_fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  size_t at = 0;
  bool first = true;
  while (at < line.size()) {
    size_t end = line.find(' ', at);
    if (end == std::string::npos) end = line.size();
    const std::string word = line.substr(at, end - at);
    at = end + 1;
    if (word.empty()) continue;
    if (first) {
      fields[""] = word;
      first = false;
      continue;
    }
    const size_t eq = word.find('=');
    if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return fields;
}

uint64_t field_u64(const std::map<std::string, std::string>& fields, const std::string& key) {
  auto it = fields.find(key);
  if (it == fields.end()) return 0;
  return std::strtoull(it->second.c_str(), nullptr, 10);
}

}  // namespace soak

namespace {

using soak::field_u64;
using soak::parse_fields;
using soak::Usage;
using soak::usage_of;
using Fields = std::map<std::string, std::string>;

// Resources may grow by this much between the sample after warm-up and the
// one at the end (allocator arenas settling, page-table pages) before the
// soak calls it a leak: 10% plus 8 MiB. File descriptors and threads may
// not grow at all.
constexpr double kRssGrowthFraction = 0.10;
constexpr uint64_t kRssGrowthSlackKib = 8 << 10;
// Under AddressSanitizer RSS tells no leak: its allocator keeps memory it
// was given back, so RSS follows the high-water mark of the random op
// sizes in flight (a client over tcp: 103 to 121 MiB in 8 s, past the
// limit in 5 runs of 12; the plain build's clients within 0.2 MiB). Its
// LeakSanitizer, which CI runs, reports leaks when the soak's processes
// exit instead. fds and threads are checked either way.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssTellsLeaks = false;
#else
constexpr bool kRssTellsLeaks = true;
#endif
// Clients stop submitting after --seconds; those that have not drained by
// then plus this (more than an op's deadline and a client's own hang check)
// are hung.
constexpr auto kFinishGrace = std::chrono::seconds(150);
// After the clients have gone, the owner must close their connections
// within this long.
constexpr auto kDisconnectGrace = std::chrono::seconds(10);
// Peers of the owner (client processes x managers each) a run may have.
constexpr int kMaxPeers = 4096;
// The summary has a line per client up to this many clients.
constexpr size_t kClientLinesUpTo = 16;

struct Options {
  int seconds = 60;
  std::optional<std::string> backend;
  int clients = 4;
  int managers = 1;  // per client process
  int inflight = 64;
  uint64_t max_size = 4 << 20;
  int buffers = 4;
  uint64_t seed = 0;
  bool json = false;
};

constexpr const char* kHelp = R"(usage: rdmabuf soak [--seconds N] [--backend NAME] [--clients N]
                    [--managers N] [--inflight N] [--max-size BYTES]
                    [--buffers N] [--seed N] [--json]

A long, verified load against one owner process holding --buffers buffers,
from --clients client processes, each running --managers managers: every
manager is a peer of the owner of its own (its own connections), so the
owner serves clients x managers peers. Each peer keeps --inflight reads
and writes in flight on its own region of every buffer, reads back every
write and compares every byte. Without --backend, client i uses the
(i mod n)-th of the n viable backends, all at once. Meanwhile the owner
registers and releases a small buffer every 2 ms. Prints progress on
stderr, then a summary: ops and bytes (aggregate rates, and the slowest
peer's share of the bytes), errors, and the owner's RSS, fds and threads
after warm-up, at the end and at their peak.

options:
  --seconds N       length of the run, 1..604800 (default 60)
  --backend NAME    run every client over this backend (default: every
                    viable one)
  --clients N       client processes, 1..1024 (default 4)
  --managers N      managers (peers of the owner) per client, 1..1024
                    (default 1); at most 4096 peers in all
  --inflight N      ops in flight per peer, 1..4096 (default 64)
  --max-size BYTES  the largest op, 8..1G; ops range from 8 B up to it
                    (default 4M)
  --buffers N       buffers the owner registers, 1..64 (default 4)
  --seed N          seed of the data patterns, 0..2^63-1 (default: random,
                    printed when the run starts)
  --json            the summary as one JSON object on stdout, the rest on
                    stderr
  --role owner|client
                    internal: how soak starts its own processes
  -h, --help        this text

Sizes take K/M/G suffixes (binary).
exit status: 0 when the run passed; 1 when it failed (each failure is
printed): a failed op, a wrong byte or a hang; the RSS of the owner or a
client grown by over 10% + 8 MiB after warm-up, or its fds or threads
grown at all; or fds the owner keeps after the clients left; 2 for a bad
command line or RDMABUF_* variable.
)";

Result<Options> parse_options(int argc, char** argv) {
  RDMABUF_ASSIGN_OR_RETURN(Args args, parse_args(argc, argv, 2,
                                                 {"seconds", "backend", "clients", "managers",
                                                  "inflight", "max-size", "buffers", "seed"},
                                                 {"json"}));
  if (!args.positional.empty()) return InvalidArgument("soak takes no positional arguments");
  Options o;
  RDMABUF_ASSIGN_OR_RETURN(int64_t seconds, args.integer("seconds", 60, 1, 7 * 24 * 3600));
  o.seconds = static_cast<int>(seconds);
  o.backend = args.get("backend");
  RDMABUF_ASSIGN_OR_RETURN(int64_t clients, args.integer("clients", 4, 1, 1024));
  o.clients = static_cast<int>(clients);
  RDMABUF_ASSIGN_OR_RETURN(int64_t managers, args.integer("managers", 1, 1, 1024));
  o.managers = static_cast<int>(managers);
  if (o.clients * o.managers > kMaxPeers) {
    return InvalidArgument("--clients x --managers must be at most " + std::to_string(kMaxPeers));
  }
  RDMABUF_ASSIGN_OR_RETURN(int64_t inflight, args.integer("inflight", 64, 1, 4096));
  o.inflight = static_cast<int>(inflight);
  RDMABUF_ASSIGN_OR_RETURN(o.max_size, args.size("max-size", 4 << 20));
  if (o.max_size < soak::kMinOpBytes || o.max_size > (uint64_t{1} << 30)) {
    return InvalidArgument("--max-size must be 8 B .. 1 GiB");
  }
  RDMABUF_ASSIGN_OR_RETURN(int64_t buffers, args.integer("buffers", 4, 1, 64));
  o.buffers = static_cast<int>(buffers);
  RDMABUF_ASSIGN_OR_RETURN(int64_t seed, args.integer("seed", 0, 0, INT64_MAX));
  o.seed = args.has("seed") ? static_cast<uint64_t>(seed) : secure_random_u64() >> 1;
  o.json = args.flags.count("json") > 0;
  return o;
}

// A child process and the lines it reports, read by a thread of its own so
// that no child can stall the coordinator.
class Reporter {
 public:
  Reporter(std::string name, Child child) : name_(std::move(name)), child_(std::move(child)) {}
  ~Reporter() {
    child_.terminate();
    if (reader_.joinable()) reader_.join();
  }

  // Reads lines until one starting with `word`; returns its fields.
  // For the owner's handles, before start().
  Result<Fields> expect(const std::string& word, std::vector<std::string>* before,
                        std::chrono::seconds timeout) {
    while (true) {
      RDMABUF_ASSIGN_OR_RETURN(std::string line, child_.read_line(timeout));
      Fields fields = parse_fields(line);
      if (fields[""] == word) return fields;
      if (before) before->push_back(line);
    }
  }

  void start() {
    reader_ = std::thread([this] {
      while (true) {
        auto line = child_.read_line(std::chrono::hours(24 * 365));
        if (!line.ok()) break;
        Fields fields = parse_fields(*line);
        const std::string& word = fields[""];
        std::lock_guard lock(mu_);
        if (word == "error") {
          ++error_lines_;
          std::fprintf(stderr, "\nrdmabuf soak: %s\n", line->c_str());
        } else if (word == "progress") {
          progress_ = fields;
        } else if (word == "warm") {
          warm_ = fields;
        } else if (word == "done") {
          progress_ = fields;
          done_ = fields;
        } else {
          last_ = fields;  // the owner's final report
        }
      }
      std::lock_guard lock(mu_);
      ended_ = true;
    });
  }

  // Signals the process and returns its exit status once it has exited and
  // its output is read.
  int stop() {
    ::kill(child_.pid(), SIGTERM);
    const int code = child_.wait();
    if (reader_.joinable()) reader_.join();
    return code;
  }

  pid_t pid() const { return child_.pid(); }
  const std::string& name() const { return name_; }
  Fields progress() const { return locked(progress_); }
  std::optional<Fields> warm() const { return locked(warm_); }
  std::optional<Fields> done() const { return locked(done_); }
  std::optional<Fields> last() const { return locked(last_); }
  bool ended() const { return locked(ended_); }
  int error_lines() const { return locked(error_lines_); }

 private:
  template <typename T>
  T locked(const T& field) const {
    std::lock_guard lock(mu_);
    return field;
  }

  const std::string name_;
  Child child_;
  std::thread reader_;
  mutable std::mutex mu_;
  Fields progress_;
  std::optional<Fields> warm_, done_, last_;
  bool ended_ = false;
  int error_lines_ = 0;
};

std::string mib(uint64_t kib) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(kib) / 1024.0);
  return buf;
}

std::string clock_text(double seconds) {
  char buf[32];
  const auto s = static_cast<long long>(seconds);
  std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

// What may come and go while a process is steady, not a leak: descriptors
// and threads opened on demand, or held for a moment.
struct Allowance {
  uint64_t fds = 0;
  uint64_t threads = 0;
};

// RSS may grow by kRssGrowthFraction + kRssGrowthSlackKib; fds and threads
// by `allowed`. Appends what grew to `failures`.
void check_growth(const std::string& who, const Usage& start, const Usage& end,
                  std::vector<std::string>* failures, Allowance allowed = {}) {
  const uint64_t limit =
      start.rss_kib +
      static_cast<uint64_t>(static_cast<double>(start.rss_kib) * kRssGrowthFraction) +
      kRssGrowthSlackKib;
  if (kRssTellsLeaks && end.rss_kib > limit) {
    failures->push_back(who + " RSS grew from " + mib(start.rss_kib) + " to " + mib(end.rss_kib) +
                        " (limit " + mib(limit) + ")");
  }
  auto beyond = [](uint64_t allowance) {
    return allowance ? " (more than the " + std::to_string(allowance) + " allowed)" : "";
  };
  if (end.fds > start.fds + allowed.fds) {
    failures->push_back(who + " open fds grew from " + std::to_string(start.fds) + " to " +
                        std::to_string(end.fds) + beyond(allowed.fds));
  }
  if (end.threads > start.threads + allowed.threads) {
    failures->push_back(who + " threads grew from " + std::to_string(start.threads) + " to " +
                        std::to_string(end.threads) + beyond(allowed.threads));
  }
}

Usage usage_from(const Fields& fields) {
  return Usage{field_u64(fields, "rss_kib"), field_u64(fields, "fds"),
               field_u64(fields, "threads")};
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}

// The viable backends this soak runs over, best first: --backend alone, or
// every viable one that the configuration enables.
Result<std::vector<std::string>> choose_backends(const Options& o) {
  RDMABUF_ASSIGN_OR_RETURN(Config config, Config::from_env());
  if (o.backend) config.backends = {*o.backend};
  RDMABUF_ASSIGN_OR_RETURN(std::unique_ptr<Manager> manager, Manager::create(config));
  std::vector<std::string> names;
  for (const BackendInfo& b : manager->backends()) {
    if (o.backend && b.name == *o.backend && !b.viable) {
      return FailedPrecondition("backend " + b.name + " is not viable here: " + b.reason);
    }
    if (b.viable) names.push_back(b.name);
  }
  if (names.empty()) return FailedPrecondition("no viable backend");
  return names;
}

// How the owner and the clients are started. Under AddressSanitizer, with
// its quarantine off: the quarantine holds on to freed memory (up to
// 256 MiB by default), which would make the processes' memory balloon. The
// other checks, and the rest of ASAN_OPTIONS, stay in effect.
Child::Options child_options() {
  Child::Options options;
#if defined(__SANITIZE_ADDRESS__)
  const char* asan = std::getenv("ASAN_OPTIONS");
  options.env.emplace_back("ASAN_OPTIONS",
                           std::string(asan && *asan ? asan + std::string(":") : "") +
                               "quarantine_size_mb=0:thread_local_quarantine_size_kb=0");
#endif
  return options;
}

std::string join(const std::vector<std::string>& items, const char* sep = ",") {
  std::string out;
  for (const std::string& item : items)
    out += (out.empty() ? "" : sep) + item;
  return out;
}

}  // namespace

int cmd_soak(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kHelp);
  if (argc > 3 && std::string(argv[2]) == "--role") {
    if (std::string(argv[3]) == "owner") return soak::run_owner(argc, argv);
    if (std::string(argv[3]) == "client") return soak::run_client(argc, argv);
    return fail(InvalidArgument("--role must be owner or client"));
  }
  auto parsed = parse_options(argc, argv);
  if (!parsed.ok()) return fail(parsed.status());
  const Options o = *parsed;
  auto chosen = choose_backends(o);
  if (!chosen.ok()) return fail(chosen.status());
  const std::vector<std::string> backends = *chosen;

  // The owner: every buffer holds one region per peer.
  const soak::Layout layout = soak::plan_layout(o.inflight, o.buffers, o.max_size);
  const int peers = o.clients * o.managers;
  std::vector<std::string> sizes;
  uint64_t owner_bytes = 0;
  for (uint64_t region : layout.region_bytes) {
    sizes.push_back(std::to_string(region * static_cast<uint64_t>(peers)));
    owner_bytes += region * static_cast<uint64_t>(peers);
  }
  auto owner_child = Child::spawn({"/proc/self/exe", "soak", "--role", "owner", "--buffer-sizes",
                                   join(sizes), "--backends", join(backends)},
                                  child_options());
  if (!owner_child.ok()) return fail(owner_child.status().with_context("starting the owner"));
  Reporter owner("owner", std::move(owner_child).value());
  std::vector<std::string> handle_lines;
  auto ready = owner.expect("ready", &handle_lines, std::chrono::seconds(60));
  if (!ready.ok()) return fail(ready.status().with_context("the owner did not start"));
  std::vector<std::string> handles;
  for (const std::string& line : handle_lines) {
    if (line.rfind("handle ", 0) == 0) handles.push_back(line.substr(7));
  }
  if (handles.size() != layout.region_bytes.size()) {
    return fail(Internal("the owner printed " + std::to_string(handles.size()) + " handles, not " +
                         std::to_string(layout.region_bytes.size())));
  }
  owner.start();
  const Usage before_clients = usage_of(owner.pid());

  // The clients: client i runs over backends[i % backends.size()], all at
  // once, against the same owner.
  std::vector<std::unique_ptr<Reporter>> clients;
  std::vector<std::string> client_backend;
  for (int i = 0; i < o.clients; ++i) {
    const std::string& backend = backends[static_cast<size_t>(i) % backends.size()];
    auto child = Child::spawn({"/proc/self/exe", "soak",
                               "--role",         "client",
                               "--index",        std::to_string(i),
                               "--managers",     std::to_string(o.managers),
                               "--backend",      backend,
                               "--handles",      join(handles),
                               "--inflight",     std::to_string(o.inflight),
                               "--max-size",     std::to_string(o.max_size),
                               "--seconds",      std::to_string(o.seconds),
                               "--seed",         std::to_string(o.seed)},
                              child_options());
    if (!child.ok()) return fail(child.status().with_context("starting a client"));
    clients.push_back(
        std::make_unique<Reporter>("client " + std::to_string(i), std::move(child).value()));
    clients.back()->start();
    client_backend.push_back(backend);
  }
  const auto started = Clock::now();
  std::fprintf(stderr,
               "rdmabuf soak: %d s, %d client(s) of %d peer(s) each over %s (client i uses "
               "backend i mod %zu), %d ops in flight per peer, ops of %s .. %s, owner pid %d with "
               "%d buffers (%s), seed %" PRIu64 "\n",
               o.seconds, o.clients, o.managers, join(backends, ", ").c_str(), backends.size(),
               o.inflight, format_bytes(soak::kMinOpBytes).c_str(),
               format_bytes(o.max_size).c_str(), static_cast<int>(owner.pid()), o.buffers,
               format_bytes(owner_bytes).c_str(), o.seed);
  if (static_cast<size_t>(o.clients) < backends.size()) {
    std::fprintf(stderr, "rdmabuf soak: fewer clients than backends: only %zu of them are used\n",
                 static_cast<size_t>(o.clients));
  }

  // Warm-up: every client has verified every slot once (its memory and the
  // owner's are touched, connections are open), and a tenth of the run,
  // 1 .. 30 s, has passed.
  const auto warmup = std::chrono::seconds(std::clamp(o.seconds / 10, 1, 30));
  const auto progress_every = std::chrono::seconds(std::clamp(o.seconds / 20, 1, 10));
  std::optional<Usage> owner_start;
  std::optional<Usage> owner_end;
  double warm_at_s = 0;
  Usage owner_peak;  // each field's largest sample
  std::vector<std::string> failures;
  auto next_progress = started + progress_every;
  const auto give_up = started + std::chrono::seconds(o.seconds) + kFinishGrace;
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - started).count();
    bool all_warm = true, all_done = true;
    for (const auto& c : clients) {
      all_warm &= c->warm().has_value();
      all_done &= c->done().has_value() || c->ended();
    }
    const Usage owner_now = usage_of(owner.pid());
    owner_peak.rss_kib = std::max(owner_peak.rss_kib, owner_now.rss_kib);
    owner_peak.fds = std::max(owner_peak.fds, owner_now.fds);
    owner_peak.threads = std::max(owner_peak.threads, owner_now.threads);
    if (!owner_start && all_warm && now - started >= warmup && !all_done) {
      owner_start = owner_now;
      warm_at_s = elapsed;
    }
    if (all_done) {
      owner_end = owner_now;
      break;
    }
    if (owner.ended()) {
      failures.push_back("the owner exited during the run");
      break;
    }
    if (now >= give_up) {
      for (size_t i = 0; i < clients.size(); ++i) {
        if (!clients[i]->done()) {
          failures.push_back(clients[i]->name() + " did not finish within " +
                             std::to_string(kFinishGrace.count()) + " s of the end (hung)");
        }
      }
      break;
    }
    if (now >= next_progress) {
      next_progress += progress_every;
      uint64_t ops = 0, bytes = 0, errors = 0;
      for (const auto& c : clients) {
        const Fields p = c->progress();
        ops += field_u64(p, "ops");
        bytes += field_u64(p, "bytes");
        errors += field_u64(p, "errors") + field_u64(p, "mismatches");
      }
      std::fprintf(stderr,
                   "soak %s/%s  ops %" PRIu64 " (%.1fk/s)  moved %s (%.2f GB/s)  errors %" PRIu64
                   "  owner RSS %s fds %" PRIu64 " threads %" PRIu64 "\n",
                   clock_text(elapsed).c_str(), clock_text(o.seconds).c_str(), ops,
                   static_cast<double>(ops) / elapsed / 1e3, format_bytes(bytes).c_str(),
                   static_cast<double>(bytes) / elapsed / 1e9, errors,
                   mib(owner_now.rss_kib).c_str(), owner_now.fds, owner_now.threads);
    }
  }
  const double run_s = std::chrono::duration<double>(Clock::now() - started).count();

  // A tcp peer opens its streams (a connection and a thread each) as its
  // load needs them, so a client with few ops in flight may open some only
  // after its warm-up: that much growth is no leak.
  const auto config = Config::from_env();  // parsed once already, by choose_backends
  const uint64_t lazy_tcp_streams =
      static_cast<uint64_t>(o.managers) *
      static_cast<uint64_t>(config.ok() ? config->tcp_streams : Config{}.tcp_streams);

  // The clients leave; the owner must close their connections.
  uint64_t ops = 0, reads = 0, writes = 0, bytes = 0, errors = 0, mismatches = 0;
  uint64_t peer_bytes_min = UINT64_MAX;
  std::vector<std::string> per_backend;
  for (size_t i = 0; i < clients.size(); ++i) {
    Reporter& c = *clients[i];
    const std::optional<Fields> warm = c.warm();
    const std::optional<Fields> done = c.done();
    const int code = c.stop();
    if (!done) {
      failures.push_back(c.name() + " ended without a report (exit status " + std::to_string(code) +
                         ")");
      continue;
    }
    if (!warm) {
      failures.push_back(c.name() + " never verified every one of its slots (too short a run?)");
    } else {
      check_growth(
          c.name(), usage_from(*warm), usage_from(*done), &failures,
          client_backend[i] == "tcp" ? Allowance{lazy_tcp_streams, lazy_tcp_streams} : Allowance{});
    }
    if (code != kExitOk && field_u64(*done, "errors") + field_u64(*done, "mismatches") == 0) {
      failures.push_back(c.name() + " exited with status " + std::to_string(code));
    }
    ops += field_u64(*done, "ops");
    reads += field_u64(*done, "reads");
    writes += field_u64(*done, "writes");
    bytes += field_u64(*done, "bytes");
    errors += field_u64(*done, "errors");
    mismatches += field_u64(*done, "mismatches");
    peer_bytes_min = std::min(peer_bytes_min, field_u64(*done, "peer_bytes_min"));
    const Usage client_start = warm ? usage_from(*warm) : Usage{};
    const Usage client_end = usage_from(*done);
    per_backend.push_back(
        c.name() + " (" + client_backend[i] + "): " + std::to_string(field_u64(*done, "ops")) +
        " ops, " + format_bytes(field_u64(*done, "bytes")) + "; RSS " + mib(client_start.rss_kib) +
        " -> " + mib(client_end.rss_kib) + ", fds " + std::to_string(client_start.fds) + " -> " +
        std::to_string(client_end.fds));
  }
  if (errors > 0) failures.push_back(std::to_string(errors) + " ops failed");
  if (mismatches > 0) failures.push_back(std::to_string(mismatches) + " reads brought wrong bytes");
  Usage after_clients = usage_of(owner.pid());
  for (auto until = Clock::now() + kDisconnectGrace;
       after_clients.fds > before_clients.fds && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after_clients = usage_of(owner.pid());
  }
  if (after_clients.fds > before_clients.fds) {
    failures.push_back("the owner keeps " + std::to_string(after_clients.fds) +
                       " fds open after the clients left, " + std::to_string(before_clients.fds) +
                       " before they came");
  }
  if (!owner_start && owner_end) {
    failures.push_back("no sample after warm-up: the clients never all warmed up");
  }
  // The owner's churned buffer holds a descriptor (its memory's file)
  // while it is registered, which a sample may catch.
  if (owner_start && owner_end) {
    check_growth("owner", *owner_start, *owner_end, &failures, Allowance{.fds = 1});
  }
  const int owner_code = owner.stop();
  const std::optional<Fields> owner_report = owner.last();
  if (owner_code != kExitOk) {
    failures.push_back("the owner exited with status " + std::to_string(owner_code));
  }
  const uint64_t churned = owner_report ? field_u64(*owner_report, "churned") : 0;

  const bool ok = failures.empty();
  const Usage start = owner_start.value_or(Usage{});
  const Usage end = owner_end.value_or(Usage{});
  // The slowest peer's bytes over the mean peer's: 1 when all moved alike.
  const double slowest_share =
      bytes == 0 || peer_bytes_min == UINT64_MAX
          ? 0
          : static_cast<double>(peer_bytes_min) * peers / static_cast<double>(bytes);
  if (o.json) {
    std::string failure_list;
    for (const std::string& f : failures)
      failure_list += (failure_list.empty() ? "\"" : ",\"") + json_escape(f) + "\"";
    std::printf(
        "{\"command\":\"soak\",\"ok\":%s,\"seconds\":%.1f,\"minutes\":%.2f,\"backends\":\"%s\","
        "\"clients\":%d,\"managers\":%d,\"peers\":%d,\"inflight\":%d,\"max_op\":%" PRIu64
        ",\"seed\":%" PRIu64 ",\"ops\":%" PRIu64 ",\"reads\":%" PRIu64 ",\"writes\":%" PRIu64
        ",\"bytes\":%" PRIu64
        ",\"ops_per_s\":%.0f,\"gbps\":%.3f,\"slowest_peer_share\":%.3f"
        ",\"errors\":%" PRIu64 ",\"mismatches\":%" PRIu64 ",\"owner_rss_start_kib\":%" PRIu64
        ",\"owner_rss_end_kib\":%" PRIu64 ",\"owner_rss_peak_kib\":%" PRIu64
        ",\"owner_fds_start\":%" PRIu64 ",\"owner_fds_end\":%" PRIu64 ",\"owner_fds_peak\":%" PRIu64
        ",\"owner_threads_start\":%" PRIu64 ",\"owner_threads_end\":%" PRIu64
        ",\"owner_threads_peak\":%" PRIu64 ",\"owner_fds_before_clients\":%" PRIu64
        ",\"owner_fds_after_clients\":%" PRIu64 ",\"owner_churned\":%" PRIu64
        ",\"failures\":[%s]}\n",
        ok ? "true" : "false", run_s, run_s / 60, join(backends).c_str(), o.clients, o.managers,
        peers, o.inflight, o.max_size, o.seed, ops, reads, writes, bytes,
        static_cast<double>(ops) / run_s, static_cast<double>(bytes) / run_s / 1e9, slowest_share,
        errors, mismatches, start.rss_kib, end.rss_kib, owner_peak.rss_kib, start.fds, end.fds,
        owner_peak.fds, start.threads, end.threads, owner_peak.threads, before_clients.fds,
        after_clients.fds, churned, failure_list.c_str());
  }
  FILE* out = o.json ? stderr : stdout;
  std::fprintf(out,
               "\nrdmabuf soak: %.2f minutes over %s, %d peers (%d clients x %d managers), %d ops "
               "in flight each\n",
               run_s / 60, join(backends, ", ").c_str(), peers, o.clients, o.managers, o.inflight);
  std::fprintf(out, "  ops       %" PRIu64 " (%" PRIu64 " reads, %" PRIu64 " writes), %.1fk/s\n",
               ops, reads, writes, static_cast<double>(ops) / run_s / 1e3);
  std::fprintf(out, "  moved     %s, %.2f GB/s; the slowest peer moved %.2fx the mean\n",
               format_bytes(bytes).c_str(), static_cast<double>(bytes) / run_s / 1e9,
               slowest_share);
  // One line per client while they fit on a screen.
  if (per_backend.size() <= kClientLinesUpTo) {
    for (const std::string& line : per_backend)
      std::fprintf(out, "            %s\n", line.c_str());
  }
  std::fprintf(out, "  errors    %" PRIu64 " failed ops, %" PRIu64 " reads with wrong bytes\n",
               errors, mismatches);
  std::fprintf(out,
               "  owner     RSS %s after %.0f s of warm-up, %s at the end (peak %s; limit +%.0f%% "
               "+ %s%s)\n",
               mib(start.rss_kib).c_str(), warm_at_s, mib(end.rss_kib).c_str(),
               mib(owner_peak.rss_kib).c_str(), kRssGrowthFraction * 100,
               mib(kRssGrowthSlackKib).c_str(),
               kRssTellsLeaks ? "" : ", not checked under AddressSanitizer");
  std::fprintf(out,
               "            fds %" PRIu64 " -> %" PRIu64 " (peak %" PRIu64 "), threads %" PRIu64
               " -> %" PRIu64 " (peak %" PRIu64 "); fds %" PRIu64
               " before the clients came, %" PRIu64 " after they left\n",
               start.fds, end.fds, owner_peak.fds, start.threads, end.threads, owner_peak.threads,
               before_clients.fds, after_clients.fds);
  std::fprintf(out, "            %" PRIu64 " buffers registered and released meanwhile\n", churned);
  for (const std::string& f : failures)
    std::fprintf(out, "  FAILED: %s\n", f.c_str());
  std::fprintf(out, "  result    %s\n", ok ? "PASS" : "FAIL");
  return ok ? kExitOk : kExitFailed;
}

}  // namespace rdmabuf::tool
