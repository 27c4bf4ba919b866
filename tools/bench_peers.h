// The systems rdmabuf bench measures beside rdmabuf, in the same run
// (BENCHMARKS.md): iperf3 for raw TCP, ucx_perftest over shared memory,
// and a plain memcpy for the memory-copy limit.
#pragma once

#include <cstdint>
#include <string>

#include "rdmabuf/status.h"

namespace rdmabuf::tool {

// iperf3 on loopback with `streams` parallel streams for `seconds`: GB/s
// received (1e9 bytes per second).
Result<double> run_iperf3(int streams, int seconds);

// ucx_perftest test `test` ("ucp_get", "ucp_put_bw") of `size` bytes,
// `iterations` times, between two processes on this host with UCX_TLS
// `transports` (e.g. "posix,sysv,self"): GB/s overall.
Result<double> run_ucx_perftest(const std::string& test, uint64_t size, int iterations,
                                const std::string& transports);

// perftest's `test` ("ib_read_bw", "ib_write_bw", "ib_read_lat") of `size`
// bytes, `iterations` times, between two processes on `device` (with GID
// index `gid_index`): GB/s for the bandwidth tests, the typical (median)
// latency in microseconds for ib_read_lat.
Result<double> run_perftest(const std::string& test, const std::string& device, int gid_index,
                            uint64_t size, int iterations);

// memcpy of `batch` ranges of `size` bytes laid out as the bench lays out
// its ops (range j at j * size), `reps` times after warm-up: median GB/s.
double measure_memcpy(uint64_t size, uint64_t batch, int reps);

}  // namespace rdmabuf::tool
