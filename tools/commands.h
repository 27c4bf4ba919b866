// The subcommands of the rdmabuf tool; each returns the process exit code.
#pragma once

namespace rdmabuf::tool {

int cmd_info(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_read(int argc, char** argv);
int cmd_write(int argc, char** argv);
int cmd_bench(int argc, char** argv);
// `rdmabuf bench --compare`: rdmabuf beside iperf3, qperf, UCX and perftest.
int cmd_bench_compare(int argc, char** argv);
// `rdmabuf bench --op send`: Endpoint messages beside UCX's tagged messages
// (over ibverbs, also beside perftest's ib_send_lat / ib_send_bw); `--op
// notify`: tagged writes and their notifications beside UCX's ucp_put_lat
// (over ibverbs, also perftest's ib_write_lat).
int cmd_bench_send(int argc, char** argv);
// `rdmabuf bench --pattern`: collective patterns across ranks and hosts
// beside torch.distributed's gloo (the Python module rdmabuf.bench_patterns).
int cmd_bench_patterns(int argc, char** argv);
// bench --gpu (bench_gpu.cc)
int cmd_bench_gpu(int argc, char** argv);
int cmd_soak(int argc, char** argv);

}  // namespace rdmabuf::tool
