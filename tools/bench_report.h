// The figures of `rdmabuf bench --compare` and what is made of them: the
// table of rdmabuf against each peer, the JSON file and the plot's panels.
// Nothing here measures; tools/bench_compare.cc does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rdmabuf/status.h"
#include "tools/bench_plot.h"

namespace rdmabuf::tool {

// One measured point of one system.
struct Figure {
  std::string system;  // "rdmabuf tcp", "iperf3 -P 2", "qperf", "UCX shm", "perftest", ...
  std::string kind;    // "bandwidth", "latency", "rate", "setup"
  // "read" or "write"; "stream" for systems without a direction (iperf3,
  // qperf, memcpy), which stand beside both; for setup, what was timed
  // ("first_transfer", "register_first", "register_again").
  std::string op;
  uint64_t size = 0;
  double gbps = 0;       // bandwidth: 1e9 bytes per second
  double p50_us = 0;     // latency and setup: microseconds for one round trip
  double p99_us = 0;     // 0 when the system does not report it
  double ops_per_s = 0;  // rate
  int runs = 1;          // how many runs the figure is the median of
  std::string note;      // how a peer's figure was derived, when not as printed

  // A figure with its identity set and no values yet.
  static Figure of(std::string system, std::string kind, std::string op, uint64_t size) {
    Figure f;
    f.system = std::move(system);
    f.kind = std::move(kind);
    f.op = std::move(op);
    f.size = size;
    return f;
  }
};

// The figure that stands for a kind of measurement: GB/s, µs or ops/s.
double headline(const Figure& f);

// The nearest-rank `p`th percentile of `v` (0 when empty).
double percentile(std::vector<double> v, double p);

// One figure per (system, kind, op, size): the median of the runs of each.
std::vector<Figure> median_of_runs(const std::vector<Figure>& runs);

// A system that was not measured, and why.
struct Skipped {
  std::string system;
  std::string why;
};

// rdmabuf over one backend beside one peer, for one measurement.
struct Comparison {
  std::string backend;
  std::string peer;
  std::string kind;
  std::string op;
  uint64_t size = 0;
  double rdmabuf = 0;  // headline figures
  double peer_figure = 0;
  // How many times faster rdmabuf is: rdmabuf / peer for bandwidth and
  // rate, peer / rdmabuf for latency. Above 1: rdmabuf is faster.
  double speedup = 0;
};

// The peers each backend is compared with: the systems that move bytes
// the same way (tcp: raw TCP and UCX over TCP; memory: UCX over shared
// memory and memcpy; ibverbs: perftest).
std::map<std::string, std::vector<std::string>> peers_by_backend(int tcp_streams,
                                                                 const std::string& perftest);

// rdmabuf's figures ("rdmabuf BACKEND") beside each peer's for the same
// kind, size and op (a "stream" peer stands beside read and write).
std::vector<Comparison> compare(const std::vector<Figure>& figures,
                                const std::map<std::string, std::vector<std::string>>& peers);

// What the run was, for the report's header and the JSON file.
struct RunInfo {
  std::string date;     // UTC, ISO 8601
  std::string machine;  // CPU model, cores, memory, kernel, OS
  std::string command;  // to reproduce it
  std::string version;
  int rounds = 0;
  int rdmabuf_reps = 0;
};

// The table people read: per backend, one block per kind, rdmabuf's figure
// and each peer's with the speedup.
std::string render_table(const RunInfo& info, const std::vector<Figure>& figures,
                         const std::vector<Comparison>& comparisons,
                         const std::map<std::string, std::vector<std::string>>& peers,
                         const std::vector<Skipped>& skipped);

// Everything as one JSON document.
std::string render_json(const RunInfo& info, const std::vector<Figure>& figures,
                        const std::vector<Comparison>& comparisons,
                        const std::vector<Skipped>& skipped);

// Bandwidth against size: a read panel and a write panel, one line per
// system ("stream" systems in both).
std::vector<PlotPanel> bandwidth_panels(const std::vector<Figure>& figures);

// A JSON string literal for `text`.
std::string json_quote(std::string_view text);

// The members of one flat JSON object (`{"a":"x","b":1.5}`): strings
// unescaped, numbers and literals as written. For the lines `rdmabuf bench
// --json` prints; nested objects and arrays are refused.
Result<std::map<std::string, std::string>> parse_flat_json_object(std::string_view text);

}  // namespace rdmabuf::tool
