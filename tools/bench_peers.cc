#include "tools/bench_peers.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "tools/subprocess.h"

namespace rdmabuf::tool {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// A free loopback port (the peer binds it right after: a benign race).
Result<std::string> free_port() {
  RDMABUF_ASSIGN_OR_RETURN(Fd listener, listen_tcp(HostPort{"127.0.0.1", 0}, 1));
  RDMABUF_ASSIGN_OR_RETURN(HostPort bound, local_address(listener.get()));
  return std::to_string(bound.port);
}

// Starts `server`, then runs `client` until it exits 0 and `parse` accepts
// its output. The server may not be listening yet (and iperf3 -J exits 0
// when it cannot connect), so a failed client is tried again after
// `retry_after` for up to 10 s from the start; then its last error is
// returned. The server is stopped on return.
template <typename T, typename Parse>
Result<T> run_server_and_client(const std::vector<std::string>& server,
                                const std::vector<std::string>& client, const Env& env,
                                std::chrono::seconds client_limit,
                                std::chrono::milliseconds retry_after, Parse parse) {
  Child::Options server_options;
  server_options.capture_stdout = false;
  server_options.quiet_stderr = true;
  server_options.env = env;
  RDMABUF_ASSIGN_OR_RETURN(Child server_process, Child::spawn(server, server_options));
  const Deadline give_up = Clock::now() + std::chrono::seconds(10);
  while (true) {
    Child::Options client_options;
    client_options.quiet_stderr = true;
    client_options.env = env;
    RDMABUF_ASSIGN_OR_RETURN(Child client_process, Child::spawn(client, client_options));
    auto out = client_process.read_all(client_limit);
    int rc = client_process.wait();
    if (!out.ok()) return out.status().with_context(client[0]);
    Result<T> figure =
        rc == 0 ? parse(*out)
                : Result<T>(Unavailable(client[0] + " exited with status " + std::to_string(rc)));
    if (figure.ok() || Clock::now() > give_up) return figure;
    std::this_thread::sleep_for(retry_after);
  }
}

// The `count` numbers after `at` in `text`; fails naming `what`.
Result<std::vector<double>> numbers_after(const std::string& text, size_t at, size_t count,
                                          const std::string& what) {
  if (at == std::string::npos || at > text.size()) {
    return Internal("cannot parse " + what + ": the expected line is missing");
  }
  std::istringstream fields(text.substr(at));
  std::vector<double> v(count);
  for (double& x : v)
    fields >> x;
  if (!fields)
    return Internal("cannot parse " + what + ": fewer than " + std::to_string(count) +
                    " numbers where expected");
  return v;
}

}  // namespace

Result<double> parse_iperf3_json(const std::string& output) {
  // A refused run: "error": "parameter error - ..."
  size_t error = output.find("\"error\"");
  if (error != std::string::npos) {
    size_t open = output.find('"', output.find(':', error));
    size_t close = open == std::string::npos ? open : output.find('"', open + 1);
    if (close != std::string::npos) {
      return Internal("iperf3: " + output.substr(open + 1, close - open - 1));
    }
  }
  // The receiver's total: "sum_received": { ... "bits_per_second": N
  size_t at = output.find("\"sum_received\"");
  if (at != std::string::npos) at = output.find("\"bits_per_second\"", at);
  if (at != std::string::npos) at = output.find(':', at);
  RDMABUF_ASSIGN_OR_RETURN(auto v, numbers_after(output, at == std::string::npos ? at : at + 1, 1,
                                                 "iperf3's JSON (sum_received)"));
  if (v[0] <= 0) return Internal("iperf3 reported no bytes received");
  return v[0] / 8 / 1e9;
}

Result<double> run_iperf3(int streams, int seconds, uint64_t length) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  std::vector<std::string> client = {"iperf3",
                                     "-c",
                                     "127.0.0.1",
                                     "-p",
                                     port,
                                     "-t",
                                     std::to_string(seconds),
                                     "-P",
                                     std::to_string(streams),
                                     "-J"};
  if (length > 0) {
    client.push_back("-l");
    client.push_back(std::to_string(length));
  }
  return run_server_and_client<double>({"iperf3", "-s", "-1", "-p", port}, client, {},
                                       std::chrono::seconds(seconds + 30),
                                       std::chrono::milliseconds(50), parse_iperf3_json);
}

Result<double> parse_qperf(const std::string& test, const std::string& output) {
  // With -uu:  "tcp_bw:\n    bw  =  1127915520 bytes/sec"
  //            "tcp_lat:\n    latency  =  50584 ns"
  const bool latency = test == "tcp_lat";
  const std::string key = latency ? "latency" : "bw";
  size_t at = output.find(test + ":");
  if (at != std::string::npos) at = output.find(key, at + test.size());
  if (at != std::string::npos) at = output.find('=', at);
  RDMABUF_ASSIGN_OR_RETURN(auto v, numbers_after(output, at == std::string::npos ? at : at + 1, 1,
                                                 "qperf " + test + "'s output"));
  const std::string unit = latency ? " ns" : " bytes/sec";
  if (output.find(unit, at) == std::string::npos) {
    return Internal("cannot parse qperf " + test + "'s output: not in" + unit + " (run with -uu)");
  }
  if (v[0] <= 0) return Internal("qperf " + test + " reported " + std::to_string(v[0]));
  return latency ? v[0] / 1e3 : v[0] / 1e9;
}

Result<double> run_qperf(const std::string& test, uint64_t size, int seconds) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  return run_server_and_client<double>(
      {"qperf", "-lp", port},
      {"qperf", "-lp", port, "-t", std::to_string(seconds), "-uu", "-m", std::to_string(size),
       "127.0.0.1", test},
      {}, std::chrono::seconds(seconds + 30), std::chrono::milliseconds(50),
      [&test](const std::string& out) { return parse_qperf(test, out); });
}

Result<UcxFigure> parse_ucx_perftest(const std::string& output) {
  // Final: iterations, latency p50/avg/overall (us), bandwidth avg/overall
  // (MB/s, MB = 2^20 bytes), message rate avg/overall.
  size_t at = output.find("Final:");
  RDMABUF_ASSIGN_OR_RETURN(auto v, numbers_after(output, at == std::string::npos ? at : at + 6, 8,
                                                 "ucx_perftest's Final line"));
  if (v[0] <= 0) return Internal("ucx_perftest reported no iterations");
  return UcxFigure{v[1], v[5] * 1048576.0 / 1e9, v[7]};
}

Result<UcxFigure> run_ucx_perftest(const std::string& test, uint64_t size, int iterations,
                                   const std::string& transports) {
  return run_ucx_perftest(test, size, iterations, UcxEnv{{"UCX_TLS", transports}});
}

Result<UcxFigure> run_ucx_perftest(const std::string& test, uint64_t size, int iterations,
                                   const UcxEnv& env, std::chrono::seconds limit, int outstanding) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  std::vector<std::string> args = {
      "-p", port, "-t", test, "-s", std::to_string(size), "-n", std::to_string(iterations)};
  if (outstanding > 0) {
    args.push_back("-O");
    args.push_back(std::to_string(outstanding));
  }
  std::vector<std::string> server = {"ucx_perftest"};
  server.insert(server.end(), args.begin(), args.end());
  std::vector<std::string> client = {"ucx_perftest", "127.0.0.1"};
  client.insert(client.end(), args.begin(), args.end());
  return run_server_and_client<UcxFigure>(server, client, env, limit,
                                          std::chrono::milliseconds(100), parse_ucx_perftest);
}

Result<double> parse_perftest(const std::string& test, const std::string& output) {
  // The figures follow the header line that starts with " #bytes".
  // bw: bytes, iterations, peak, average (Gb/s), msg rate.
  // lat: bytes, iterations, min, max, typical (us), ...
  size_t at = output.find("#bytes");
  if (at != std::string::npos) at = output.find('\n', at);
  RDMABUF_ASSIGN_OR_RETURN(auto v, numbers_after(output, at, 5, test + "'s output"));
  const bool latency = test.find("_lat") != std::string::npos;
  double figure = latency ? v[4] : v[3] / 8;
  if (figure <= 0) return Internal(test + " reported " + std::to_string(figure));
  return figure;
}

std::optional<IbDevice> ibverbs_device(const std::vector<BackendInfo>& backends) {
  for (const BackendInfo& b : backends) {
    if (b.name != "ibverbs") continue;
    for (const auto& [key, value] : b.details) {
      if (key != "using") continue;
      IbDevice device;
      device.name = value.substr(0, value.find(' '));  // "rxe0 port 1 (...), GID[1] ..."
      const size_t p = value.find(" port ");
      if (p != std::string::npos) device.port = std::atoi(value.c_str() + p + 6);
      const size_t g = value.find("GID[");
      if (g != std::string::npos) device.gid_index = std::atoi(value.c_str() + g + 4);
      if (!device.name.empty()) return device;
    }
  }
  return std::nullopt;
}

int perftest_bandwidth_iterations(uint64_t size) {
  return static_cast<int>(std::clamp<uint64_t>((16u << 20) / size, 20, 1000));
}

Result<double> run_perftest(const std::string& test, const IbDevice& device, uint64_t size,
                            int iterations) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  std::vector<std::string> server = {test,
                                     "-d",
                                     device.name,
                                     "-i",
                                     std::to_string(device.port),
                                     "-x",
                                     std::to_string(device.gid_index),
                                     "-s",
                                     std::to_string(size),
                                     "-n",
                                     std::to_string(iterations),
                                     "-p",
                                     port};
  const bool latency = test.find("_lat") != std::string::npos;
  if (!latency) server.push_back("--report_gbits");  // Gb/s, 1e9 bits: no MiB ambiguity
  std::vector<std::string> client = server;
  client.push_back("127.0.0.1");
  return run_server_and_client<double>(
      server, client, {}, std::chrono::seconds(300), std::chrono::milliseconds(200),
      [&test](const std::string& out) { return parse_perftest(test, out); });
}

double measure_memcpy(uint64_t size, uint64_t batch, int reps, bool one_range) {
  const size_t bytes = one_range ? size : size * batch;
  const uint64_t stride = one_range ? 0 : size;
  auto map = [bytes] {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  };
  char* src = map();
  char* dst = map();
  if (!src || !dst) {
    if (src) ::munmap(src, bytes);
    if (dst) ::munmap(dst, bytes);
    return 0;
  }
  std::memset(src, 7, bytes);
  std::memset(dst, 0, bytes);
  std::vector<double> gbps;
  for (int r = 0; r < reps + 2; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (uint64_t j = 0; j < batch; ++j)
      std::memcpy(dst + j * stride, src + j * stride, size);
    auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start);
    // Keep the copies from being optimized away.
    asm volatile("" : : "r"(dst) : "memory");
    if (r >= 2) gbps.push_back(static_cast<double>(size * batch) / ns.count());
  }
  ::munmap(src, bytes);
  ::munmap(dst, bytes);
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

Result<double> parse_torch_copy(const std::string& output) {
  const size_t at = output.find("torch-copy-gbps ");
  if (at == std::string::npos) {
    return FailedPrecondition("torch: " + (output.empty() ? std::string("no output") : output));
  }
  RDMABUF_ASSIGN_OR_RETURN(auto v, numbers_after(output, at + 16, 1, "the torch copy's output"));
  if (v[0] <= 0) return Internal("the torch copy reported no bandwidth");
  return v[0];
}

Result<double> run_torch_copy(uint64_t size, int device, int reps) {
  // clang-format off
  static constexpr const char* kScript = R"py(
import statistics, sys, time
try:
    import torch
except ImportError as e:
    print(f"no torch here ({e})")
    sys.exit(0)
if not torch.cuda.is_available():
    print("torch has no CUDA here")
    sys.exit(0)
size, device, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
src = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
torch.cuda.synchronize(device)
times = []
for _ in range(reps):
    start = time.perf_counter()
    dst.copy_(src)
    torch.cuda.synchronize(device)
    times.append(time.perf_counter() - start)
print(f"torch-copy-gbps {size / statistics.median(times) / 1e9:.3f}")
)py";
  // clang-format on
  const std::string interpreter = bench_python();
  if (!on_path(interpreter) && interpreter.find('/') == std::string::npos) {
    return FailedPrecondition(interpreter + " is not on PATH");
  }
  Child::Options options;
  options.quiet_stderr = true;
  RDMABUF_ASSIGN_OR_RETURN(Child child,
                           Child::spawn({interpreter, "-c", kScript, std::to_string(size),
                                         std::to_string(device), std::to_string(reps)},
                                        options));
  RDMABUF_ASSIGN_OR_RETURN(std::string output, child.read_all(std::chrono::minutes(5)));
  child.wait();
  while (!output.empty() && output.back() == '\n')
    output.pop_back();
  return parse_torch_copy(output);
}

}  // namespace rdmabuf::tool
