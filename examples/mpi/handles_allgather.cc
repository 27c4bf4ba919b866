// rdmabuf in an MPI job: every rank registers a buffer, the handles travel
// by MPI_Allgatherv (MPI carries only the few dozen bytes of each handle),
// and each rank reads its right neighbour's buffer one-sidedly, then
// writes into its left neighbour's, and checks what it got.
//
//   mpirun -np 4 --host a:2,b:2 handles_allgather
//
// Ranks on one host reach each other by shared memory; ranks on other
// hosts over tcp (or ibverbs). A manager listens on loopback unless told
// otherwise: this example listens on every interface, so that ranks on
// other hosts can dial it, and handles name this host's first non-loopback
// address (RDMABUF_LISTEN and RDMABUF_ADVERTISE_HOST override). Prints
// "rank R ok (TRANSPORT)".
#include <mpi.h>
#include <rdmabuf/rdmabuf.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr size_t kSize = 8 << 20;

std::byte pattern(int rank, size_t i) {
  return std::byte((i * 7 + size_t(rank) * 31) % 251);
}

int fail(int rank, const rdmabuf::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", rank, status.to_string().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

// Every rank's bytes, in rank order: handles are of different lengths.
std::vector<std::vector<uint8_t>> all_gather(const std::vector<uint8_t>& mine, int ranks) {
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(ranks), starts(ranks);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < ranks; ++r) {
    starts[r] = total;
    total += lengths[r];
  }
  std::vector<uint8_t> joined(total);
  MPI_Allgatherv(mine.data(), length, MPI_BYTE, joined.data(), lengths.data(), starts.data(),
                 MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<uint8_t>> out(ranks);
  for (int r = 0; r < ranks; ++r)
    out[r].assign(joined.begin() + starts[r], joined.begin() + starts[r] + lengths[r]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  auto config = rdmabuf::Config::from_env();
  if (!config.ok()) return fail(rank, config.status());
  if (!std::getenv("RDMABUF_LISTEN")) config->listen_address = "0.0.0.0:0";
  auto manager = rdmabuf::Manager::create(*config);
  if (!manager.ok()) return fail(rank, manager.status());

  auto memory = rdmabuf::LocalMemory::allocate(kSize);
  if (!memory.ok()) return fail(rank, memory.status());
  for (size_t i = 0; i < kSize; ++i)
    memory->data()[i] = pattern(rank, i);
  auto mine = (*manager)->register_buffer(*memory);
  if (!mine.ok()) return fail(rank, mine.status());

  std::vector<rdmabuf::RemoteBuffer> handles;
  for (const std::vector<uint8_t>& bytes : all_gather(mine->to_bytes(), ranks)) {
    auto handle = rdmabuf::RemoteBuffer::from_bytes(bytes);
    if (!handle.ok()) return fail(rank, handle.status());
    handles.push_back(*handle);
  }

  // Read the right neighbour's buffer, and check every byte.
  const int right = (rank + 1) % ranks, left = (rank + ranks - 1) % ranks;
  auto got = rdmabuf::LocalMemory::allocate(kSize);
  if (!got.ok()) return fail(rank, got.status());
  rdmabuf::Transfer read =
      (*manager)->submit({rdmabuf::Op::read(handles[right], *got)}, std::chrono::seconds(60));
  if (rdmabuf::Status st = read.wait(); !st.ok()) return fail(rank, st);
  for (size_t i = 0; i < kSize; ++i) {
    if (got->data()[i] != pattern(right, i)) {
      return fail(rank, rdmabuf::Internal("byte " + std::to_string(i) + " from the right differs"));
    }
  }
  const std::string transport(read.op_backend(0));

  // Everyone has read before anyone's buffer changes; then write our
  // pattern over the first 4 KiB of our left neighbour's buffer.
  MPI_Barrier(MPI_COMM_WORLD);
  auto head = rdmabuf::LocalMemory::allocate(4096);
  auto target = handles[left].slice(0, 4096);
  if (!head.ok() || !target.ok()) return fail(rank, rdmabuf::Internal("4 KiB"));
  for (size_t i = 0; i < 4096; ++i)
    head->data()[i] = pattern(rank, i);
  if (rdmabuf::Status st = (*manager)->write_from(*target, *head); !st.ok()) return fail(rank, st);
  MPI_Barrier(MPI_COMM_WORLD);  // our right neighbour wrote into ours
  for (size_t i = 0; i < 4096; ++i) {
    if (memory->data()[i] != pattern(right, i)) {
      return fail(rank, rdmabuf::Internal("the right neighbour's write did not land"));
    }
  }

  if (rdmabuf::Status st = (*manager)->release(*mine); !st.ok()) return fail(rank, st);
  std::printf("rank %d ok (%s)\n", rank, transport.c_str());
  MPI_Finalize();
  return 0;
}
