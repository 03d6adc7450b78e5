// NCCL for the CUDA emulation (emu.h): communicators between ranks that are
// threads of one process, found by their ncclUniqueId. A collective or a
// send/receive is issued on the rank's stream and completes when every rank
// it needs has issued its part; the last one does the work (ranks summed in
// rank order, so every rank gets the same bits). An id from another process
// is refused, by name: the emulation has no transport between processes.
#include "nccl.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_bf16.h"
#include "emu.h"
#include "stream.h"

namespace {

constexpr char kMagic[16] = "loom-cuda-emu";

struct IdBody {
  char magic[16];
  int64_t pid;
  uint64_t serial;
  uint64_t nonce;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

// Which collective a rank's part belongs to.
enum class Kind { kAllReduce, kReduce, kBroadcast };

struct Op {
  Kind kind = Kind::kAllReduce;
  int root = -1;  // kReduce, kBroadcast
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  cudaStream_t stream = nullptr;
};

struct Group;

}  // namespace

struct ncclComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  int device = 0;
  uint64_t next_collective = 0;
  std::string last_error;
};

namespace {

struct Group {
  int size = 0;
  int joined = 0;
  bool broken = false;  // a rank aborted: the others' work never completes
  std::vector<ncclComm*> members;
  std::map<uint64_t, std::map<int, Op>> collectives;           // sequence -> rank -> its part
  std::map<std::pair<int, int>, std::deque<Op>> sends, recvs;  // (from, to)
};

std::mutex mu;  // guards every group and communicator
std::condition_variable joined_cv;
std::map<std::string, std::weak_ptr<Group>>& Registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Group>>;
  return *r;
}
thread_local std::string last_error;

ncclResult_t Error(ncclComm* comm, ncclResult_t r, const std::string& why) {
  last_error = "CUDA emulation: " + why;
  if (comm != nullptr) comm->last_error = last_error;
  return r;
}

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

template <typename T>
T Combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd:
      return a * b;
    case ncclMax:
      return a > b ? a : b;
    case ncclMin:
      return a < b ? a : b;
    default:
      return a + b;
  }
}

// Arithmetic in T, or in fp32 for bf16 (rounded back after each rank's
// addition, as NCCL's ring adds in bf16 one rank at a time).
template <typename T>
T Widen(T v) {
  return v;
}
float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T, typename A>
T Narrow(A v) {
  return static_cast<T>(v);
}
template <>
__nv_bfloat16 Narrow<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

// Element i of every rank's send buffer combined in rank order, into every
// rank's receive buffer (kReduce: the root's alone).
template <typename T>
void Reduce(const std::map<int, Op>& parts, size_t count, ncclRedOp_t op) {
  std::vector<T> acc(count);
  bool first = true;
  for (const auto& [rank, part] : parts) {
    const T* x = static_cast<const T*>(part.send);
    for (size_t i = 0; i < count; ++i) {
      acc[i] = first ? x[i] : Narrow<T>(Combine(Widen(acc[i]), Widen(x[i]), op));
    }
    first = false;
  }
  if (op == ncclAvg) {
    for (T& v : acc) v = Narrow<T>(Widen(v) / static_cast<decltype(Widen(v))>(parts.size()));
  }
  for (const auto& [rank, part] : parts) {
    if (part.kind == Kind::kReduce && rank != part.root) continue;
    std::memcpy(part.recv, acc.data(), count * sizeof(T));
  }
}

ncclResult_t CheckComm(ncclComm* comm) {
  if (comm == nullptr) return Error(nullptr, ncclInvalidArgument, "a null communicator");
  if (comm->group->broken) return Error(comm, ncclRemoteError, "a rank of the group aborted");
  if (comm->group->joined < comm->group->size) {
    return Error(comm, ncclInvalidUsage, "the communicator's initialisation is not complete");
  }
  return ncclSuccess;
}

ncclResult_t CheckBuffer(ncclComm* comm, const void* p, size_t bytes, const char* what) {
  int device = -1;
  if (!loom::cuda_emu::InDeviceMemory(p, bytes, &device)) {
    return Error(comm, ncclInvalidArgument,
                 std::string(what) + " is not inside one device allocation");
  }
  if (device != comm->device) {
    return Error(comm, ncclInvalidArgument,
                 std::string(what) + " is on device " + std::to_string(device) +
                     ", the communicator's on device " + std::to_string(comm->device));
  }
  return ncclSuccess;
}

void Complete(const Op& op) { loom::cuda_emu::StreamEnd(op.stream); }

// Under mu: runs the collective `seq` if every rank has issued it.
ncclResult_t MaybeRunCollective(ncclComm* comm, Group& g, uint64_t seq) {
  auto it = g.collectives.find(seq);
  if (static_cast<int>(it->second.size()) < g.size) return ncclSuccess;
  const std::map<int, Op> parts = std::move(it->second);
  g.collectives.erase(it);
  const Op& o = parts.begin()->second;
  for (const auto& [rank, part] : parts) {
    if (part.kind != o.kind || part.root != o.root || part.count != o.count ||
        part.type != o.type || part.op != o.op) {
      g.broken = true;
      for (const auto& [r, p] : parts) Complete(p);
      return Error(comm, ncclInvalidUsage,
                   "ranks called the same collective with different kinds, roots, counts, types "
                   "or ops");
    }
  }
  if (o.kind == Kind::kBroadcast) {
    loom::cuda_emu::DeviceAccess access(-1);
    const Op& root = parts.at(o.root);
    const size_t bytes = o.count * TypeBytes(o.type);
    for (const auto& [rank, part] : parts) {
      if (part.recv != root.send) std::memmove(part.recv, root.send, bytes);
    }
  } else {
    loom::cuda_emu::DeviceAccess access(-1);
    switch (o.type) {
      case ncclFloat32:
        Reduce<float>(parts, o.count, o.op);
        break;
      case ncclFloat64:
        Reduce<double>(parts, o.count, o.op);
        break;
      case ncclInt32:
        Reduce<int32_t>(parts, o.count, o.op);
        break;
      case ncclInt64:
        Reduce<int64_t>(parts, o.count, o.op);
        break;
      case ncclUint8:
        Reduce<uint8_t>(parts, o.count, o.op);
        break;
      case ncclBfloat16:
        Reduce<__nv_bfloat16>(parts, o.count, o.op);
        break;
      default:
        break;
    }
  }
  for (const auto& [rank, part] : parts) Complete(part);
  return ncclSuccess;
}

// Under mu: a send meets its receive; both complete.
ncclResult_t Exchange(ncclComm* comm, const Op& send, const Op& recv) {
  if (send.count != recv.count) {
    comm->group->broken = true;
    Complete(send);
    Complete(recv);
    return Error(comm, ncclInvalidUsage,
                 "a send of " + std::to_string(send.count) + " bytes met a receive of " +
                     std::to_string(recv.count));
  }
  {
    loom::cuda_emu::DeviceAccess access(-1);
    std::memcpy(recv.recv, send.send, send.count);
  }
  Complete(send);
  Complete(recv);
  return ncclSuccess;
}

ncclResult_t PointToPoint(bool sending, void* buf, size_t count, ncclDataType_t type, int peer,
                          ncclComm* comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> l(mu);
  if (ncclResult_t r = CheckComm(comm); r != ncclSuccess) return r;
  Group& g = *comm->group;
  if (peer < 0 || peer >= g.size) {
    return Error(comm, ncclInvalidArgument,
                 "peer " + std::to_string(peer) + " of a group of " + std::to_string(g.size));
  }
  if (!loom::cuda_emu::ValidStream(stream)) {
    return Error(comm, ncclInvalidArgument, "an invalid stream");
  }
  const size_t bytes = count * TypeBytes(type);
  if (bytes == 0) return ncclSuccess;
  if (ncclResult_t r = CheckBuffer(comm, buf, bytes,
                                   sending ? "the send buffer"
                                           : "the receive "
                                             "buffer");
      r != ncclSuccess) {
    return r;
  }
  Op op;
  op.send = sending ? buf : nullptr;
  op.recv = sending ? nullptr : buf;
  op.count = bytes;
  op.stream = stream;
  loom::cuda_emu::StreamBegin(stream);
  const std::pair<int, int> key =
      sending ? std::make_pair(comm->rank, peer) : std::make_pair(peer, comm->rank);
  auto& mine = sending ? g.sends[key] : g.recvs[key];
  auto& theirs = sending ? g.recvs[key] : g.sends[key];
  if (theirs.empty()) {
    mine.push_back(op);
    return ncclSuccess;
  }
  const Op other = theirs.front();
  theirs.pop_front();
  return sending ? Exchange(comm, op, other) : Exchange(comm, other, op);
}

// Under mu: forgets what `comm` issued and did not complete.
void Drop(ncclComm* comm) {
  Group& g = *comm->group;
  for (auto& [seq, parts] : g.collectives) parts.erase(comm->rank);
  for (auto* queues : {&g.sends, &g.recvs}) {
    for (auto& [key, q] : *queues) {
      if (key.first == comm->rank || key.second == comm->rank) q.clear();
    }
  }
  if (g.members[comm->rank] == comm) g.members[comm->rank] = nullptr;
}

// A rank's part of collective `kind` (an all-reduce, or a reduce or
// broadcast to `root`); the last part issued runs it.
ncclResult_t Collective(Kind kind, int root, const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm* comm,
                        cudaStream_t stream) {
  std::lock_guard<std::mutex> l(mu);
  if (ncclResult_t r = CheckComm(comm); r != ncclSuccess) return r;
  if (!loom::cuda_emu::ValidStream(stream)) {
    return Error(comm, ncclInvalidArgument, "an invalid stream");
  }
  if (datatype == ncclFloat16 || datatype == ncclInt8 || datatype == ncclUint32 ||
      datatype == ncclUint64) {
    return Error(comm, ncclInvalidArgument, "a collective type the emulation does not have");
  }
  if (kind != Kind::kAllReduce && (root < 0 || root >= comm->group->size)) {
    return Error(
        comm, ncclInvalidArgument,
        "root " + std::to_string(root) + " of a group of " + std::to_string(comm->group->size));
  }
  const size_t bytes = count * TypeBytes(datatype);
  // A reduce's non-root ranks and a broadcast's root only send; the others
  // receive too.
  const bool sends = kind != Kind::kBroadcast || comm->rank == root;
  const bool receives = kind == Kind::kAllReduce || comm->rank == root || kind == Kind::kBroadcast;
  if (bytes > 0) {
    if (sends) {
      if (ncclResult_t r = CheckBuffer(comm, sendbuff, bytes, "the send buffer");
          r != ncclSuccess) {
        return r;
      }
    }
    if (receives) {
      if (ncclResult_t r = CheckBuffer(comm, recvbuff, bytes, "the receive buffer");
          r != ncclSuccess) {
        return r;
      }
    }
  }
  Group& g = *comm->group;
  const uint64_t seq = comm->next_collective++;
  Op part;
  part.kind = kind;
  part.root = root;
  part.send = sendbuff;
  part.recv = recvbuff;
  part.count = count;
  part.type = datatype;
  part.op = op;
  part.stream = stream;
  loom::cuda_emu::StreamBegin(stream);
  g.collectives[seq][comm->rank] = part;
  return MaybeRunCollective(comm, g, seq);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  static std::atomic<uint64_t> serial{0};
  IdBody b;
  std::memcpy(b.magic, kMagic, sizeof(b.magic));
  b.pid = static_cast<int64_t>(getpid());
  b.serial = serial.fetch_add(1);
  b.nonce = std::random_device{}();
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &b, sizeof(b));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr) return Error(nullptr, ncclInvalidArgument, "a null communicator pointer");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Error(nullptr, ncclInvalidArgument,
                 "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || loom::cuda_emu::Devices() == 0) {
    return Error(nullptr, ncclUnhandledCudaError, "no CUDA device");
  }
  IdBody b;
  std::memcpy(&b, id.internal, sizeof(b));
  if (std::memcmp(b.magic, kMagic, sizeof(kMagic)) != 0) {
    return Error(nullptr, ncclInvalidArgument, "not an ncclUniqueId of this emulation");
  }
  if (b.pid != static_cast<int64_t>(getpid())) {
    Error(nullptr, ncclInvalidUsage,
          "this NCCL connects ranks that are threads of one process; the id comes from process " +
              std::to_string(b.pid));
    std::fprintf(stderr, "%s\n", last_error.c_str());
    return ncclInvalidUsage;
  }
  const std::string key(id.internal, sizeof(b));
  std::unique_lock<std::mutex> l(mu);
  std::shared_ptr<Group> g = Registry()[key].lock();
  if (g == nullptr) {
    g = std::make_shared<Group>();
    g->size = nranks;
    g->members.assign(nranks, nullptr);
    Registry()[key] = g;
  }
  if (g->size != nranks) {
    return Error(nullptr, ncclInvalidUsage,
                 "ranks of one id disagree on its size (" + std::to_string(g->size) + " and " +
                     std::to_string(nranks) + ")");
  }
  if (g->members[rank] != nullptr) {
    return Error(nullptr, ncclInvalidUsage, "rank " + std::to_string(rank) + " joined twice");
  }
  ncclComm* c = new ncclComm;
  c->group = g;
  c->rank = rank;
  c->device = device;
  g->members[rank] = c;
  ++g->joined;
  joined_cv.notify_all();
  *comm = c;
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) return g->joined == g->size ? ncclSuccess : ncclInProgress;
  joined_cv.wait(l, [&] { return g->joined == g->size || g->broken; });
  return g->broken ? ncclRemoteError : ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  std::lock_guard<std::mutex> l(mu);
  const Group& g = *comm->group;
  *state = g.broken ? ncclRemoteError : g.joined < g.size ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> l(mu);
    Drop(comm);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> l(mu);
    Drop(comm);
    comm->group->broken = true;
    joined_cv.notify_all();
  }
  delete comm;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr && !comm->last_error.empty()) return comm->last_error.c_str();
  return last_error.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return Collective(Kind::kAllReduce, -1, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return Collective(Kind::kReduce, root, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return Collective(Kind::kBroadcast, root, sendbuff, recvbuff, count, datatype, ncclSum, comm,
                    stream);
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return PointToPoint(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return PointToPoint(false, recvbuff, count, datatype, peer, comm, stream);
}

}  // extern "C"
