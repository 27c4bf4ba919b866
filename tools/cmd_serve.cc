// rdmabuf serve: register one buffer, print its handle, serve until killed;
// with --endpoint, also answer endpoints (for `rdmabuf bench --op send` and
// `--op notify`).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/host.h"
#include "common/sanitizers.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/host_memory.h"
#include "tools/pattern.h"
#include "tools/signals.h"

namespace rdmabuf::tool {
namespace {

// Receives kept posted on each endpoint: enough for senders in several
// threads to keep messages in flight.
constexpr size_t kPosted = 16;

// Under ThreadSanitizer each receive gets a buffer of its own. Shared
// buffers (below) are written by several one-sided writes at once (a
// stream's messages, over several connections): a race by design, which
// the benchmark accepts as tag_bw does, but which ThreadSanitizer reports.
#ifdef RDMABUF_UNDER_TSAN
constexpr bool kBufferPerReceive = true;
#else
constexpr bool kBufferPerReceive = false;
#endif

// Accepts endpoints until stopped and serves each with a thread that keeps
// kPosted receives of `max_message` bytes posted, in host memory of the
// kind `host_memory` names. The first message on an endpoint says what it
// is for: when its first byte is 'E', every message on that endpoint is
// sent back as it came (echoes, for latency); when it is 'N' and a handle
// (RemoteBuffer::to_bytes) of the peer's, every notification of a tagged
// write into `served` is answered by a tagged write of as many bytes, with
// the same tag, into the front of that handle's buffer (for --op notify);
// else every message is dropped, its bytes never read (for bandwidth:
// later messages land in the same memory meanwhile, and a byte read then
// would race with them).
//
// The receives share two buffers, taking turns (as the receives of
// ucx_perftest's tag_bw share one): the benchmark compares transports, not
// how fast the host's memory takes 16 cold buffers. Two, not one, as every
// figure of the bench was taken with two: a receive posted again
// before its echo went (as over TCP and RDMA before credits were held
// through a wait) would, with one buffer, have the next message land in
// the memory the echo is sent from, as far as ThreadSanitizer can tell (it
// does not see the order the socket gives). The first receive has a buffer
// of its own, so that its first byte is read while nothing else can land
// there.
class EndpointServer {
 public:
  EndpointServer(Manager& manager, LocalMemory served, std::unique_ptr<EndpointListener> listener,
                 uint64_t max_message, HostMemory host_memory)
      : manager_(manager),
        served_(std::move(served)),
        listener_(std::move(listener)),
        max_message_(max_message),
        host_memory_(host_memory) {
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~EndpointServer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (auto& endpoint : endpoints_)
        endpoint->close();  // the receivers' calls end
    }
    listener_->close();  // the acceptor's accept returns kCancelled
    acceptor_.join();
    for (std::thread& t : receivers_)
      t.join();
  }

 private:
  // One accept at a time, each as long as it takes, until close() wakes
  // it: no polling.
  void accept_loop() {
    while (true) {
      auto endpoint = listener_->accept(std::chrono::hours(24));
      std::lock_guard lock(mu_);
      if (stopping_ || endpoint.status().code() == StatusCode::kCancelled) return;
      if (!endpoint.ok()) continue;
      Endpoint* e = endpoint->get();
      endpoints_.push_back(std::move(endpoint).value());
      receivers_.emplace_back([this, e] { serve(*e); });
    }
  }

  void serve(Endpoint& endpoint) {
    auto first = allocate_host_memory(max_message_, host_memory_);
    auto even = allocate_host_memory(max_message_, host_memory_);
    auto odd = allocate_host_memory(max_message_, host_memory_);
    if (!first.ok() || !even.ok() || !odd.ok()) return;
    std::vector<LocalMemory> buffers;
    for (size_t i = 0; i < kPosted; ++i) {  // kPosted is even: message n lands in buffer n % 2
      auto own = kBufferPerReceive ? allocate_host_memory(max_message_, host_memory_)
                                   : (i % 2 == 0 ? even : odd);
      if (!own.ok()) return;
      buffers.push_back(*own);
    }
    std::vector<LocalMemory> in_slot = buffers;  // what each posted receive fills
    in_slot[0] = *first;
    std::vector<PendingReceive> posted;
    for (size_t i = 0; i < kPosted; ++i) {
      auto receive = endpoint.post_receive(in_slot[i]);
      if (!receive.ok()) return;
      posted.push_back(std::move(receive).value());
    }
    // Receives are filled in the order they were posted: wait for each in
    // turn, and post it again once its message is dealt with: after the
    // echo, so that posting is not on the way from a message to its echo.
    // The client still holds the credits of the other receives, so over
    // TCP or RDMA the endpoint holds the new one back through the wait, for
    // the next echo to carry (one send, not two; Endpoint::post_receive),
    // unless the endpoint's server sends it first at one of its looks,
    // every few milliseconds; through shared memory it goes while the
    // server waits.
    std::optional<bool> echoes;  // what the endpoint is for, once its first message came
    for (size_t i = 0;; i = (i + 1) % kPosted) {
      auto size = posted[i].wait(std::chrono::hours(24));
      if (!size.ok() && size.status().code() != StatusCode::kDeadlineExceeded &&
          size.status().code() != StatusCode::kInvalidArgument) {
        return;  // closed (an idle day or a message too large: go on)
      }
      const LocalMemory& into = in_slot[i];
      if (!echoes && size.ok() && *size > 0 && into.data()[0] == std::byte{'N'}) {
        auto theirs = RemoteBuffer::from_bytes(
            {reinterpret_cast<const uint8_t*>(into.data()) + 1, static_cast<size_t>(*size - 1)});
        if (theirs.ok()) answer_notifications(endpoint, *theirs);
        return;
      }
      if (!echoes && size.ok()) echoes = *size > 0 && into.data()[0] == std::byte{'E'};
      const bool echo = size.ok() && echoes.value_or(false);
      // The echo goes from `into` itself (the send is done before the
      // receive is posted again), sliced only when the message was shorter:
      // a message that fills its receive costs no reference counting.
      const LocalMemory* message = &into;
      std::optional<LocalMemory> shorter;
      if (echo && *size < into.size()) {
        auto sliced = into.slice(0, *size);
        if (!sliced.ok()) return;
        shorter = std::move(sliced).value();
        message = &*shorter;
      }
      auto post_again = [&] {
        auto again = endpoint.post_receive(buffers[i]);
        if (!again.ok()) return false;
        posted[i] = std::move(again).value();
        if (i == 0) in_slot[0] = buffers[0];  // the first receive's own buffer is done with
        return true;
      };
      if (echo && !endpoint.send(*message, std::chrono::seconds(60)).ok()) return;
      if (!post_again()) return;
    }
  }

  // Answers each notification with a tagged write back into `theirs`, until
  // the endpoint ends or the server stops.
  void answer_notifications(Endpoint& endpoint, const RemoteBuffer& theirs) {
    while (!stopping_.load()) {
      auto n = manager_.next_notification(std::chrono::milliseconds(100));
      if (!n.ok()) {
        if (n.status().code() == StatusCode::kDeadlineExceeded) continue;
        return;
      }
      auto from = served_.slice(n->offset, n->length);
      auto into = theirs.slice(0, n->length);
      if (!from.ok() || !into.ok()) return;
      if (!endpoint.write(*into, *from, n->tag, std::chrono::seconds(60)).ok()) return;
    }
  }

  Manager& manager_;
  const LocalMemory served_;
  std::unique_ptr<EndpointListener> listener_;
  const uint64_t max_message_;
  const HostMemory host_memory_;
  std::mutex mu_;
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::vector<std::thread> receivers_;
  std::thread acceptor_;
};

constexpr const char* kHelp = R"(usage: rdmabuf serve [--size BYTES] [--pattern seq|zero|random]
                     [--gpu N] [--host-memory shared|private]
                     [--listen HOST:PORT] [--endpoint]

Registers one buffer, prints its handle on one line of stdout, and serves
it until SIGINT, SIGTERM or SIGHUP. Pass the handle to `rdmabuf read`,
`rdmabuf write` or `rdmabuf bench --connect`.

options:
  --size BYTES        bytes in the buffer (default 64M)
  --pattern seq|zero|random
                      what the buffer holds: seq, byte i is i mod 251;
                      zero; or random bytes (default seq)
  --gpu N             the buffer in the memory of GPU N (CUDA's numbering;
                      default: host memory)
  --host-memory shared|private
                      where host buffers come from: shared, memory a
                      reader or writer on this host maps and copies
                      directly; private, anonymous memory it copies with
                      a system call per range (default shared)
  --listen HOST:PORT  where this process listens for peers; 0.0.0.0:PORT
                      for every interface (default: RDMABUF_LISTEN, else
                      127.0.0.1:0, loopback on a free port)
  --endpoint          also accept endpoints on 127.0.0.1, printed as
                      "endpoint HOST:PORT" on a second line; each keeps 16
                      receives of --size bytes posted (for bench --op)
  -h, --help          this text

Sizes take K/M/G suffixes (binary).
exit status: 0 when stopped by a signal; 1 when the buffer cannot be
registered or served; 2 for a bad command line or RDMABUF_* variable.
)";

}  // namespace

int cmd_serve(int argc, char** argv) {
  if (wants_help(argc, argv)) return print_help(kHelp);
  auto args =
      parse_args(argc, argv, 2, {"size", "pattern", "gpu", "listen", "host-memory"}, {"endpoint"});
  if (!args.ok()) return fail(args.status());
  if (!args->positional.empty())
    return fail(InvalidArgument("serve takes no positional arguments"));
  auto size = args->size("size", 64 << 20);
  if (!size.ok()) return fail(size.status());
  std::string pattern = args->get("pattern").value_or("seq");
  if (pattern != "seq" && pattern != "zero" && pattern != "random") {
    return fail(InvalidArgument("--pattern must be seq, zero or random"));
  }
  auto host_memory = parse_host_memory(args->get("host-memory").value_or("shared"));
  if (!host_memory.ok()) return fail(host_memory.status());
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  if (auto listen = args->get("listen")) config->listen_address = *listen;

  // Before any thread starts, so that the signals reach sigwait below.
  sigset_t stop_signals = block_stop_signals();

  auto manager = Manager::create(*config);
  if (!manager.ok()) return fail(manager.status());
  auto memory = allocate_host_memory(*size, *host_memory);
  if (!memory.ok()) return fail(memory.status());
  if (pattern == "seq") fill_seq(memory->span(), 0);
  if (pattern == "random") fill_random(memory->span(), secure_random_u64());
  if (args->has("gpu")) {
    auto device = args->integer("gpu", 0, 0, 1023);
    if (!device.ok()) return fail(device.status());
    auto on_gpu = LocalMemory::allocate_gpu(*size, static_cast<int>(*device));
    if (!on_gpu.ok()) return fail(on_gpu.status());
    Status copied = copy_memory(*on_gpu, *memory);  // the pattern, to the GPU
    if (!copied.ok()) return fail(copied);
    memory = std::move(on_gpu);
  }
  auto handle = (*manager)->register_buffer(*memory);
  if (!handle.ok()) return fail(handle.status());
  std::printf("%s\n", handle->to_text().c_str());
  std::unique_ptr<EndpointServer> endpoints;
  if (args->flags.count("endpoint")) {
    auto listener = (*manager)->listen("127.0.0.1:0");
    if (!listener.ok()) return fail(listener.status());
    std::printf("endpoint %s\n", (*listener)->address().c_str());
    endpoints = std::make_unique<EndpointServer>(**manager, *memory, std::move(listener).value(),
                                                 *size, *host_memory);
  }
  std::fflush(stdout);
  const std::string kind = memory->on_gpu() ? memory_kind_name(memory->kind())
                                            : std::string(host_memory_name(*host_memory)) + " host";
  std::fprintf(
      stderr, "rdmabuf: serving %llu bytes (%s, %s memory) as buffer %llu of %s; Ctrl-C stops\n",
      static_cast<unsigned long long>(*size), pattern.c_str(), kind.c_str(),
      static_cast<unsigned long long>(handle->id()), (*manager)->identity().to_string().c_str());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  endpoints.reset();
  (*manager)->shutdown();
  return kExitOk;
}

}  // namespace rdmabuf::tool
