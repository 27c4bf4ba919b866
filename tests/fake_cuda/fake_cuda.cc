// A CUDA driver for tests on machines without a GPU: the entry points
// rdmabuf calls (common/cuda_api.h), over host memory that only this
// library's own copy functions may touch.
//
// "GPU memory" is a range of one memfd (the process's arena, handed out
// front to back and never reused; a freed range gives its pages back),
// mapped twice: at the device address, with no
// access at all (PROT_NONE), so that any host load or store there (a stray
// memcpy, a send() or process_vm_readv from it, an ibv_reg_mr of it) faults
// or fails as it would on a real GPU; and once more, readable and writable,
// where only the copy functions below go. Asynchronous copies run when their
// stream (or an event recorded behind them) is synchronized, not before, so
// a caller that reads a staging buffer without waiting sees stale bytes.
// IPC handles name the arena by owner pid and fd number, and the range in
// it; another process opens it through /proc and maps the range, as CUDA
// IPC maps the same pages. dma-buf export
// goes through /dev/udmabuf where the kernel has it, and is
// CUDA_ERROR_NOT_SUPPORTED otherwise.
//
// Every error it returns is also printed to stderr ("fake_cuda: ..."), so
// misuse is loud; a queued copy that finds its memory gone when it runs
// makes its stream's synchronizations fail (CUDA_ERROR_ILLEGAL_ADDRESS).
// Environment: FAKE_CUDA_DEVICES (how many GPUs, default 1;
// 0 means cuInit fails with CUDA_ERROR_NO_DEVICE); FAKE_CUDA_PEER_MEMORY=1
// maps the device view readable and writable, as a peer-memory kernel
// module (nvidia-peermem) lets a NIC reach GPU memory by its address: then
// ibv_reg_mr of GPU memory works, and stray host accesses no longer fault.
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/cuda_api.h"

using namespace rdmabuf::cuda;

namespace {

constexpr int kVersion = 13000;
constexpr uint64_t kHandleMagic = 0x66616b6563756461ull;  // "fakecuda"
constexpr uint64_t kDeviceMemory = 16ull << 30;

// One allocation: made here (cuMemAlloc) or opened from another process
// (cuIpcOpenMemHandle).
struct Allocation {
  uintptr_t device = 0;       // the PROT_NONE view: what callers see
  std::byte* host = nullptr;  // the read-write view: only the copies use it
  size_t size = 0;
  size_t mapped = 0;    // size rounded up to pages
  uint64_t offset = 0;  // where in its owner's arena
  int ordinal = 0;
  bool opened = false;  // by cuIpcOpenMemHandle
  int open_count = 0;   // opened: cuIpcOpenMemHandle calls not yet closed
  uint64_t id = 0;      // opened: the owner's id for it
  pid_t owner = 0;      // opened: the owner process
};

struct IpcHandle {
  uint64_t magic;
  int32_t pid;
  int32_t fd;  // the owner's arena
  uint64_t offset;
  uint64_t size;
  uint64_t id;
  int32_t ordinal;
};
static_assert(sizeof(IpcHandle) <= kIpcHandleBytes);

struct Stream {
  int ordinal = 0;
  std::deque<std::function<CUresult()>> pending;  // copies not yet run
  uint64_t queued = 0;                            // ever enqueued
  uint64_t ran = 0;                               // ever run
  // Sticky, as the real driver's: a queued copy whose memory had gone by
  // the time it ran (unmapped, closed) fails every later synchronization.
  CUresult failed = CUDA_SUCCESS;
};

struct Event {
  Stream* stream = nullptr;  // where it was recorded last; null: never
  uint64_t position = 0;     // the stream's `queued` when recorded
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int devices = 1;
  std::map<uintptr_t, Allocation> allocations;  // by device address
  std::map<uintptr_t, size_t> pinned;           // cuMemHostAlloc: address -> size
  uint64_t next_id = 1;
  int arena = -1;           // the memfd every allocation of this process lies in
  uint64_t arena_used = 0;  // bytes of it handed out
};

constexpr uint64_t kArenaBytes = uint64_t{1} << 40;  // sparse: only what is written is memory

State& state() {
  static State* s = new State;  // never destroyed: used until the process ends
  return *s;
}

// The context made current; -1: none. In static TLS (initial-exec): this
// library is loaded with dlopen, and ThreadSanitizer's handling of a
// dynamic TLS block allocated on first use in a thread that predates the
// dlopen (__tls_get_addr) sometimes maps shadow for a bogus, huge range and
// dies ("failed to allocate ... bytes"), an I/O thread at a time.
__attribute__((tls_model("initial-exec"))) thread_local int current_device = -1;

CUresult fail(CUresult code, const char* call, const std::string& why) {
  std::fprintf(stderr, "fake_cuda: %s: %s\n", call, why.c_str());
  return code;
}

size_t page_round(size_t size) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

// The allocation holding [address, address + size); null when none does.
// Caller holds state().mu.
Allocation* find(uintptr_t address, size_t size = 1) {
  auto& all = state().allocations;
  auto it = all.upper_bound(address);
  if (it == all.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  if (address < a.device || address - a.device >= a.size) return nullptr;
  if (size > a.size - (address - a.device)) return nullptr;
  return &a;
}

bool touches_device_memory(uintptr_t address, size_t size) {
  auto& all = state().allocations;
  auto it = all.lower_bound(address + size);
  if (it == all.begin()) return false;
  --it;
  return it->second.device + it->second.mapped > address;
}

// Maps a.mapped bytes of `fd` from a.offset twice (see the top of the
// file). False on failure.
bool map_views(Allocation& a, int fd) {
  static const bool peer_memory = [] {
    const char* v = std::getenv("FAKE_CUDA_PEER_MEMORY");
    return v && std::strcmp(v, "1") == 0;
  }();
  const auto offset = static_cast<off_t>(a.offset);
  void* device = ::mmap(nullptr, a.mapped, peer_memory ? PROT_READ | PROT_WRITE : PROT_NONE,
                        MAP_SHARED, fd, offset);
  if (device == MAP_FAILED) return false;
  void* host = ::mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
  if (host == MAP_FAILED) {
    ::munmap(device, a.mapped);
    return false;
  }
  a.device = reinterpret_cast<uintptr_t>(device);
  a.host = static_cast<std::byte*>(host);
  return true;
}

void unmap_views(Allocation& a) {
  ::munmap(reinterpret_cast<void*>(a.device), a.mapped);
  ::munmap(a.host, a.mapped);
  if (!a.opened) {  // its pages go back; the range is never handed out again
    ::fallocate(state().arena, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(a.offset), static_cast<off_t>(a.mapped));
  }
}

// Where the copy functions read or write `size` bytes at `address`: the
// read-write view of device memory, or host memory as it is. Null (after
// printing why) when the range starts in device memory and runs past its
// allocation. Caller holds state().mu.
std::byte* resolve(uintptr_t address, size_t size, const char* call, const char* side) {
  if (Allocation* a = find(address, size)) return a->host + (address - a->device);
  if (touches_device_memory(address, size)) {
    fail(CUDA_ERROR_INVALID_VALUE, call,
         std::string(side) + " range runs outside its GPU allocation");
    return nullptr;
  }
  return reinterpret_cast<std::byte*>(address);
}

CUresult need_context(const char* call) {
  if (!state().initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, call, "cuInit was not called");
  if (current_device < 0) return fail(CUDA_ERROR_INVALID_CONTEXT, call, "no current context");
  return CUDA_SUCCESS;
}

CUresult copy_now(CUdeviceptr to, CUdeviceptr from, size_t bytes, const char* call) {
  std::byte* dst = resolve(to, bytes, call, "destination");
  std::byte* src = resolve(from, bytes, call, "source");
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  std::memmove(dst, src, bytes);
  return CUDA_SUCCESS;
}

// 0 (the null stream), 1 (CU_STREAM_LEGACY) and 2 (CU_STREAM_PER_THREAD):
// their copies run at once here.
bool is_default_stream(CUstream handle) {
  return reinterpret_cast<uintptr_t>(handle) <= 2;
}

// Runs `stream`'s queued copies up to its `position`-th. Caller holds mu.
void run_until(Stream& stream, uint64_t position) {
  while (stream.ran < position && !stream.pending.empty()) {
    auto copy = std::move(stream.pending.front());
    stream.pending.pop_front();
    ++stream.ran;
    if (copy() != CUDA_SUCCESS) stream.failed = CUDA_ERROR_ILLEGAL_ADDRESS;
  }
}

// How long a synchronization waits before it runs the queued copies
// (fake_cuda_set_sync_delay_ms), so that a test can hold copies in flight
// while it does something else.
std::atomic<int> sync_delay_ms{0};
void sync_delay() {
  const int ms = sync_delay_ms.load(std::memory_order_relaxed);
  if (ms > 0) ::usleep(static_cast<useconds_t>(ms) * 1000);
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) {
  if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit", "flags must be 0");
  State& s = state();
  std::lock_guard lock(s.mu);
  const char* devices = std::getenv("FAKE_CUDA_DEVICES");
  s.devices = devices && *devices ? std::atoi(devices) : 1;
  if (s.devices <= 0) return fail(CUDA_ERROR_NO_DEVICE, "cuInit", "FAKE_CUDA_DEVICES=0");
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  if (!version) return fail(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion", "null");
  *version = kVersion;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
  static const std::pair<CUresult, const char*> kNames[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS"},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
      {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
      {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"},
      {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
      {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
      {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED"},
      {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED"},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
      {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
  };
  for (const auto& [code, text] : kNames) {
    if (code == error) {
      *name = text;
      return CUDA_SUCCESS;
    }
  }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  const char* name = nullptr;
  if (cuGetErrorName(error, &name) != CUDA_SUCCESS) {
    *text = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  *text = "reported by the test driver (fake_cuda)";
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGetCount", "no cuInit");
  *count = s.devices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (ordinal < 0 || ordinal >= s.devices) {
    return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet", "no GPU " + std::to_string(ordinal));
  }
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  std::snprintf(name, static_cast<size_t>(length), "rdmabuf test GPU %d (fake_cuda)", device);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
  *bytes = kDeviceMemory;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* id, int length, CUdevice device) {
  std::snprintf(id, static_cast<size_t>(length), "0000:%02x:00.0", 0x80 + device);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (device < 0 || device >= s.devices) {
    return fail(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRetain", "no such GPU");
  }
  // A context is its device's ordinal plus one, as a pointer.
  *context = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(device) + 1);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) {
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
  const auto device = static_cast<int>(reinterpret_cast<uintptr_t>(context)) - 1;
  if (device < -1 || device >= state().devices) {
    return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "not a context");
  }
  current_device = device;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr pointer) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  const Allocation* a = find(pointer);
  if (!a) {
    auto pinned = s.pinned.upper_bound(pointer);
    if (pinned != s.pinned.begin() && (--pinned, pointer - pinned->first < pinned->second) &&
        attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
      *static_cast<unsigned*>(data) = CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;  // memory the driver does not know: quietly
  }
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:  // unique in this process: ids of opened ones are odd
      *static_cast<unsigned long long*>(data) =  // NOLINT(google-runtime-int): as cuda.h
          a->opened ? (a->id << 1) | 1 : a->id << 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a->ordinal;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = a->device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a->size;
      return CUDA_SUCCESS;
    default:
      return fail(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute",
                  "attribute " + std::to_string(attribute) + " is not implemented here");
  }
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr pointer) {
  std::lock_guard lock(state().mu);
  const Allocation* a = find(pointer);
  if (!a) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetAddressRange", "not GPU memory");
  if (base) *base = a->device;
  if (size) *size = a->size;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* pointer, size_t bytes) {
  if (CUresult r = need_context("cuMemAlloc"); r != CUDA_SUCCESS) return r;
  if (bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "0 bytes");
  if (bytes > kDeviceMemory) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "too large");
  Allocation a;
  a.size = bytes;
  a.mapped = page_round(bytes);
  a.ordinal = current_device;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.arena < 0) {
    const int fd = ::memfd_create("fake_cuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(kArenaBytes)) != 0 ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      if (fd >= 0) ::close(fd);
      return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", std::strerror(errno));
    }
    s.arena = fd;
  }
  if (s.arena_used + a.mapped > kArenaBytes) {
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "the arena is spent");
  }
  a.offset = s.arena_used;
  if (!map_views(a, s.arena)) {
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", std::strerror(errno));
  }
  s.arena_used += a.mapped;
  a.id = s.next_id++;
  *pointer = a.device;
  s.allocations.emplace(a.device, a);
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || it->second.opened) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree", "not the start of a cuMemAlloc allocation");
  }
  unmap_views(it->second);
  s.allocations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** pointer, size_t bytes, unsigned) {
  if (CUresult r = need_context("cuMemHostAlloc"); r != CUDA_SUCCESS) return r;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc", "mmap");
  std::lock_guard lock(state().mu);
  state().pinned.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  *pointer = p;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* pointer) {
  std::lock_guard lock(state().mu);
  auto it = state().pinned.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == state().pinned.end()) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", "not from cuMemHostAlloc");
  }
  ::munmap(pointer, it->second);
  state().pinned.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemcpy(CUdeviceptr to, CUdeviceptr from, size_t bytes) {
  if (CUresult r = need_context("cuMemcpy"); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(state().mu);
  return copy_now(to, from, bytes, "cuMemcpy");
}

CUresult cuMemcpyAsync(CUdeviceptr to, CUdeviceptr from, size_t bytes, CUstream handle) {
  if (CUresult r = need_context("cuMemcpyAsync"); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(state().mu);
  // The ranges are checked now, as the real driver does; the bytes move at
  // the next synchronization.
  if (!resolve(to, bytes, "cuMemcpyAsync", "destination") ||
      !resolve(from, bytes, "cuMemcpyAsync", "source")) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (is_default_stream(handle)) return copy_now(to, from, bytes, "cuMemcpyAsync");
  auto* stream = reinterpret_cast<Stream*>(handle);
  stream->pending.push_back(
      [to, from, bytes] { return copy_now(to, from, bytes, "cuMemcpyAsync (when it ran)"); });
  ++stream->queued;
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr to, unsigned char value, size_t bytes) {
  if (CUresult r = need_context("cuMemsetD8"); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(state().mu);
  Allocation* a = find(to, bytes);
  if (!a) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD8", "not GPU memory");
  std::memset(a->host + (to - a->device), value, bytes);
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* stream, unsigned) {
  if (CUresult r = need_context("cuStreamCreate"); r != CUDA_SUCCESS) return r;
  auto* s = new Stream;
  s->ordinal = current_device;
  *stream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream handle) {
  auto* stream = reinterpret_cast<Stream*>(handle);
  {
    std::lock_guard lock(state().mu);
    run_until(*stream, stream->queued);  // as the driver: queued work still runs
  }
  delete stream;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream handle) {
  if (is_default_stream(handle)) return CUDA_SUCCESS;  // their copies ran at once
  auto* stream = reinterpret_cast<Stream*>(handle);
  sync_delay();
  std::lock_guard lock(state().mu);
  run_until(*stream, stream->queued);
  return stream->failed;
}

CUresult cuEventCreate(CUevent* event, unsigned) {
  if (CUresult r = need_context("cuEventCreate"); r != CUDA_SUCCESS) return r;
  *event = reinterpret_cast<CUevent>(new Event);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent event) {
  delete reinterpret_cast<Event*>(event);
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent handle, CUstream stream) {
  auto* event = reinterpret_cast<Event*>(handle);
  std::lock_guard lock(state().mu);
  event->stream = is_default_stream(stream) ? nullptr : reinterpret_cast<Stream*>(stream);
  event->position = event->stream ? event->stream->queued : 0;
  return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent handle) {
  auto* event = reinterpret_cast<Event*>(handle);
  sync_delay();
  std::lock_guard lock(state().mu);
  if (!event->stream) return CUDA_SUCCESS;
  run_until(*event->stream, event->position);
  return event->stream->failed;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr pointer) {
  std::lock_guard lock(state().mu);
  const Allocation* a = find(pointer);
  if (!a || a->opened) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle", "not memory from cuMemAlloc");
  }
  IpcHandle h{
      kHandleMagic, static_cast<int32_t>(::getpid()), state().arena, a->offset, a->size, a->id,
      a->ordinal};
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pointer, CUipcMemHandle handle, unsigned) {
  if (CUresult r = need_context("cuIpcOpenMemHandle"); r != CUDA_SUCCESS) return r;
  IpcHandle h;
  std::memcpy(&h, handle.reserved, sizeof h);
  if (h.magic != kHandleMagic) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle", "not an IPC handle");
  }
  if (h.pid == ::getpid()) {
    return fail(CUDA_ERROR_INVALID_CONTEXT, "cuIpcOpenMemHandle",
                "the handle was made in this process");
  }
  State& s = state();
  std::lock_guard lock(s.mu);
  for (auto& [at, a] : s.allocations) {
    if (a.opened && a.owner == h.pid && a.id == h.id) {  // opened already: counted
      ++a.open_count;
      *pointer = a.device;
      return CUDA_SUCCESS;
    }
  }
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  Allocation a;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle",
                path + ": " + std::strerror(errno) + " (has the owner exited?)");
  }
  a.size = h.size;
  a.mapped = page_round(h.size);
  a.offset = h.offset;
  a.ordinal = h.ordinal;
  a.opened = true;
  a.open_count = 1;
  a.id = h.id;
  a.owner = h.pid;
  const bool mapped = map_views(a, fd);
  const int err = errno;
  ::close(fd);  // the mappings keep the pages
  if (!mapped) return fail(CUDA_ERROR_MAP_FAILED, "cuIpcOpenMemHandle", std::strerror(err));
  *pointer = a.device;
  s.allocations.emplace(a.device, a);
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr pointer) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || !it->second.opened) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuIpcCloseMemHandle", "not from cuIpcOpenMemHandle");
  }
  if (--it->second.open_count > 0) return CUDA_SUCCESS;
  unmap_views(it->second);
  s.allocations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr pointer, size_t bytes, int type,
                                       unsigned long long flags) {  // NOLINT(google-runtime-int)
  if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetHandleForAddressRange", "type or flags");
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (pointer % page != 0 || bytes % page != 0 || bytes == 0) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetHandleForAddressRange",
                "the range must be aligned to the host page size");
  }
  std::lock_guard lock(state().mu);
  const Allocation* a = find(pointer);
  if (!a || a->opened || bytes > a->mapped - (pointer - a->device)) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetHandleForAddressRange",
                "not a range of memory from cuMemAlloc");
  }
  const int dev = ::open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
  if (dev < 0) {
    return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemGetHandleForAddressRange",
                std::string("no dma-buf export here: /dev/udmabuf: ") + std::strerror(errno));
  }
  udmabuf_create create{};
  create.memfd = static_cast<uint32_t>(state().arena);
  create.flags = UDMABUF_FLAGS_CLOEXEC;
  create.offset = a->offset + (pointer - a->device);
  create.size = bytes;
  const int fd = ::ioctl(dev, UDMABUF_CREATE, &create);
  const int err = errno;
  ::close(dev);
  if (fd < 0) {
    return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemGetHandleForAddressRange",
                std::string("UDMABUF_CREATE: ") + std::strerror(err));
  }
  *static_cast<int*>(handle) = fd;
  return CUDA_SUCCESS;
}

// Not a driver entry point: for tests, how many IPC handles this process
// has open (cuIpcOpenMemHandle calls not yet closed).
int fake_cuda_open_ipc_handles() {
  std::lock_guard lock(state().mu);
  int open = 0;
  for (const auto& [at, a] : state().allocations)
    open += a.opened ? a.open_count : 0;
  return open;
}

// Not a driver entry point: for tests, makes every later stream or event
// synchronization wait `ms` milliseconds before it runs the queued copies.
void fake_cuda_set_sync_delay_ms(int ms) {
  sync_delay_ms.store(ms, std::memory_order_relaxed);
}

}  // extern "C"

// Every entry point rdmabuf calls is here, with its declared type.
#define RDMABUF_FAKE_CHECK(name, symbol, ret, params) \
  static_assert(std::is_same_v<decltype(&::symbol), name##_t*>, #symbol);
RDMABUF_CUDA_ENTRY_POINTS(RDMABUF_FAKE_CHECK)
