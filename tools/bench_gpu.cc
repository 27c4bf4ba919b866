// rdmabuf bench --gpu: one-sided reads and writes of GPU memory, each beside
// what moves the same bytes without it, in the same run:
//
// - on one host, GPU to GPU between two processes (the memory backend: the
//   owner's allocation opened by CUDA IPC), beside PyTorch's
//   `dst.copy_(src)` between two allocations inside one process;
// - over tcp, GPU to GPU, beside host to host memory over tcp.
//
// The owners are `rdmabuf serve --gpu` processes started here; every
// figure is the median of --iters timed repetitions after two warm-up
// ones, each a blocking read_into or write_from of the whole buffer; the
// first read's bytes are checked against the owner's pattern.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/bench_peers.h"
#include "tools/commands.h"
#include "tools/pattern.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {
namespace {

constexpr auto kOpTimeout = std::chrono::seconds(120);
constexpr int kWarmupReps = 2;

constexpr const char* kHelp = R"(usage: rdmabuf bench --gpu [--device N] [--size BYTES]
                     [--tcp-size BYTES] [--iters N] [--peer auto|none]
                     [--json]

Measures reads and writes of GPU memory between two processes on this
host, against owners it starts here (`rdmabuf serve --gpu`):
  memory  GPU to GPU through the memory backend (CUDA IPC), at --size,
          beside PyTorch's dst.copy_(src) between two allocations of
          --size in one process (python3 with torch and CUDA;
          RDMABUF_BENCH_PYTHON names another interpreter);
  tcp     GPU to GPU over tcp (through pinned host memory) at --tcp-size,
          beside host memory to host memory over tcp in the same run.
Each figure is the median of --iters repetitions after warm-up; each
line gives rdmabuf's figure, its peer's and the ratio.

options:
  --device N        the GPU (CUDA's numbering; default 0)
  --size BYTES      the memory rows' size (default 256M)
  --tcp-size BYTES  the tcp rows' size (default 64M)
  --iters N         timed repetitions per figure, 1..1000 (default 10)
  --peer auto|none  auto: measure the peers beside rdmabuf; none: skip
                    them (default auto)
  --json            one JSON object per line on stdout instead of a table
  -h, --help        this text

Sizes take K/M/G suffixes (binary).
exit status: 0; 1 when there is no GPU here or a measurement fails; 2 for
a bad command line or RDMABUF_* variable.
)";

struct Row {
  std::string path;  // "memory" or "tcp"
  std::string op;    // "read" or "write"
  uint64_t size = 0;
  double gbps = 0;
  std::string peer;  // what it is compared with
  std::optional<double> peer_gbps;
  std::string peer_why;  // when there is no peer figure
};

// An owner process: `rdmabuf serve` of `size` bytes, on GPU `device` when
// it is >= 0; its handle.
struct Owner {
  Child child;
  RemoteBuffer handle;
};

Result<Owner> start_owner(uint64_t size, int device) {
  std::vector<std::string> argv = {"/proc/self/exe",     "serve",     "--size",
                                   std::to_string(size), "--pattern", "seq"};
  if (device >= 0) {
    argv.push_back("--gpu");
    argv.push_back(std::to_string(device));
  }
  Child::Options options;
  options.quiet_stderr = true;
  Owner owner;
  RDMABUF_ASSIGN_OR_RETURN(owner.child, Child::spawn(argv, options));
  RDMABUF_ASSIGN_OR_RETURN(std::string line, owner.child.read_line(std::chrono::minutes(2)));
  RDMABUF_ASSIGN_OR_RETURN(owner.handle, RemoteBuffer::from_text(line));
  return owner;
}

Result<std::unique_ptr<Manager>> reader_over(const std::string& backend) {
  RDMABUF_ASSIGN_OR_RETURN(Config config, Config::from_env());
  config.backends = {backend};
  // Restricted on purpose: the warning that the owner offers a better
  // transport is expected here, unless the user asked for warnings.
  if (!std::getenv("RDMABUF_LOG_LEVEL")) config.log_level = LogLevel::kError;
  return Manager::create(config);
}

// The median GB/s of `iters` whole-buffer reads (or writes) of `remote`
// into (from) `local`, after warm-up. Reads are checked once.
Result<double> measure(Manager& reader, const RemoteBuffer& remote, const LocalMemory& local,
                       OpKind kind, int iters) {
  std::vector<double> gbps;
  for (int rep = 0; rep < kWarmupReps + iters; ++rep) {
    const auto start = Clock::now();
    Status st = kind == OpKind::kReadIntoLocal ? reader.read_into(remote, local, kOpTimeout)
                                               : reader.write_from(remote, local, kOpTimeout);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!st.ok()) return st;
    if (rep == 0 && kind == OpKind::kReadIntoLocal) {
      RDMABUF_ASSIGN_OR_RETURN(LocalMemory host, LocalMemory::allocate(remote.size()));
      RDMABUF_RETURN_IF_ERROR(copy_memory(host, local));
      std::vector<std::byte> expected(remote.size());
      fill_seq(expected, 0);
      if (!std::equal(expected.begin(), expected.end(), host.data())) {
        return Internal("the bytes read differ from the owner's pattern");
      }
    }
    if (rep >= kWarmupReps) gbps.push_back(static_cast<double>(remote.size()) / seconds / 1e9);
  }
  std::nth_element(gbps.begin(), gbps.begin() + static_cast<ptrdiff_t>(gbps.size() / 2),
                   gbps.end());
  return gbps[gbps.size() / 2];
}

// Reads and writes of `owner`'s buffer from memory of `local_kind` over
// `backend`: two rows (their peer fields left empty).
Result<std::vector<Row>> measure_path(const std::string& backend, const Owner& owner,
                                      MemoryKind local_kind, int device, int iters) {
  RDMABUF_ASSIGN_OR_RETURN(auto reader, reader_over(backend));
  const uint64_t size = owner.handle.size();
  RDMABUF_ASSIGN_OR_RETURN(LocalMemory local, local_kind == MemoryKind::kCuda
                                                  ? LocalMemory::allocate_gpu(size, device)
                                                  : LocalMemory::allocate(size));
  std::vector<Row> rows;
  for (OpKind kind : {OpKind::kReadIntoLocal, OpKind::kWriteFromLocal}) {
    RDMABUF_ASSIGN_OR_RETURN(double gbps, measure(*reader, owner.handle, local, kind, iters));
    rows.push_back(Row{backend, op_kind_name(kind), size, gbps, "", std::nullopt, ""});
  }
  return rows;
}

std::string figure(std::optional<double> gbps) {
  if (!gbps) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB/s", *gbps);
  return text;
}

void print(const Row& r, bool json) {
  const std::optional<double> ratio =
      r.peer_gbps && *r.peer_gbps > 0 ? std::optional<double>(r.gbps / *r.peer_gbps) : std::nullopt;
  if (json) {
    std::printf(
        "{\"system\": \"rdmabuf\", \"kind\": \"gpu\", \"path\": \"%s\", \"op\": \"%s\", "
        "\"size\": %llu, \"gbps\": %.3f, \"peer\": \"%s\", \"peer_gbps\": %s, \"ratio\": %s}\n",
        r.path.c_str(), r.op.c_str(), static_cast<unsigned long long>(r.size), r.gbps,
        r.peer.c_str(), r.peer_gbps ? std::to_string(*r.peer_gbps).c_str() : "null",
        ratio ? std::to_string(*ratio).c_str() : "null");
    return;
  }
  std::printf("%-6s %-5s %-9s %14s   %-22s %14s  %s\n", r.path.c_str(), r.op.c_str(),
              format_bytes(r.size).c_str(), figure(r.gbps).c_str(), r.peer.c_str(),
              figure(r.peer_gbps).c_str(),
              ratio ? (std::to_string(*ratio).substr(0, 4) + "x").c_str()
                    : ("(" + r.peer_why + ")").c_str());
}

}  // namespace

int cmd_bench_gpu(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kHelp);
  auto args =
      parse_args(argc, argv, 2, {"device", "size", "tcp-size", "iters", "peer"}, {"gpu", "json"});
  if (!args.ok()) return fail(args.status());
  if (!args->positional.empty()) return fail(InvalidArgument("bench takes no positionals"));
  auto device = args->integer("device", 0, 0, 1023);
  auto size = args->size("size", 256 << 20);
  auto tcp_size = args->size("tcp-size", 64 << 20);
  auto iters = args->integer("iters", 10, 1, 1000);
  for (const Status& st : {device.status(), size.status(), tcp_size.status(), iters.status()}) {
    if (!st.ok()) return fail(st);
  }
  const std::string peer = args->get("peer").value_or("auto");
  if (peer != "auto" && peer != "none") return fail(InvalidArgument("--peer takes auto or none"));
  const bool json = args->flags.count("json") > 0;
  const int gpu = static_cast<int>(*device);
  const int reps = static_cast<int>(*iters);

  const GpuSupport support = gpu_support();
  if (!support.status.ok()) return fail(support.status.with_context("bench --gpu"));
  if (static_cast<size_t>(gpu) >= support.gpus.size()) {
    return fail(InvalidArgument("there is no GPU " + std::to_string(gpu)));
  }
  if (!json) {
    std::printf("rdmabuf bench --gpu: GPU %d (%s), CUDA driver %d.%d, %d timed repetitions\n\n",
                gpu, support.gpus[static_cast<size_t>(gpu)].name.c_str(),
                support.driver_version / 1000, support.driver_version % 1000 / 10, reps);
    std::printf("%-6s %-5s %-9s %14s   %-22s %14s  %s\n", "path", "op", "size", "rdmabuf", "peer",
                "peer figure", "ratio");
  }

  // On one host: GPU to GPU between processes, beside torch's copy in one.
  auto gpu_owner = start_owner(*size, gpu);
  if (!gpu_owner.ok()) return fail(gpu_owner.status().with_context("the GPU owner"));
  auto memory_rows = measure_path("memory", *gpu_owner, MemoryKind::kCuda, gpu, reps);
  gpu_owner->child.terminate();
  if (!memory_rows.ok()) return fail(memory_rows.status().with_context("memory, GPU to GPU"));
  Result<double> torch = FailedPrecondition("--peer none");
  if (peer == "auto") torch = run_torch_copy(*size, gpu, reps);
  for (Row& r : *memory_rows) {
    r.peer = "torch copy_ in-process";
    if (torch.ok()) r.peer_gbps = *torch;
    r.peer_why = torch.status().message();
    print(r, json);
  }

  // Over tcp: GPU to GPU, beside host to host.
  auto tcp_gpu_owner = start_owner(*tcp_size, gpu);
  if (!tcp_gpu_owner.ok()) return fail(tcp_gpu_owner.status().with_context("the GPU owner"));
  auto gpu_rows = measure_path("tcp", *tcp_gpu_owner, MemoryKind::kCuda, gpu, reps);
  tcp_gpu_owner->child.terminate();
  if (!gpu_rows.ok()) return fail(gpu_rows.status().with_context("tcp, GPU to GPU"));
  Result<std::vector<Row>> host_rows = FailedPrecondition("--peer none");
  if (peer == "auto") {
    auto host_owner = start_owner(*tcp_size, -1);
    if (!host_owner.ok()) return fail(host_owner.status().with_context("the host owner"));
    host_rows = measure_path("tcp", *host_owner, MemoryKind::kHost, gpu, reps);
    host_owner->child.terminate();
  }
  for (size_t i = 0; i < gpu_rows->size(); ++i) {
    Row& r = (*gpu_rows)[i];
    r.peer = "host memory over tcp";
    if (host_rows.ok()) r.peer_gbps = (*host_rows)[i].gbps;
    r.peer_why = host_rows.status().message();
    print(r, json);
  }
  if (!json) {
    std::printf(
        "\nGB/s = 1e9 bytes/s; each figure the median of %d whole-buffer ops after 2 warm-up "
        "ones; ratio = rdmabuf / peer.\n",
        reps);
  }
  return kExitOk;
}

}  // namespace rdmabuf::tool
