// The two child roles of `rdmabuf soak` (see tools/soak.h): the owner, which
// holds the buffers, and a client, which loads its region of them and checks
// every byte it reads back.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/strings.h"
#include "rdmabuf/rdmabuf.h"
#include "tools/args.h"
#include "tools/signals.h"
#include "tools/soak.h"

namespace rdmabuf::tool::soak {
namespace {

// The deadline of every op. Far beyond what any op of the soak needs on a
// loaded machine: an op that takes this long is a failure to report.
constexpr auto kOpTimeout = std::chrono::seconds(60);
// A client that sees no op complete for this long, with ops in flight, is
// hung: the library failed to enforce the deadline above.
constexpr auto kHangAfter = kOpTimeout + std::chrono::seconds(30);
// A client goes on at least this long after its warm-up (every slot
// verified once), even past --seconds unless it has seen errors, so that a
// short run on a slow machine (a sanitizer build) still gives the
// coordinator a sample of the owner under load after warm-up.
constexpr auto kLoadAfterWarm = std::chrono::seconds(2);
// Each client prints at most this many error lines (all are counted).
constexpr int kMaxErrorLines = 20;
// Ops submitted together in one batch: 1..kMaxBatch, at random.
constexpr size_t kMaxBatch = 16;
// The owner registers and releases a small buffer this often.
constexpr auto kChurnPeriod = std::chrono::milliseconds(2);

// Lines to the coordinator; whole lines, flushed, from any thread.
std::mutex g_output_mu;
void emit(const std::string& line) {
  std::lock_guard lock(g_output_mu);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

std::string backend_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names)
    out += (out.empty() ? "" : ",") + n;
  return out;
}

std::vector<std::string> context_names(const RemoteBuffer& handle) {
  std::vector<std::string> names;
  for (const BackendContext& c : handle.contexts())
    names.push_back(c.backend);
  return names;
}

// ---------------------------------------------------------------- owner

// Registers a small buffer and releases it, over and over, while the
// clients run: a registry, shared-state slot or NIC registration that is not
// given back on release shows up as growth, or as a handle that stops
// offering a backend once a table is full.
class Churn {
 public:
  Churn(Manager& manager, std::vector<std::string> expected_contexts, size_t steady_count)
      : manager_(manager),
        expected_(std::move(expected_contexts)),
        steady_count_(steady_count),
        thread_([this] { run(); }) {}
  ~Churn() { stop(); }

  void stop() {
    stopping_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  uint64_t rounds() const { return rounds_.load(); }
  uint64_t errors() const { return errors_.load(); }

 private:
  void fail(const std::string& what) {
    if (errors_.fetch_add(1) < kMaxErrorLines) emit("error owner: " + what);
  }

  void run() {
    while (!stopping_.load()) {
      if (!churn_once()) return;
      rounds_.fetch_add(1);
      std::this_thread::sleep_for(kChurnPeriod);
    }
  }

  // One buffer allocated, registered and released; false when it cannot
  // be allocated. Its memory (and the descriptor of its file) is gone
  // before the pause between rounds, so that the owner's descriptors, as
  // the soak samples them, are its steady ones or one more.
  bool churn_once() {
    const size_t size = size_t{4096} << (rounds_.load() % 5);  // 4 KiB .. 64 KiB
    auto memory = LocalMemory::allocate(size);
    if (!memory.ok()) {
      fail("allocate: " + memory.status().to_string());
      return false;
    }
    auto handle = manager_.register_buffer(*memory);
    if (!handle.ok()) {
      fail("register_buffer, round " + std::to_string(rounds_.load()) + ": " +
           handle.status().to_string());
    } else {
      if (context_names(*handle) != expected_) {
        fail("round " + std::to_string(rounds_.load()) + ": a new buffer is offered over " +
             backend_list(context_names(*handle)) + ", the first ones over " +
             backend_list(expected_));
      }
      Status released = manager_.release(*handle);
      if (!released.ok()) fail("release: " + released.to_string());
      if (manager_.registered_count() != steady_count_) {
        fail("after release, " + std::to_string(manager_.registered_count()) +
             " buffers are registered, not " + std::to_string(steady_count_));
      }
    }
    return true;
  }

  Manager& manager_;
  const std::vector<std::string> expected_;
  const size_t steady_count_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> rounds_{0};
  std::atomic<uint64_t> errors_{0};
  std::thread thread_;  // last: starts once the fields above exist
};

// ---------------------------------------------------------------- client

// Fills `bytes` with the pseudo-random stream of `seed`, 8 bytes a step.
void fill_pattern(std::span<std::byte> bytes, uint64_t seed) {
  uint64_t x = seed | 1;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;  // xorshift64
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
  for (; i < bytes.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    bytes[i] = static_cast<std::byte>(x >> 56);
  }
}

// splitmix64's finaliser: seeds that differ in one bit give unrelated patterns.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Counters {
  uint64_t ops = 0;  // ops that succeeded
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t bytes = 0;       // moved by the ops that succeeded
  uint64_t errors = 0;      // ops that failed, or went over another backend
  uint64_t mismatches = 0;  // reads that brought back other bytes than written

  std::string fields() const {
    return " ops=" + std::to_string(ops) + " reads=" + std::to_string(reads) +
           " writes=" + std::to_string(writes) + " bytes=" + std::to_string(bytes) +
           " errors=" + std::to_string(errors) + " mismatches=" + std::to_string(mismatches);
  }
};

// One range of a peer's region and the ops on it, one at a time.
struct Slot {
  int index = 0;  // in the client's slots
  int peer = 0;   // which of the client's managers runs its ops
  SlotPlan plan;
  RemoteBuffer range;    // the handle sliced to the slot
  LocalMemory expected;  // what the remote range holds; the source of writes
  LocalMemory landing;   // where reads land
  // False at the start and after a failed op: the next op rewrites it all.
  bool known = false;
  bool in_flight = false;
  bool read_back_due = false;  // the last write is not verified yet
  bool warm = false;           // a read of this slot has been verified
  uint64_t writes = 0;         // seeds the patterns
  // The op in flight, or the last one.
  OpKind kind = OpKind::kReadIntoLocal;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Completed batches, handed from library threads (on_done) to the client's
// main thread.
class CompletionQueue {
 public:
  void push(uint64_t batch) {
    std::lock_guard lock(mu_);
    done_.push_back(batch);
    cv_.notify_one();
  }
  // Waits until something completed or `until`; returns what did.
  std::vector<uint64_t> take(Deadline until) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, until, [&] { return !done_.empty(); });
    return std::exchange(done_, {});
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> done_;
};

// One client process: its managers are peers of the owner of their own
// (connections, queue pairs, same-host channels), peer p of client c being
// peer c * managers + p of the run, with a region of its own in every
// buffer. One thread submits and checks the ops of them all.
class Client {
 public:
  Client(std::vector<std::unique_ptr<Manager>> managers, int index, std::string backend,
         uint64_t seed)
      : managers_(std::move(managers)),
        index_(index),
        backend_(std::move(backend)),
        seed_(seed),
        rng_(mix(seed ^ mix(static_cast<uint64_t>(index)))),  // each client its own choices
        peer_bytes_(managers_.size(), 0) {}

  // Lays out every peer's slots over `buffers` (handles to the owner's
  // buffers).
  Status prepare(const std::vector<RemoteBuffer>& buffers, const Layout& layout) {
    for (size_t p = 0; p < managers_.size(); ++p) {
      const uint64_t run_peer = static_cast<uint64_t>(index_) * managers_.size() + p;
      for (const SlotPlan& plan : layout.slots) {
        const RemoteBuffer& buffer = buffers.at(static_cast<size_t>(plan.buffer));
        const uint64_t region = run_peer * layout.region_bytes[static_cast<size_t>(plan.buffer)];
        Slot slot;
        slot.index = static_cast<int>(slots_.size());
        slot.peer = static_cast<int>(p);
        slot.plan = plan;
        RDMABUF_ASSIGN_OR_RETURN(slot.range, buffer.slice(region + plan.offset, plan.capacity));
        RDMABUF_ASSIGN_OR_RETURN(slot.expected, LocalMemory::allocate(plan.capacity));
        RDMABUF_ASSIGN_OR_RETURN(slot.landing, LocalMemory::allocate(plan.capacity));
        slots_.push_back(std::move(slot));
      }
    }
    return Status::Ok();
  }

  void shutdown() {
    for (auto& manager : managers_)
      manager->shutdown();
  }

  // Runs ops until `seconds` have passed, and at least kLoadAfterWarm past
  // the warm-up, then drains. Returns the exit code.
  int run(std::chrono::seconds seconds) {
    Deadline end = Clock::now() + seconds;
    Deadline next_progress = Clock::now() + std::chrono::seconds(1);
    Deadline last_completion = Clock::now();
    bool warm_reported = false;
    while (true) {
      const Deadline now = Clock::now();
      const bool failing = counters_.errors + counters_.mismatches > 0;
      if (now < end || (!warm_reported && !failing)) submit_ready();
      if (batches_.empty()) break;
      for (uint64_t id :
           queue_.take(std::min(next_progress, now + std::chrono::milliseconds(100)))) {
        complete(id);
        last_completion = Clock::now();
      }
      if (!warm_reported &&
          std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.warm; })) {
        emit("warm" + usage_fields(usage_of(getpid())));
        warm_reported = true;
        end = std::max(end, Clock::now() + kLoadAfterWarm);
      }
      if (Clock::now() >= next_progress) {
        emit("progress" + counters_.fields());
        next_progress += std::chrono::seconds(1);
      }
      if (!batches_.empty() && Clock::now() - last_completion > kHangAfter) {
        counters_.errors++;
        emit("error client " + std::to_string(index_) + ": no op completed for " +
             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kHangAfter).count()) +
             " s with " + std::to_string(batches_.size()) +
             " batches in flight, though every op has a deadline of " +
             std::to_string(kOpTimeout.count()) + " s: the library hangs");
        emit("done" + counters_.fields() + " hung=1" + usage_fields(usage_of(getpid())));
        // The transfers may never finish: destroying them would hang too.
        std::_Exit(kExitFailed);
      }
    }
    emit("done" + counters_.fields() + " peer_bytes_min=" +
         std::to_string(*std::min_element(peer_bytes_.begin(), peer_bytes_.end())) +
         usage_fields(usage_of(getpid())));
    return counters_.errors + counters_.mismatches == 0 ? kExitOk : kExitFailed;
  }

 private:
  struct Batch {
    Transfer transfer;
    std::vector<int> slots;  // op i is the op of slot slots[i]
  };

  uint64_t uniform(uint64_t lo, uint64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }

  // Chooses the slot's next op and prepares its local memory.
  Op plan_op(Slot& s) {
    const uint64_t cap = s.plan.capacity;
    if (!s.known) {  // rewrite the whole range
      s.kind = OpKind::kWriteFromLocal;
      s.offset = 0;
      s.length = cap;
    } else if (s.read_back_due) {  // the written range, or the whole slot
      s.kind = OpKind::kReadIntoLocal;
      if (uniform(0, 1) == 0) {
        s.offset = 0;
        s.length = cap;
      }
    } else {
      s.kind = uniform(0, 3) == 0 ? OpKind::kReadIntoLocal : OpKind::kWriteFromLocal;
      s.length = uniform(std::max(kMinOpBytes, cap / 2), cap);
      s.offset = uniform(0, cap - s.length);
    }
    std::span<std::byte> expected = s.expected.span().subspan(s.offset, s.length);
    if (s.kind == OpKind::kWriteFromLocal) {
      fill_pattern(expected, mix(seed_ ^
                                 mix((uint64_t{static_cast<uint32_t>(index_)} << 32) |
                                     static_cast<uint32_t>(s.index)) ^
                                 mix(s.writes++)));
      s.read_back_due = true;
      return Op::write(s.range.slice(s.offset, s.length).value(),
                       s.expected.slice(s.offset, s.length).value());
    }
    // Poison the landing zone with the complement of what should arrive, so
    // that a byte the read never delivered cannot pass for a right one.
    std::span<std::byte> landing = s.landing.span().subspan(s.offset, s.length);
    for (size_t i = 0; i < landing.size(); ++i)
      landing[i] = ~expected[i];
    return Op::read(s.range.slice(s.offset, s.length).value(),
                    s.landing.slice(s.offset, s.length).value());
  }

  // Every slot with no op in flight gets one; a batch holds ops of one peer.
  void submit_ready() {
    std::vector<std::vector<Slot*>> ready(managers_.size());
    for (Slot& s : slots_) {
      if (!s.in_flight) ready[static_cast<size_t>(s.peer)].push_back(&s);
    }
    for (size_t p = 0; p < ready.size(); ++p) {
      std::shuffle(ready[p].begin(), ready[p].end(), rng_);
      submit_batches(*managers_[p], ready[p]);
    }
  }

  void submit_batches(Manager& manager, const std::vector<Slot*>& ready) {
    size_t at = 0;
    while (at < ready.size()) {
      const size_t count = std::min<size_t>(uniform(1, kMaxBatch), ready.size() - at);
      std::vector<Op> ops;
      Batch batch;
      for (size_t i = at; i < at + count; ++i) {
        ops.push_back(plan_op(*ready[i]));
        ready[i]->in_flight = true;
        batch.slots.push_back(ready[i]->index);
      }
      at += count;
      const uint64_t id = next_batch_++;
      batch.transfer = manager.submit(std::move(ops), kOpTimeout, [this, id] { queue_.push(id); });
      batches_.emplace(id, std::move(batch));
    }
  }

  void report(const std::string& what) {
    if (++error_lines_ <= kMaxErrorLines) {
      emit("error client " + std::to_string(index_) + " (" + backend_ + "): " + what);
    }
  }

  std::string describe(const Slot& s) const {
    return std::string(op_kind_name(s.kind)) + " of " + std::to_string(s.length) + " B at +" +
           std::to_string(s.offset) + " of slot " + std::to_string(s.index) + " (peer " +
           std::to_string(s.peer) + " of the client, buffer " + std::to_string(s.plan.buffer) +
           ", " + std::to_string(s.plan.capacity) + " B)";
  }

  void complete(uint64_t id) {
    auto it = batches_.find(id);
    if (it == batches_.end()) return;
    Batch batch = std::move(it->second);
    batches_.erase(it);
    for (size_t i = 0; i < batch.slots.size(); ++i) {
      Slot& s = slots_[static_cast<size_t>(batch.slots[i])];
      s.in_flight = false;
      Status st = batch.transfer.op_status(i);
      if (!st.ok()) {
        counters_.errors++;
        report(describe(s) + " failed: " + st.to_string());
        s.known = false;  // a failed write leaves the range unspecified
        s.read_back_due = false;
        continue;
      }
      if (batch.transfer.op_backend(i) != backend_) {
        counters_.errors++;
        report(describe(s) + " went over '" + std::string(batch.transfer.op_backend(i)) +
               "': " + batch.transfer.op_note(i));
      }
      counters_.ops++;
      counters_.bytes += s.length;
      peer_bytes_[static_cast<size_t>(s.peer)] += s.length;
      if (s.kind == OpKind::kWriteFromLocal) {
        counters_.writes++;
        s.known = true;
        continue;
      }
      counters_.reads++;
      s.read_back_due = false;
      verify(s);
    }
  }

  // Compares what a read brought with what the slot holds.
  void verify(Slot& s) {
    const std::byte* got = s.landing.data() + s.offset;
    const std::byte* want = s.expected.data() + s.offset;
    if (std::memcmp(got, want, s.length) == 0) {
      s.warm = true;
      return;
    }
    counters_.mismatches++;
    size_t first = 0;
    while (got[first] == want[first])
      ++first;
    size_t differing = 0;
    for (size_t i = first; i < s.length; ++i)
      differing += got[i] != want[i];
    char bytes[96];
    std::snprintf(bytes, sizeof bytes, "expected 0x%02x, got 0x%02x%s",
                  static_cast<unsigned>(want[first]), static_cast<unsigned>(got[first]),
                  got[first] == ~want[first] ? " (the poison: the read never delivered it)" : "");
    report(describe(s) + " read back " + std::to_string(differing) +
           " wrong bytes, the first at +" + std::to_string(first) + ": " + bytes);
    s.known = false;
  }

  std::vector<std::unique_ptr<Manager>> managers_;
  const int index_;
  const std::string backend_;
  const uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<Slot> slots_;
  CompletionQueue queue_;
  std::unordered_map<uint64_t, Batch> batches_;
  uint64_t next_batch_ = 0;
  Counters counters_;
  std::vector<uint64_t> peer_bytes_;  // per peer: bytes its ops moved
  int error_lines_ = 0;
};

}  // namespace

int run_owner(int argc, char** argv) {
  auto args = parse_args(argc, argv, 2, {"role", "buffer-sizes", "backends"}, {});
  if (!args.ok()) return fail(args.status());
  std::vector<uint64_t> sizes;
  for (const std::string& s : split_list(args->get("buffer-sizes").value_or(""))) {
    auto size = parse_size(s);
    if (!size.ok() || *size == 0) return fail(InvalidArgument("--buffer-sizes: bad size " + s));
    sizes.push_back(*size);
  }
  if (sizes.empty()) return fail(InvalidArgument("--buffer-sizes is empty"));
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  config->backends = split_list(args->get("backends").value_or(""));

  sigset_t stop_signals = block_stop_signals();
  auto created = Manager::create(*config);
  if (!created.ok()) return fail(created.status());
  Manager& manager = **created;
  std::vector<RemoteBuffer> handles;
  for (uint64_t size : sizes) {
    auto memory = LocalMemory::allocate(size);
    if (!memory.ok()) return fail(memory.status());
    auto handle = manager.register_buffer(*memory);
    if (!handle.ok()) return fail(handle.status());
    emit("handle " + handle->to_text());
    handles.push_back(*handle);
  }
  emit("ready backends=" + backend_list(context_names(handles[0])));
  Churn churn(manager, context_names(handles[0]), handles.size());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  churn.stop();
  emit("owner churned=" + std::to_string(churn.rounds()) +
       " errors=" + std::to_string(churn.errors()));
  manager.shutdown();
  return churn.errors() == 0 ? kExitOk : kExitFailed;
}

int run_client(int argc, char** argv) {
  auto args = parse_args(argc, argv, 2,
                         {"role", "index", "managers", "backend", "handles", "inflight", "max-size",
                          "seconds", "seed"},
                         {});
  if (!args.ok()) return fail(args.status());
  auto index = args->integer("index", 0, 0, 1 << 20);
  auto managers = args->integer("managers", 1, 1, 1024);
  auto inflight = args->integer("inflight", 64, 1, 1 << 16);
  auto max_size = args->size("max-size", 4 << 20);
  auto seconds = args->integer("seconds", 60, 1, int64_t{1} << 31);
  auto seed = args->integer("seed", 0, 0, INT64_MAX);
  for (const Status& st : {index.status(), managers.status(), inflight.status(), max_size.status(),
                           seconds.status(), seed.status()}) {
    if (!st.ok()) return fail(st);
  }
  const std::string backend = args->get("backend").value_or("");
  std::vector<RemoteBuffer> buffers;
  for (const std::string& text : split_list(args->get("handles").value_or(""))) {
    auto handle = RemoteBuffer::from_text(text);
    if (!handle.ok()) return fail(handle.status());
    buffers.push_back(*handle);
  }
  if (backend.empty() || buffers.empty()) {
    return fail(InvalidArgument("a soak client needs --backend and --handles"));
  }
  auto config = Config::from_env();
  if (!config.ok()) return fail(config.status());
  config->backends = {backend};

  sigset_t stop_signals = block_stop_signals();
  std::vector<std::unique_ptr<Manager>> peers;
  for (int64_t p = 0; p < *managers; ++p) {
    auto created = Manager::create(*config);
    if (!created.ok()) return fail(created.status());
    peers.push_back(std::move(created).value());
  }
  Client client(std::move(peers), static_cast<int>(*index), backend, static_cast<uint64_t>(*seed));
  const Layout layout =
      plan_layout(static_cast<int>(*inflight), static_cast<int>(buffers.size()), *max_size);
  Status prepared = client.prepare(buffers, layout);
  if (!prepared.ok()) return fail(prepared);
  const int code = client.run(std::chrono::seconds(*seconds));
  // Stay connected, idle, until the coordinator has sampled the owner.
  int sig = 0;
  sigwait(&stop_signals, &sig);
  client.shutdown();
  return code;
}

}  // namespace rdmabuf::tool::soak
