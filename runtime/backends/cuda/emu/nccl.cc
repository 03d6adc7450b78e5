// NCCL for the CUDA emulation (emu.h): communicators between ranks found by
// their ncclUniqueId. A collective or a send/receive is issued on the rank's
// stream and completes when every rank it needs has issued its part; the
// last one does the work (ranks summed in rank order, so every rank gets the
// same bits).
//
// Ranks may be threads of one process or processes of one machine (and
// network namespace): the process that drew the id holds the group
// (its "hub"); a rank of another process joins over a socket (nccl_wire.h)
// and the hub keeps a proxy for it, whose operations arrive as messages
// with the bytes they send and complete by sending back the bytes they
// receive. A rank process that ends without leaving (killed, or
// ncclCommAbort) breaks the group, as does a hub that ends: every other
// rank's ncclCommGetAsyncError then says ncclRemoteError.
#include "nccl.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_bf16.h"
#include "emu.h"
#include "nccl_group.h"
#include "nccl_wire.h"
#include "stream.h"

namespace loom::cuda_emu::nccl_group {

std::mutex mu;
std::condition_variable joined_cv;
std::map<std::string, std::weak_ptr<Group>>& Registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Group>>;
  return *r;
}
thread_local std::string last_error;

void Break(Group& g) {
  if (g.broken) return;
  g.broken = true;
  joined_cv.notify_all();
  for (ncclComm* m : g.members) {
    if (m == nullptr || m->conn == nullptr) continue;
    wire::Message b;
    b.h.type = static_cast<uint32_t>(wire::Type::kBroken);
    m->conn->Post(std::move(b));
  }
}

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
  if (comm->remote) {
    if (comm->broken) {
      return Error(comm, ncclRemoteError,
                   comm->join_error.empty() ? "a rank of the group aborted, or its hub ended"
                                            : comm->join_error);
    }
    if (!comm->joined) {
      return Error(comm, ncclInvalidUsage, "the communicator's initialisation is not complete");
    }
    return ncclSuccess;
  }
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

// A part done: its stream's count falls, or (a proxy's) its rank is sent
// the bytes it receives.
void Complete(const Op& op) {
  if (op.proxy == nullptr) {
    loom::cuda_emu::StreamEnd(op.stream);
    return;
  }
  wire::Message m;
  m.h.type = static_cast<uint32_t>(wire::Type::kDone);
  m.h.id = op.proxy->id;
  m.payload = std::move(op.proxy->recv);
  op.proxy->conn->Post(std::move(m));
}

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
      Break(g);
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
    Break(*comm->group);
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

// Under mu: a send or receive of `op.count` bytes between `comm` and
// `peer` meets its match, or waits for it.
ncclResult_t IssuePointToPoint(ncclComm* comm, bool sending, int peer, const Op& op) {
  Group& g = *comm->group;
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

ncclResult_t PointToPoint(bool sending, void* buf, size_t count, ncclDataType_t type, int peer,
                          ncclComm* comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> l(mu);
  if (ncclResult_t r = CheckComm(comm); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks) {
    return Error(comm, ncclInvalidArgument,
                 "peer " + std::to_string(peer) + " of a group of " + std::to_string(comm->nranks));
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
  if (comm->remote) {
    return IssueRemote(comm, sending ? wire::OpCode::kSend : wire::OpCode::kRecv, peer, bytes,
                       ncclUint8, ncclSum, sending ? buf : nullptr, sending ? bytes : 0,
                       sending ? nullptr : buf, sending ? 0 : bytes, stream);
  }
  Op op;
  op.send = sending ? buf : nullptr;
  op.recv = sending ? nullptr : buf;
  op.count = bytes;
  op.stream = stream;
  loom::cuda_emu::StreamBegin(stream);
  return IssuePointToPoint(comm, sending, peer, op);
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

// Whether rank `rank` sends and receives in collective `kind` rooted at
// `root`: a reduce's non-root ranks and a broadcast's root only send; the
// others receive too.
bool Sends(Kind kind, int rank, int root) { return kind != Kind::kBroadcast || rank == root; }
bool Receives(Kind kind, int rank, int root) {
  return kind == Kind::kAllReduce || rank == root || kind == Kind::kBroadcast;
}

// Under mu: `comm`'s part of its next collective; the last part issued runs
// it.
ncclResult_t IssueCollective(ncclComm* comm, const Op& part) {
  Group& g = *comm->group;
  const uint64_t seq = comm->next_collective++;
  g.collectives[seq][comm->rank] = part;
  return MaybeRunCollective(comm, g, seq);
}

// A rank's part of collective `kind` (an all-reduce, or a reduce or
// broadcast to `root`).
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
  if (kind != Kind::kAllReduce && (root < 0 || root >= comm->nranks)) {
    return Error(comm, ncclInvalidArgument,
                 "root " + std::to_string(root) + " of a group of " + std::to_string(comm->nranks));
  }
  const size_t bytes = count * TypeBytes(datatype);
  const bool sends = Sends(kind, comm->rank, root);
  const bool receives = Receives(kind, comm->rank, root);
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
  if (comm->remote) {
    const wire::OpCode what = kind == Kind::kAllReduce ? wire::OpCode::kAllReduce
                              : kind == Kind::kReduce  ? wire::OpCode::kReduce
                                                       : wire::OpCode::kBroadcast;
    return IssueRemote(comm, what, root, count, datatype, op, sendbuff, sends ? bytes : 0, recvbuff,
                       receives ? bytes : 0, stream);
  }
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
  return IssueCollective(comm, part);
}

// Under mu: `c` (rank `rank` of `nranks`) joins the group of id `key`,
// which it makes if it is the first; false with `why` if it cannot. The
// last rank to join tells the remote ranks.
bool JoinGroup(const std::string& key, int nranks, int rank, ncclComm* c, std::string* why) {
  std::shared_ptr<Group> g = Registry()[key].lock();
  if (g == nullptr) {
    g = std::make_shared<Group>();
    g->size = nranks;
    g->members.assign(nranks, nullptr);
    Registry()[key] = g;
  }
  if (g->size != nranks) {
    *why = "ranks of one id disagree on its size (" + std::to_string(g->size) + " and " +
           std::to_string(nranks) + ")";
    return false;
  }
  if (g->members[rank] != nullptr) {
    *why = "rank " + std::to_string(rank) + " joined twice";
    return false;
  }
  c->group = g;
  c->rank = rank;
  c->nranks = nranks;
  g->members[rank] = c;
  ++g->joined;
  joined_cv.notify_all();
  if (g->joined == g->size) {
    for (ncclComm* m : g->members) {
      if (m->conn == nullptr) continue;
      wire::Message j;
      j.h.type = static_cast<uint32_t>(wire::Type::kJoined);
      m->conn->Post(std::move(j));
    }
  }
  return true;
}

}  // namespace loom::cuda_emu::nccl_group

using namespace loom::cuda_emu::nccl_group;  // NOLINT: this file's vocabulary

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  StartHub();
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
  const std::string key(id.internal, sizeof(b));
  const bool blocking = config == nullptr || config->blocking != 0;
  ncclComm* c = new ncclComm;
  c->device = device;
  if (b.pid != static_cast<int64_t>(getpid())) {
    c->rank = rank;
    if (ncclResult_t r = JoinRemote(b, key, nranks, c); r != ncclSuccess) {
      delete c;
      return r;
    }
    *comm = c;
    std::unique_lock<std::mutex> l(mu);
    if (!blocking) return c->broken ? ncclRemoteError : c->joined ? ncclSuccess : ncclInProgress;
    joined_cv.wait(l, [&] { return c->joined || c->broken; });
    if (c->broken) Error(c, ncclRemoteError, c->join_error);
    return c->broken ? ncclRemoteError : ncclSuccess;
  }
  std::unique_lock<std::mutex> l(mu);
  std::string why;
  if (!JoinGroup(key, nranks, rank, c, &why)) {
    delete c;
    return Error(nullptr, ncclInvalidUsage, why);
  }
  Group* g = c->group.get();
  *comm = c;
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
  if (comm->remote) {
    *state = comm->broken ? ncclRemoteError : comm->joined ? ncclSuccess : ncclInProgress;
    return ncclSuccess;
  }
  const Group& g = *comm->group;
  *state = g.broken ? ncclRemoteError : g.joined < g.size ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->remote) {
    EndRemote(comm, /*clean=*/true);
    delete comm;
    return ncclSuccess;
  }
  {
    std::lock_guard<std::mutex> l(mu);
    Drop(comm);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (comm->remote) {
    EndRemote(comm, /*clean=*/false);
    delete comm;
    return ncclSuccess;
  }
  {
    std::lock_guard<std::mutex> l(mu);
    Drop(comm);
    Break(*comm->group);
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
