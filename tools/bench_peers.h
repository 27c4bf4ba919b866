// The systems rdmabuf bench measures beside rdmabuf, in the same run
// (BENCHMARKS.md): iperf3 and qperf for raw TCP, ucx_perftest over TCP and
// shared memory, perftest on an RDMA device, and a plain memcpy for the
// memory-copy limit. Each runner starts the tool's server and client on
// loopback and returns the client's figure; each parser takes the client's
// whole output and fails with kInternal, saying what it expected, when the
// output is not what that tool prints.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmabuf/backend.h"
#include "rdmabuf/status.h"

namespace rdmabuf::tool {

// What ucx_perftest's "Final:" line reports.
struct UcxFigure {
  double p50_us = 0;     // the median time of one iteration
  double gbps = 0;       // overall bandwidth, 1e9 bytes per second
  double ops_per_s = 0;  // overall message rate
};

// iperf3 on loopback with `streams` parallel streams for `seconds`, each
// write and read of `length` bytes (0: iperf3's default; at most
// kIperf3MaxLength): GB/s received (1e9 bytes per second).
constexpr uint64_t kIperf3MaxLength = 1 << 20;
Result<double> run_iperf3(int streams, int seconds, uint64_t length = 0);
Result<double> parse_iperf3_json(const std::string& output);

// qperf's "tcp_bw" (GB/s) or "tcp_lat" (one-way latency in microseconds,
// half a round trip, as qperf reports it) with messages of `size` bytes,
// for `seconds`.
Result<double> run_qperf(const std::string& test, uint64_t size, int seconds);
// `output` of a qperf client run with -uu (bytes/sec, ns).
Result<double> parse_qperf(const std::string& test, const std::string& output);

// ucx_perftest test `test` ("ucp_get", "ucp_put_bw", "ucp_put_lat") of
// `size` bytes, `iterations` times, between two processes on this host with
// UCX_TLS `transports` (e.g. "posix,sysv,self" or "tcp,self").
Result<UcxFigure> run_ucx_perftest(const std::string& test, uint64_t size, int iterations,
                                   const std::string& transports);
// The same with `env` set in both processes (UCX_TLS, UCX_NET_DEVICES, ...),
// giving up on a client that has not finished after `limit`; with
// `outstanding` > 0, that many ops in flight at once (-O).
using UcxEnv = std::vector<std::pair<std::string, std::string>>;
Result<UcxFigure> run_ucx_perftest(const std::string& test, uint64_t size, int iterations,
                                   const UcxEnv& env,
                                   std::chrono::seconds limit = std::chrono::seconds(120),
                                   int outstanding = 0);
Result<UcxFigure> parse_ucx_perftest(const std::string& output);

// The RDMA device, port and GID index the ibverbs backend of `backends`
// uses, for perftest and UCX to use the same; nullopt when it has none.
struct IbDevice {
  std::string name;  // "rxe0"
  int port = 1;
  int gid_index = 0;
};
std::optional<IbDevice> ibverbs_device(const std::vector<BackendInfo>& backends);

// perftest's `test` ("ib_read_bw", "ib_write_bw", "ib_send_bw", "ib_read_lat",
// "ib_send_lat") of `size` bytes, `iterations` times, between two processes
// on `device` (its port and GID index): GB/s for the bandwidth tests,
// the typical (median) latency in microseconds for the latency tests (a
// read's round trip for ib_read_lat, half a round trip for ib_send_lat).
Result<double> run_perftest(const std::string& test, const IbDevice& device, uint64_t size,
                            int iterations);
// Iterations of a perftest bandwidth test of `size`-byte messages: 16 MiB
// in all, 20 to 1000 of them (Soft-RoCE moves tens of MB/s).
int perftest_bandwidth_iterations(uint64_t size);
// `output` of a perftest client; bandwidth tests run with --report_gbits.
Result<double> parse_perftest(const std::string& test, const std::string& output);

// memcpy of `batch` ranges of `size` bytes laid out as the bench lays out
// its ops (range j at j * size; with `one_range`, all at 0), `reps` times
// after warm-up: median GB/s. 0 when the buffers cannot be mapped.
double measure_memcpy(uint64_t size, uint64_t batch, int reps, bool one_range = false);

// PyTorch's copy between two allocations of `size` bytes on GPU `device`
// in one process (`dst.copy_(src)`, then torch.cuda.synchronize()), `reps`
// times after warm-up: the median GB/s. Runs RDMABUF_BENCH_PYTHON (else
// python3); the error says why when torch or its CUDA is missing.
Result<double> run_torch_copy(uint64_t size, int device, int reps);
Result<double> parse_torch_copy(const std::string& output);

}  // namespace rdmabuf::tool
