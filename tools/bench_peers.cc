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

// A free loopback port (the peer binds it right after: a benign race).
Result<std::string> free_port() {
  RDMABUF_ASSIGN_OR_RETURN(Fd listener, listen_tcp(HostPort{"127.0.0.1", 0}, 1));
  RDMABUF_ASSIGN_OR_RETURN(HostPort bound, local_address(listener.get()));
  return std::to_string(bound.port);
}

}  // namespace

Result<double> run_iperf3(int streams, int seconds) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  Child::Options quiet;
  quiet.capture_stdout = false;
  quiet.quiet_stderr = true;
  RDMABUF_ASSIGN_OR_RETURN(Child server, Child::spawn({"iperf3", "-s", "-1", "-p", port}, quiet));
  for (int attempt = 0; attempt < 50; ++attempt) {
    Child::Options capture;
    capture.quiet_stderr = true;
    RDMABUF_ASSIGN_OR_RETURN(
        Child client, Child::spawn({"iperf3", "-c", "127.0.0.1", "-p", port, "-t",
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

Result<double> run_ucx_perftest(const std::string& test, uint64_t size, int iterations,
                                const std::string& transports) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  const std::vector<std::string> args = {
      "-p", port, "-t", test, "-s", std::to_string(size), "-n", std::to_string(iterations)};
  Child::Options server_options;
  server_options.capture_stdout = false;
  server_options.quiet_stderr = true;
  server_options.env = {{"UCX_TLS", transports}};
  std::vector<std::string> server_argv = {"ucx_perftest"};
  server_argv.insert(server_argv.end(), args.begin(), args.end());
  RDMABUF_ASSIGN_OR_RETURN(Child server, Child::spawn(server_argv, server_options));
  for (int attempt = 0; attempt < 50; ++attempt) {
    Child::Options client_options;
    client_options.quiet_stderr = true;
    client_options.env = {{"UCX_TLS", transports}};
    std::vector<std::string> client_argv = {"ucx_perftest", "127.0.0.1"};
    client_argv.insert(client_argv.end(), args.begin(), args.end());
    RDMABUF_ASSIGN_OR_RETURN(Child client, Child::spawn(client_argv, client_options));
    auto out = client.read_all(std::chrono::seconds(120));
    int rc = client.wait();
    size_t at = out.ok() ? out->find("Final:") : std::string::npos;
    if (rc == 0 && at != std::string::npos) {
      // Final: iterations, latency p50/avg/overall (us), bandwidth avg/overall
      // (MB/s, MB = 2^20 bytes), message rate avg/overall.
      std::istringstream fields(out->substr(at + 6));
      double v[8] = {};
      for (double& x : v)
        fields >> x;
      server.terminate();
      if (!fields) return Internal("cannot parse ucx_perftest's output");
      return v[5] * 1048576.0 / 1e9;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // server not up yet
  }
  return Unavailable("ucx_perftest did not run");
}

Result<double> run_perftest(const std::string& test, const std::string& device, int gid_index,
                            uint64_t size, int iterations) {
  RDMABUF_ASSIGN_OR_RETURN(std::string port, free_port());
  std::vector<std::string> args = {test,
                                   "-d",
                                   device,
                                   "-x",
                                   std::to_string(gid_index),
                                   "-s",
                                   std::to_string(size),
                                   "-n",
                                   std::to_string(iterations),
                                   "-p",
                                   port};
  const bool latency = test.find("_lat") != std::string::npos;
  if (!latency) args.push_back("--report_gbits");  // Gb/s, 1e9 bits: no MiB ambiguity
  Child::Options server_options;
  server_options.capture_stdout = false;
  server_options.quiet_stderr = true;
  RDMABUF_ASSIGN_OR_RETURN(Child server, Child::spawn(args, server_options));
  args.push_back("127.0.0.1");
  for (int attempt = 0; attempt < 50; ++attempt) {
    Child::Options client_options;
    client_options.quiet_stderr = true;
    RDMABUF_ASSIGN_OR_RETURN(Child client, Child::spawn(args, client_options));
    auto out = client.read_all(std::chrono::seconds(300));
    int rc = client.wait();
    if (rc == 0 && out.ok()) {
      // The figures follow the header line that starts with " #bytes".
      size_t at = out->find("#bytes");
      if (at != std::string::npos) at = out->find('\n', at);
      if (at == std::string::npos) return Internal("cannot parse " + test + "'s output");
      std::istringstream fields(out->substr(at + 1));
      double v[5] = {};
      for (double& x : v)
        fields >> x;
      server.terminate();
      if (!fields) return Internal("cannot parse " + test + "'s output");
      // bw: bytes, iterations, peak, average (Gb/s), msg rate.
      // lat: bytes, iterations, min, max, typical (us), ...
      return latency ? v[4] : v[3] / 8;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // server not up yet
  }
  return Unavailable(test + " did not run");
}

double measure_memcpy(uint64_t size, uint64_t batch, int reps) {
  const size_t bytes = size * batch;
  auto map = [bytes] {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  };
  char* src = map();
  char* dst = map();
  if (!src || !dst) return 0;
  std::memset(src, 7, bytes);
  std::memset(dst, 0, bytes);
  std::vector<double> gbps;
  for (int r = 0; r < reps + 2; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (uint64_t j = 0; j < batch; ++j)
      std::memcpy(dst + j * size, src + j * size, size);
    auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start);
    // Keep the copies from being optimized away.
    asm volatile("" : : "r"(dst) : "memory");
    if (r >= 2) gbps.push_back(static_cast<double>(bytes) / ns.count());
  }
  ::munmap(src, bytes);
  ::munmap(dst, bytes);
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace rdmabuf::tool
