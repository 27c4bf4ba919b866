// rdmabuf soak: a long, verified load against one owner process, to find
// leaks, hangs and corruption that short tests miss. Shared by the three
// roles of the command (tools/soak.cc runs the show; tools/soak_roles.cc
// holds the owner and the client processes it starts):
//
//   coordinator  `rdmabuf soak ...`: picks the backends, starts the owner and
//                the clients, samples the owner's memory, prints the summary.
//   owner        `rdmabuf soak --role owner ...`: registers the buffers,
//                prints their handles, serves until SIGTERM.
//   client       `rdmabuf soak --role client ...`: runs its ops on its own
//                region of every buffer and checks every byte it reads.
//
// Children talk to the coordinator in lines on stdout: a word, then
// `key=value` fields (see parse_fields).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf::tool::soak {

// Ops are at least this large; the smallest size class holds them.
constexpr uint64_t kMinOpBytes = 8;

// Where one in-flight slot of a client works: a fixed range of one buffer,
// inside that client's region. Ops of a slot run one at a time, so the
// client always knows what the range holds.
struct SlotPlan {
  int buffer = 0;         // index into the owner's buffers
  uint64_t offset = 0;    // from the start of the client's region in that buffer
  uint64_t capacity = 0;  // bytes of the range; ops are at most this large
};

// The same layout for every client: slot k of every client has the same
// buffer, offset and capacity; client c's region in buffer b starts at
// c * region_bytes[b].
struct Layout {
  std::vector<SlotPlan> slots;
  std::vector<uint64_t> region_bytes;  // per buffer: one client's share
};

// Spreads `inflight` slots over `buffers` buffers with capacities from
// `max_op` down to kMinOpBytes, halving per size class, so that the op sizes
// of a run cover that whole span and every buffer sees most classes.
Layout plan_layout(int inflight, int buffers, uint64_t max_op);

// What /proc says about a process's resources. Zero fields when unreadable.
struct Usage {
  uint64_t rss_kib = 0;  // VmRSS
  uint64_t fds = 0;      // entries in /proc/PID/fd
  uint64_t threads = 0;  // Threads
};
Usage usage_of(pid_t pid);

// " rss_kib=.. fds=.. threads=..": appended to the children's reports.
std::string usage_fields(const Usage& usage);

// "warm a=1 b=x" -> {"": "warm", "a": "1", "b": "x"}: the first word under
// the empty key, then every `key=value` word.
std::map<std::string, std::string> parse_fields(const std::string& line);
// The field as an integer; 0 when absent or not a number.
uint64_t field_u64(const std::map<std::string, std::string>& fields, const std::string& key);

// The entry points of the two child roles; argv as given to `rdmabuf soak`.
int run_owner(int argc, char** argv);
int run_client(int argc, char** argv);

}  // namespace rdmabuf::tool::soak
