// The parts of `rdmabuf bench --compare` that do not measure: the parsers
// of the peers' outputs (fed what those tools really print), the flat JSON
// reader for `rdmabuf bench --json` lines, medians, comparisons, the table,
// the JSON document and the plot; and the bench's --host-memory.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/bench_peers.h"
#include "tools/bench_plot.h"
#include "tools/bench_report.h"
#include "tools/host_memory.h"

namespace rdmabuf::tool {
namespace {

// iperf3 3.12 -J, the end of its report (trimmed).
constexpr const char* kIperf3Json = R"({
	"end":	{
		"sum_sent":	{ "bytes":	2295726080, "bits_per_second":	18355254368.7, "retransmits": 0 },
		"sum_received":	{
			"start":	0,
			"end":	1.000575,
			"seconds":	1.000575,
			"bytes":	2295726080,
			"bits_per_second":	18355254368.737976,
			"sender":	true
		}
	}
})";

TEST(BenchPeers, Iperf3JsonGivesReceivedGBps) {
  auto gbps = parse_iperf3_json(kIperf3Json);
  ASSERT_TRUE(gbps.ok()) << gbps.status().to_string();
  EXPECT_NEAR(*gbps, 18355254368.737976 / 8 / 1e9, 1e-9);
}

TEST(BenchPeers, Iperf3ErrorIsReportedNotParsedAsAFigure) {
  // iperf3 -J exits 0 with this when it cannot connect.
  auto gbps = parse_iperf3_json(
      "{\n\t\"start\":\t{},\n\t\"error\":\t\"unable to connect to server: Connection refused\"\n}");
  ASSERT_FALSE(gbps.ok());
  EXPECT_NE(gbps.status().message().find("unable to connect"), std::string::npos);
  EXPECT_FALSE(parse_iperf3_json("").ok());
  EXPECT_FALSE(parse_iperf3_json("{\"sum_received\": {\"bits_per_second\": 0}}").ok());
}

TEST(BenchPeers, QperfWithUnifiedUnits) {
  auto bw = parse_qperf("tcp_bw", "tcp_bw:\n    bw  =  1127915520 bytes/sec\n");
  ASSERT_TRUE(bw.ok()) << bw.status().to_string();
  EXPECT_DOUBLE_EQ(*bw, 1.12791552);
  auto lat = parse_qperf("tcp_lat", "tcp_lat:\n    latency  =  50584 ns\n");
  ASSERT_TRUE(lat.ok()) << lat.status().to_string();
  EXPECT_DOUBLE_EQ(*lat, 50.584);
  // Without -uu qperf picks its own units: refused, not misread.
  EXPECT_FALSE(parse_qperf("tcp_bw", "tcp_bw:\n    bw  =  932 MB/sec\n").ok());
  EXPECT_FALSE(parse_qperf("tcp_lat", "tcp_bw:\n    bw  =  1127915520 bytes/sec\n").ok());
  EXPECT_FALSE(parse_qperf("tcp_bw", "failed to connect\n").ok());
}

TEST(BenchPeers, UcxPerftestFinalLine) {
  // ucx_perftest 1.13, ucp_put_lat 8 B over tcp (header trimmed).
  const std::string out =
      "|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |\n"
      "+--------------+--------------+----------+---------+---------+----------+----------+\n"
      "Final:                  1000      7.465     7.876     7.876        0.97       0.97      "
      "126967      126967\n";
  auto f = parse_ucx_perftest(out);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_DOUBLE_EQ(f->p50_us, 7.465);
  EXPECT_NEAR(f->gbps, 0.97 * 1048576 / 1e9, 1e-12);
  EXPECT_DOUBLE_EQ(f->ops_per_s, 126967);
  EXPECT_FALSE(parse_ucx_perftest("Final:   1000  7.4\n").ok());  // cut short
  EXPECT_FALSE(parse_ucx_perftest("[thread 0] 952 1100.6 1051.3\n").ok());
}

// ucx_perftest 1.13.1 over shared memory (UCX_TLS=posix,sysv,self), the
// client's whole output, as `rdmabuf bench --backend memory` runs it.
constexpr const char* kUcxTable =
    "+--------------+--------------+------------------------------+---------------------+"
    "-----------------------+\n"
    "|              |              |        latency (usec)        |   bandwidth (MB/s)  |"
    "  message rate (msg/s) |\n"
    "+--------------+--------------+----------+---------+---------+----------+----------+"
    "-----------+-----------+\n"
    "|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |"
    "  average  |  overall  |\n"
    "+--------------+--------------+----------+---------+---------+----------+----------+"
    "-----------+-----------+\n";

TEST(BenchPeers, UcxPerftestOverSharedMemory) {
  // -t ucp_get -s 8 -n 10000: the median time of one get, gets one at a
  // time (beside the 8 B read latency row).
  auto get = parse_ucx_perftest(
      std::string(kUcxTable) +
      "Final:                 10000      0.075     0.078     0.078       97.95      97.95    "
      "12838396    12838396\n");
  ASSERT_TRUE(get.ok()) << get.status().to_string();
  EXPECT_DOUBLE_EQ(get->p50_us, 0.075);
  EXPECT_DOUBLE_EQ(get->ops_per_s, 12838396);
  EXPECT_NEAR(get->gbps, 97.95 * 1048576 / 1e9, 1e-12);

  // -t ucp_put_lat -s 8 -n 10000: a ping-pong; UCX prints half the round
  // trip (beside the 8 B write latency row, as printed).
  auto put_lat = parse_ucx_perftest(
      std::string(kUcxTable) +
      "Final:                 10000      0.286     0.316     0.316       24.15      24.15     "
      "3165990     3165990\n");
  ASSERT_TRUE(put_lat.ok()) << put_lat.status().to_string();
  EXPECT_DOUBLE_EQ(put_lat->p50_us, 0.286);

  // -t ucp_put_bw -s 64 -n 100000: the message rate beside the rate rows.
  auto put_bw = parse_ucx_perftest(
      std::string(kUcxTable) +
      "Final:                100000      0.051     0.056     0.056     1091.27    1091.27    "
      "17879296    17879296\n");
  ASSERT_TRUE(put_bw.ok()) << put_bw.status().to_string();
  EXPECT_DOUBLE_EQ(put_bw->ops_per_s, 17879296);
  EXPECT_NEAR(put_bw->gbps, 1091.27 * 1048576 / 1e9, 1e-12);

  // The table without its Final line (a client cut short) is no figure.
  EXPECT_FALSE(parse_ucx_perftest(kUcxTable).ok());
}

TEST(BenchHostMemory, ParsesSharedAndPrivateOnly) {
  auto shared = parse_host_memory("shared");
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(*shared, HostMemory::kShared);
  auto priv = parse_host_memory("private");
  ASSERT_TRUE(priv.ok());
  EXPECT_EQ(*priv, HostMemory::kPrivate);
  EXPECT_STREQ(host_memory_name(HostMemory::kShared), "shared");
  EXPECT_STREQ(host_memory_name(HostMemory::kPrivate), "private");
  for (const char* bad : {"", "Shared", "anonymous", "shared,private"}) {
    auto parsed = parse_host_memory(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("--host-memory"), std::string::npos);
  }
}

TEST(BenchHostMemory, PrivateMemoryIsZeroedAndOwned) {
  const size_t size = 3 * 4096 + 5;
  auto memory = allocate_host_memory(size, HostMemory::kPrivate);
  ASSERT_TRUE(memory.ok()) << memory.status().to_string();
  EXPECT_EQ(memory->size(), size);
  EXPECT_EQ(memory->kind(), MemoryKind::kHost);
  EXPECT_NE(memory->keepalive(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(memory->data()) % 4096, 0u);
  for (std::byte b : memory->span())
    ASSERT_EQ(b, std::byte{0});
  memory->data()[size - 1] = std::byte{7};  // writable to its last byte
  EXPECT_EQ(allocate_host_memory(0, HostMemory::kPrivate).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(BenchPeers, PerftestBandwidthAndLatency) {
  const std::string bw =
      "-------------------------------------------------------------------------------\n"
      " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
      " 65536      1000             0.52               0.48               0.000977\n";
  auto gbps = parse_perftest("ib_read_bw", bw);
  ASSERT_TRUE(gbps.ok()) << gbps.status().to_string();
  EXPECT_DOUBLE_EQ(*gbps, 0.48 / 8);
  const std::string lat =
      " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n"
      " 8       1000          70.12          300.50       87.50              90.01\n";
  auto us = parse_perftest("ib_read_lat", lat);
  ASSERT_TRUE(us.ok()) << us.status().to_string();
  EXPECT_DOUBLE_EQ(*us, 87.5);
  EXPECT_FALSE(parse_perftest("ib_read_bw", " Couldn't connect to 127.0.0.1:18515\n").ok());
}

// ib_send_lat's table, as it printed it in the Soft-RoCE VM: half a round
// trip's typical time, the figure beside an endpoint message's one way.
TEST(BenchPeers, PerftestSendLatency) {
  const std::string lat =
      " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
      "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
      " 8       2000          9.65           157.89       10.50    \t       11.52       \t5.88   "
      "\t\t34.24   \t\t144.33 \n";
  auto us = parse_perftest("ib_send_lat", lat);
  ASSERT_TRUE(us.ok()) << us.status().to_string();
  EXPECT_DOUBLE_EQ(*us, 10.5);
}

// perftest runs on the device and GID index the ibverbs backend reports it
// uses; no ibverbs backend (or no device in use) gives none.
TEST(BenchPeers, IbverbsDeviceFromTheBackendsDetails) {
  BackendInfo tcp;
  tcp.name = "tcp";
  tcp.details = {{"using", "lo"}};
  BackendInfo ibverbs;
  ibverbs.name = "ibverbs";
  ibverbs.details = {{"device", "rxe0"},
                     {"using",
                      "rxe0 port 1 (RoCE, active, MTU 1024), GID[1] ::ffff:10.0.2.15 "
                      "(RoCE v2)"}};
  auto device = ibverbs_device({tcp, ibverbs});
  ASSERT_TRUE(device.has_value());
  EXPECT_EQ(device->name, "rxe0");
  EXPECT_EQ(device->port, 1);
  EXPECT_EQ(device->gid_index, 1);
  EXPECT_FALSE(ibverbs_device({tcp}).has_value());
  ibverbs.details = {{"using", "mlx5_1 port 2 (RoCE, active, MTU 4096), GID[3] ::ffff:10.1.0.2"}};
  device = ibverbs_device({ibverbs});
  ASSERT_TRUE(device.has_value());
  EXPECT_EQ(device->name, "mlx5_1");
  EXPECT_EQ(device->port, 2);
  EXPECT_EQ(device->gid_index, 3);
  ibverbs.details = {{"device", "rxe0"}};
  EXPECT_FALSE(ibverbs_device({tcp, ibverbs}).has_value());
}

TEST(BenchReport, FlatJsonObject) {
  auto row = parse_flat_json_object(
      R"({"system":"rdmabuf","op":"read","size":4096,"gbps":1.5e0,"note":"a \"b\" \\ \u0041"})");
  ASSERT_TRUE(row.ok()) << row.status().to_string();
  EXPECT_EQ((*row)["system"], "rdmabuf");
  EXPECT_EQ((*row)["size"], "4096");
  EXPECT_EQ((*row)["gbps"], "1.5e0");
  EXPECT_EQ((*row)["note"], "a \"b\" \\ A");
  EXPECT_TRUE(parse_flat_json_object(" { } ").ok());
  for (const char* bad :
       {"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":[1]}", "{\"a\":{\"b\":1}}",
        "{\"a\":1} x", "{\"a\":\"\\u00zz\"}", "{\"a\":\"open}"}) {
    EXPECT_FALSE(parse_flat_json_object(bad).ok()) << bad;
  }
}

TEST(BenchReport, JsonQuoteRoundTrips) {
  const std::string text = "tab\there \"quoted\" back\\slash \x01";
  auto row = parse_flat_json_object("{\"k\":" + json_quote(text) + "}");
  ASSERT_TRUE(row.ok()) << row.status().to_string();
  EXPECT_EQ((*row)["k"], text);
}

Figure bandwidth(const std::string& system, const std::string& op, uint64_t size, double gbps) {
  Figure f = Figure::of(system, "bandwidth", op, size);
  f.gbps = gbps;
  return f;
}

TEST(BenchReport, MedianOfRunsPerSystemKindOpAndSize) {
  std::vector<Figure> runs = {
      bandwidth("rdmabuf tcp", "read", 4096, 1), bandwidth("rdmabuf tcp", "read", 4096, 9),
      bandwidth("rdmabuf tcp", "read", 4096, 2), bandwidth("rdmabuf tcp", "write", 4096, 5),
      bandwidth("qperf", "stream", 4096, 3),     bandwidth("qperf", "stream", 4096, 4)};
  auto m = median_of_runs(runs);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].gbps, 2);  // 1, 2, 9
  EXPECT_EQ(m[0].runs, 3);
  EXPECT_EQ(m[1].gbps, 5);
  EXPECT_EQ(m[2].gbps, 3.5);  // an even count: the mean of the middle two
}

TEST(BenchReport, ComparesLikeWithLikeAndLatencyTheRightWayUp) {
  Figure lat_rdmabuf = Figure::of("rdmabuf tcp", "latency", "read", 8);
  lat_rdmabuf.p50_us = 10;
  Figure lat_peer = Figure::of("qperf", "latency", "stream", 8);
  lat_peer.p50_us = 80;
  std::vector<Figure> figures = {bandwidth("rdmabuf tcp", "read", 4096, 2),
                                 bandwidth("rdmabuf tcp", "write", 4096, 3),
                                 bandwidth("iperf3 -P 2", "stream", 4096, 4),
                                 bandwidth("UCX tcp", "read", 4096, 1),
                                 bandwidth("UCX tcp", "write", 65536, 1),
                                 bandwidth("UCX shm", "read", 4096, 100),
                                 lat_rdmabuf,
                                 lat_peer};
  auto peers = peers_by_backend(2, "perftest");
  auto c = compare(figures, peers);
  // read 4K: iperf3 (stream) and UCX tcp (read); write 4K: iperf3 only
  // (UCX tcp's write is at another size); never UCX shm beside tcp.
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].peer, "iperf3 -P 2");
  EXPECT_DOUBLE_EQ(c[0].speedup, 0.5);
  EXPECT_EQ(c[1].peer, "UCX tcp");
  EXPECT_DOUBLE_EQ(c[1].speedup, 2);
  EXPECT_EQ(c[2].op, "write");
  EXPECT_DOUBLE_EQ(c[2].speedup, 0.75);
  EXPECT_EQ(c[3].kind, "latency");
  EXPECT_DOUBLE_EQ(c[3].speedup, 8);  // 80 us against 10 us: rdmabuf 8x faster

  RunInfo info{"2026-11-22 12:00 UTC", "test machine", "rdmabuf bench --compare", "0.1.0", 3, 20};
  std::vector<Skipped> skipped = {{"UCX shm", "ucx_perftest is not installed"}};
  std::string table = render_table(info, figures, c, peers, skipped);
  EXPECT_NE(table.find("== rdmabuf over tcp =="), std::string::npos) << table;
  EXPECT_NE(table.find("4.000 x0.50"), std::string::npos) << table;
  EXPECT_NE(table.find("80.0 x8.00"), std::string::npos) << table;
  EXPECT_NE(table.find("UCX shm: ucx_perftest is not installed"), std::string::npos) << table;

  std::string json = render_json(info, figures, c, skipped);
  EXPECT_NE(json.find("\"speedup\": 8"), std::string::npos) << json;
  EXPECT_NE(json.find("\"date\": \"2026-11-22 12:00 UTC\""), std::string::npos) << json;

  auto panels = bandwidth_panels(figures);
  ASSERT_EQ(panels.size(), 2u);
  // read: rdmabuf tcp, iperf3 (stream), UCX tcp, UCX shm; write: rdmabuf, iperf3, UCX tcp.
  EXPECT_EQ(panels[0].series.size(), 4u);
  EXPECT_EQ(panels[1].series.size(), 3u);
  EXPECT_TRUE(panels[0].series[0].rdmabuf);
  EXPECT_FALSE(panels[0].series[1].rdmabuf);
}

TEST(BenchPlot, SvgHasOneLinePerSeriesAndEscapesText) {
  std::vector<PlotPanel> panels = {{"read",
                                    {{"rdmabuf <tcp>", true, {{4096, 1.0}, {1 << 20, 3.0}}},
                                     {"peer & co", false, {{4096, 0.5}, {1 << 20, 2.0}}}}},
                                   {"write", {}}};
  std::string svg = render_bandwidth_svg("title", "machine", panels);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("rdmabuf &lt;tcp&gt;"), std::string::npos);
  EXPECT_NE(svg.find("peer &amp; co"), std::string::npos);
  EXPECT_EQ(svg.find("<tcp>"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 2u);
  // Nothing to draw is not a crash.
  EXPECT_NE(render_bandwidth_svg("t", "s", {}).find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace rdmabuf::tool
