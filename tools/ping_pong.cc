// rdmabuf_ping_pong: the client half of an endpoint ping-pong, for counting
// the library's instructions per message (scripts/count-instructions.sh).
//
//   rdmabuf_ping_pong ADDRESS [SIZE] [TRIPS]
//
// Connects to ADDRESS (`rdmabuf serve --endpoint` echoes what it is sent),
// posts 16 receives of SIZE bytes (default 8) for the echoes, then TRIPS
// times (default 20000): sends SIZE bytes, posts again the receive the last
// echo took, and waits for the echo, as `rdmabuf bench --op send` measures
// latency, after 1000 warm-up trips. Prints "trips N" and the
// one-way time: median, 90th and 99th percentiles and mean (a mean far above
// the median says some trips slept), then the 1st, 10th and 25th
// percentiles (the floor: a median that moved with its floor says every
// trip got slower, one that moved alone says more trips were slow); exits
// non-zero on any error. Not installed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "rdmabuf/rdmabuf.h"
#include "tools/bench_report.h"
#include "tools/echo_receives.h"
#include "tools/trip_clock.h"

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);  // valgrind is slow

constexpr long kWarmUp = 1000;

// `trips` round trips, the echoes landing in `echoes`' receives; each one's
// half in µs goes into `one_way_us`.
rdmabuf::Status round_trips(rdmabuf::Endpoint& endpoint, const rdmabuf::LocalMemory& ping,
                            rdmabuf::tool::EchoReceives& echoes, long trips,
                            const rdmabuf::tool::TripClock& clock,
                            std::vector<double>& one_way_us) {
  auto start = clock.now();  // of the next trip: where the last one ended (one read a trip)
  for (long i = 0; i < trips; ++i) {
    RDMABUF_RETURN_IF_ERROR(endpoint.send(ping, kTimeout));
    auto echo = echoes.next();
    if (!echo.ok()) return echo.status().with_context("posting a receive");
    auto echoed = echo->wait(kTimeout);
    if (!echoed.ok()) return echoed.status().with_context("waiting for the echo");
    const auto end = clock.now();
    one_way_us.push_back(clock.micros(start, end) / 2);
    start = end;
  }
  return rdmabuf::Status::Ok();
}

// The trips that count: scripts/count-instructions.sh counts only inside
// this function (callgrind --toggle-collect), so it stays one of its own.
[[gnu::noinline]] rdmabuf::Status measured_round_trips(rdmabuf::Endpoint& endpoint,
                                                       const rdmabuf::LocalMemory& ping,
                                                       rdmabuf::tool::EchoReceives& echoes,
                                                       long trips,
                                                       const rdmabuf::tool::TripClock& clock,
                                                       std::vector<double>& one_way_us) {
  return round_trips(endpoint, ping, echoes, trips, clock, one_way_us);
}

int fail(const char* what, const rdmabuf::Status& status) {
  std::fprintf(stderr, "rdmabuf_ping_pong: %s: %s\n", what, status.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: rdmabuf_ping_pong ADDRESS [SIZE] [TRIPS]\n");
    return 2;
  }
  const size_t size = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8;
  const long trips = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 20000;
  if (size == 0 || trips <= 0) {
    std::fprintf(stderr, "rdmabuf_ping_pong: SIZE and TRIPS must be > 0\n");
    return 2;
  }
  auto manager = rdmabuf::Manager::create();
  if (!manager.ok()) return fail("creating the manager", manager.status());
  auto connected = (*manager)->connect(argv[1], kTimeout);
  if (!connected.ok()) return fail("connecting", connected.status());
  rdmabuf::Endpoint& endpoint = **connected;
  auto ping = rdmabuf::LocalMemory::allocate(size);
  auto pong = rdmabuf::LocalMemory::allocate(size);
  if (!ping.ok()) return fail("allocating", ping.status());
  if (!pong.ok()) return fail("allocating", pong.status());
  std::memset(ping->data(), 'E', size);  // 'E': the server echoes it

  // Warm-up trips first (connection set-up, first touches, the peer's
  // first receives), outside the function whose instructions count.
  const rdmabuf::tool::TripClock clock;
  std::vector<double> one_way_us;
  auto echoes = rdmabuf::tool::EchoReceives::post(endpoint, *pong);
  if (!echoes.ok()) return fail("posting receives", echoes.status());
  rdmabuf::Status warm = round_trips(endpoint, *ping, *echoes, kWarmUp, clock, one_way_us);
  if (!warm.ok()) return fail("warming up", warm);
  one_way_us.clear();
  one_way_us.reserve(static_cast<size_t>(trips));
  rdmabuf::Status done = measured_round_trips(endpoint, *ping, *echoes, trips, clock, one_way_us);
  if (!done.ok()) return fail("ping-pong", done);
  using rdmabuf::tool::percentile;  // nearest rank, as the bench reports
  const double mean_us =
      std::accumulate(one_way_us.begin(), one_way_us.end(), 0.0) / static_cast<double>(trips);
  std::printf("trips %ld\nmedian one way %.3f us (channel: %s)\n", trips,
              percentile(one_way_us, 50), endpoint.channel().c_str());
  std::printf("p90 %.3f us, p99 %.3f us, mean %.3f us\n", percentile(one_way_us, 90),
              percentile(one_way_us, 99), mean_us);
  std::printf("p1 %.3f us, p10 %.3f us, p25 %.3f us\n", percentile(one_way_us, 1),
              percentile(one_way_us, 10), percentile(one_way_us, 25));
  return 0;
}
