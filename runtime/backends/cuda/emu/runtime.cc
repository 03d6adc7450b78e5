// The CUDA runtime API of the emulation (emu.h): devices, errors, memory,
// copies, streams and events.
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "emu.h"
#include "stream.h"

#ifdef LOOM_EMU_ASAN
#include <sanitizer/asan_interface.h>
#define LOOM_EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define LOOM_EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define LOOM_EMU_POISON(p, n) ((void)(p), (void)(n))
#define LOOM_EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace loom::cuda_emu {
namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's

int EnvInt(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "CUDA emulation: %s=%s is not an integer in [%d, %d]; using %d\n", name, v,
                 lo, hi, fallback);
    return fallback;
  }
  return static_cast<int>(x);
}

struct Allocation {
  size_t bytes;
  int device;
};

struct Memory {
  std::mutex mu;  // guards the fields below
  std::map<uintptr_t, Allocation> allocations;
  std::map<int, size_t> used;  // bytes per device
  std::mutex device_code;      // held while device code runs (DeviceAccess)
};

Memory& Mem() {
  static Memory* m = new Memory;  // outlives static destructors
  return *m;
}

struct AtomicCounters {
  std::atomic<int64_t> launches{0}, mallocs{0}, frees{0}, to_host{0}, to_device{0}, on_device{0},
      memsets{0};
};

AtomicCounters& Count() {
  static AtomicCounters c;
  return c;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

size_t Capacity() {
  static const size_t bytes =
      static_cast<size_t>(EnvInt("LOOM_CUDA_EMU_MEMORY_GIB", 80, 1, 1 << 20)) << 30;
  return bytes;
}

cudaError_t Fail(cudaError_t e) {
  last_error = e;
  return e;
}

// The allocation holding [p, p + bytes), or null. Under Mem().mu.
const std::pair<const uintptr_t, Allocation>* Find(const void* p, size_t bytes) {
  auto& a = Mem().allocations;
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = a.upper_bound(u);
  if (it == a.begin()) return nullptr;
  --it;
  if (u < it->first || u + bytes > it->first + it->second.bytes) return nullptr;
  return &*it;
}

const char* KindName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "HostToHost";
    case cudaMemcpyHostToDevice:
      return "HostToDevice";
    case cudaMemcpyDeviceToHost:
      return "DeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "DeviceToDevice";
    default:
      return "Default";
  }
}

// A copy's pointers against its kind: a device side inside one allocation,
// a host side outside every allocation.
cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return Fail(cudaErrorInvalidMemcpyDirection);
  }
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return cudaSuccess;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  std::lock_guard<std::mutex> l(Mem().mu);
  auto check = [&](const void* p, bool device, const char* side) {
    const bool inside = Find(p, bytes) != nullptr;
    if (inside == device) return true;
    const bool any = Find(p, 1) != nullptr;
    std::fprintf(stderr, "CUDA emulation: cudaMemcpy%s of %zu bytes: the %s %p %s\n",
                 KindName(kind), bytes, side, p,
                 device
                     ? (any ? "runs past the end of its device allocation" : "is not device memory")
                     : "is device memory");
    return false;
  };
  if (!check(dst, dst_device, "destination") || !check(src, src_device, "source")) {
    return Fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;
};

// cudaGetErrorName's and cudaGetErrorString's answers, CUDA's words.
ErrorText Describe(cudaError_t e) {
  static constexpr ErrorText kErrors[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
      {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
       "invalid copy direction for memcpy"},
      {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
      {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
      {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
       "too many resources requested for launch"},
  };
  for (const ErrorText& t : kErrors) {
    if (t.error == e) return t;
  }
  return {e, "cudaErrorUnknown", "unknown error"};
}

// Runs `op` (a copy or a memset) as device code on just the device ranges
// among `ranges`: they are addressable while it runs, nothing else is.
template <typename Op>
void OnRanges(std::initializer_list<std::pair<const void*, size_t>> ranges, Op op) {
  std::lock_guard<std::mutex> code(Mem().device_code);
  std::vector<std::pair<void*, size_t>> device;
  {
    std::lock_guard<std::mutex> l(Mem().mu);
    for (const auto& [p, n] : ranges) {
      if (Find(p, n) != nullptr) device.emplace_back(const_cast<void*>(p), n);
    }
  }
  for (const auto& [p, n] : device) LOOM_EMU_UNPOISON(p, n);
  op();
  for (const auto& [p, n] : device) LOOM_EMU_POISON(p, n);
}

}  // namespace

int CurrentDevice() { return current_device; }

int Devices() {
  static const int n = EnvInt("LOOM_CUDA_EMU_DEVICES", 1, 0, 64);
  return n;
}

void SetLastError(cudaError_t e) { last_error = e; }

void CountLaunch() { Count().launches.fetch_add(1, std::memory_order_relaxed); }

Counters GetCounters() {
  AtomicCounters& c = Count();
  Counters out;
  out.launches = c.launches.load();
  out.mallocs = c.mallocs.load();
  out.frees = c.frees.load();
  out.copies_to_host = c.to_host.load();
  out.copies_to_device = c.to_device.load();
  out.copies_on_device = c.on_device.load();
  out.memsets = c.memsets.load();
  return out;
}

bool InDeviceMemory(const void* p, size_t bytes, int* device) {
  std::lock_guard<std::mutex> l(Mem().mu);
  const auto* a = Find(p, bytes);
  if (a != nullptr && device != nullptr) *device = a->second.device;
  return a != nullptr;
}

DeviceAccess::DeviceAccess(int device) : device_(device) {
  Mem().device_code.lock();
  std::lock_guard<std::mutex> l(Mem().mu);
  for (const auto& [p, a] : Mem().allocations) {
    if (device_ < 0 || a.device == device_) {
      LOOM_EMU_UNPOISON(reinterpret_cast<void*>(p), a.bytes);
    }
  }
}

DeviceAccess::~DeviceAccess() {
  {
    std::lock_guard<std::mutex> l(Mem().mu);
    for (const auto& [p, a] : Mem().allocations) {
      if (device_ < 0 || a.device == device_) {
        LOOM_EMU_POISON(reinterpret_cast<void*>(p), a.bytes);
      }
    }
  }
  Mem().device_code.unlock();
}

// --- Streams (stream.h). ---

bool ValidStream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> l(StreamRegistry().mu);
  return StreamRegistry().streams.count(s) > 0;
}

StreamSet& StreamRegistry() {
  static StreamSet* s = new StreamSet;
  return *s;
}

void StreamBegin(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return;
  std::lock_guard<std::mutex> l(StreamRegistry().mu);
  ++s->pending;
}

void StreamEnd(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return;
  std::lock_guard<std::mutex> l(StreamRegistry().mu);
  --s->pending;
  StreamRegistry().done.notify_all();
}

}  // namespace loom::cuda_emu

using loom::cuda_emu::Mem;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  *count = loom::cuda_emu::Devices();
  if (*count == 0) return loom::cuda_emu::Fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  const int n = loom::cuda_emu::Devices();
  if (n == 0) return loom::cuda_emu::Fail(cudaErrorNoDevice);
  if (device < 0 || device >= n) return loom::cuda_emu::Fail(cudaErrorInvalidDevice);
  loom::cuda_emu::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  *device = loom::cuda_emu::current_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaGetLastError() {
  const cudaError_t e = loom::cuda_emu::last_error;
  loom::cuda_emu::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return loom::cuda_emu::last_error; }

const char* cudaGetErrorName(cudaError_t error) { return loom::cuda_emu::Describe(error).name; }

const char* cudaGetErrorString(cudaError_t error) { return loom::cuda_emu::Describe(error).text; }

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) { return cudaRuntimeGetVersion(version); }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (loom::cuda_emu::Devices() == 0) return loom::cuda_emu::Fail(cudaErrorNoDevice);
  if (bytes == 0) return cudaSuccess;
  const int device = loom::cuda_emu::current_device;
  {
    std::lock_guard<std::mutex> l(Mem().mu);
    if (Mem().used[device] + bytes > loom::cuda_emu::Capacity()) {
      return loom::cuda_emu::Fail(cudaErrorMemoryAllocation);
    }
    Mem().used[device] += bytes;
  }
  void* p = nullptr;
  if (posix_memalign(&p, loom::cuda_emu::kAlignment, bytes) != 0) {
    std::lock_guard<std::mutex> l(Mem().mu);
    Mem().used[device] -= bytes;
    return loom::cuda_emu::Fail(cudaErrorMemoryAllocation);
  }
  LOOM_EMU_POISON(p, bytes);
  {
    std::lock_guard<std::mutex> l(Mem().mu);
    Mem().allocations[reinterpret_cast<uintptr_t>(p)] = {bytes, device};
  }
  loom::cuda_emu::Count().mallocs.fetch_add(1, std::memory_order_relaxed);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> l(Mem().mu);
    auto it = Mem().allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == Mem().allocations.end()) {
      std::fprintf(stderr, "CUDA emulation: cudaFree(%p): not the start of a device allocation\n",
                   ptr);
      return loom::cuda_emu::Fail(cudaErrorInvalidDevicePointer);
    }
    Mem().used[it->second.device] -= it->second.bytes;
    LOOM_EMU_UNPOISON(ptr, it->second.bytes);
    Mem().allocations.erase(it);
  }
  std::free(ptr);
  loom::cuda_emu::Count().frees.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(Mem().mu);
  *total = loom::cuda_emu::Capacity();
  *free = *total - Mem().used[loom::cuda_emu::current_device];
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  if (cudaError_t e = loom::cuda_emu::CheckCopy(dst, src, bytes, kind); e != cudaSuccess) return e;
  auto& c = loom::cuda_emu::Count();
  if (kind == cudaMemcpyDeviceToHost) c.to_host.fetch_add(1, std::memory_order_relaxed);
  if (kind == cudaMemcpyHostToDevice) c.to_device.fetch_add(1, std::memory_order_relaxed);
  if (kind == cudaMemcpyDeviceToDevice) c.on_device.fetch_add(1, std::memory_order_relaxed);
  loom::cuda_emu::OnRanges({{dst, bytes}, {src, bytes}}, [&] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!loom::cuda_emu::ValidStream(stream)) {
    return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  }
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!loom::cuda_emu::InDeviceMemory(dst, bytes)) {
    std::fprintf(stderr,
                 "CUDA emulation: cudaMemset of %zu bytes at %p: not inside one device "
                 "allocation\n",
                 bytes, dst);
    return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  }
  loom::cuda_emu::Count().memsets.fetch_add(1, std::memory_order_relaxed);
  loom::cuda_emu::OnRanges({{dst, bytes}}, [&] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (!loom::cuda_emu::ValidStream(stream)) {
    return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  }
  return cudaMemset(dst, value, bytes);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (stream == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  auto& r = loom::cuda_emu::StreamRegistry();
  *stream = new CUstream_st;
  (*stream)->device = loom::cuda_emu::current_device;
  std::lock_guard<std::mutex> l(r.mu);
  r.streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  auto& r = loom::cuda_emu::StreamRegistry();
  {
    std::lock_guard<std::mutex> l(r.mu);
    if (r.streams.erase(stream) == 0) return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return cudaSuccess;
  }
  auto& r = loom::cuda_emu::StreamRegistry();
  std::lock_guard<std::mutex> l(r.mu);
  if (r.streams.count(stream) == 0) return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  return stream->pending == 0 ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return cudaSuccess;
  }
  auto& r = loom::cuda_emu::StreamRegistry();
  std::unique_lock<std::mutex> l(r.mu);
  if (r.streams.count(stream) == 0) return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  r.done.wait(l, [&] { return stream->pending == 0; });
  return cudaSuccess;
}

// Events: work runs when it is issued, so an event is complete when it is
// recorded (NCCL's work is waited for through cudaStreamQuery).
struct CUevent_st {};

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr || !loom::cuda_emu::ValidStream(stream)) {
    return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (event == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr || !loom::cuda_emu::ValidStream(stream)) {
    return loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event == nullptr ? loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return event == nullptr ? loom::cuda_emu::Fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}

}  // extern "C"

#ifdef LOOM_EMU_ASAN
// Binaries built on the emulation run under AddressSanitizer, whose leak
// check at exit sometimes reports a few KiB allocated by OpenSSL's
// CRYPTO_zalloc under gRPC's TLS stack (per-thread state of gRPC's own
// threads, which it does not free before exit). It is not Loom's memory, it
// shows in roughly one run in ten, and a worker that finished its job must not
// exit 1 for it. Leaks whose allocation stack is in libcrypto are suppressed;
// every other leak still fails the run.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcrypto.so\n"; }
#endif
