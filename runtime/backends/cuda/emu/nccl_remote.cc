// The CUDA emulation's NCCL across processes (nccl_group.h): a rank of
// another process joins its group's hub over a socket (nccl_wire.h), and the
// hub keeps a proxy for it. The remote rank's operations travel to the hub as
// messages with the bytes they send; its proxy issues them there, and their
// completions travel back with the bytes they receive.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "emu.h"
#include "nccl_group.h"
#include "nccl_wire.h"
#include "stream.h"

namespace loom::cuda_emu::nccl_group {
namespace {

// Under mu: a proxy's operation, as its rank issued it in `m`.
void IssueForProxy(ncclComm* proxy, const std::shared_ptr<wire::Conn>& conn, wire::Message m) {
  auto p = std::make_shared<ProxyOp>();
  p->conn = conn;
  p->id = m.h.id;
  p->send = std::move(m.payload);
  const auto what = static_cast<wire::OpCode>(m.h.a);
  const int root_or_peer = static_cast<int>(m.h.b);
  Op op;
  op.proxy = p;
  op.count = static_cast<size_t>(m.h.c);
  op.type = static_cast<ncclDataType_t>(m.h.d & 0xff);
  op.op = static_cast<ncclRedOp_t>(m.h.d >> 8);
  const bool rooted = what != wire::OpCode::kAllReduce;  // a root or a peer
  if (CheckComm(proxy) != ncclSuccess ||
      (rooted && (root_or_peer < 0 || root_or_peer >= proxy->nranks))) {
    Break(*proxy->group);
    Complete(op);
    return;
  }
  if (what == wire::OpCode::kSend || what == wire::OpCode::kRecv) {
    const bool sending = what == wire::OpCode::kSend;
    if (!sending) p->recv.resize(op.count);
    op.send = p->send.data();
    op.recv = p->recv.data();
    IssuePointToPoint(proxy, sending, root_or_peer, op);
    return;
  }
  op.kind = what == wire::OpCode::kAllReduce ? Kind::kAllReduce
            : what == wire::OpCode::kReduce  ? Kind::kReduce
                                             : Kind::kBroadcast;
  op.root = op.kind == Kind::kAllReduce ? -1 : root_or_peer;
  if (Receives(op.kind, proxy->rank, op.root)) p->recv.resize(op.count * TypeBytes(op.type));
  op.send = p->send.data();
  op.recv = p->recv.data();
  IssueCollective(proxy, op);
}

// The hub's side of one remote rank: its join, then its operations until it
// leaves (or its process ends: the group breaks).
void ServeRemote(int fd) {
  auto conn = std::make_shared<wire::Conn>(fd);
  wire::Message m;
  if (!conn->Read(&m) || m.h.type != static_cast<uint32_t>(wire::Type::kJoin)) {
    conn->Close(false);
    return;
  }
  auto* proxy = new ncclComm;
  proxy->conn = conn;
  proxy->device = -1;
  {
    std::lock_guard<std::mutex> l(mu);
    std::string why;
    const int nranks = static_cast<int>(m.h.a), rank = static_cast<int>(m.h.b);
    if (nranks < 1 || rank < 0 || rank >= nranks) {
      why = "rank " + std::to_string(rank) + " of " + std::to_string(nranks);
    }
    if (!why.empty() || !JoinGroup(m.payload, nranks, rank, proxy, &why)) {
      wire::Message e;
      e.h.type = static_cast<uint32_t>(wire::Type::kError);
      e.payload = why;
      conn->Post(std::move(e));
      delete proxy;
      conn->Close(true);
      return;
    }
  }
  bool left = false;
  while (conn->Read(&m)) {
    if (m.h.type == static_cast<uint32_t>(wire::Type::kLeave)) {
      left = true;
      break;
    }
    if (m.h.type != static_cast<uint32_t>(wire::Type::kOp)) break;
    std::lock_guard<std::mutex> l(mu);
    IssueForProxy(proxy, conn, std::move(m));
  }
  {
    std::lock_guard<std::mutex> l(mu);
    Drop(proxy);
    if (!left) Break(*proxy->group);
  }
  conn->Close(left);
  delete proxy;
}

// A remote rank's reader: the hub's answers, until the connection ends.
void ReadHub(ncclComm* comm) {
  wire::Message m;
  while (comm->conn->Read(&m)) {
    std::lock_guard<std::mutex> l(mu);
    switch (static_cast<wire::Type>(m.h.type)) {
      case wire::Type::kJoined:
        comm->joined = true;
        break;
      case wire::Type::kError:
        comm->join_error = "the hub refused the join: " + m.payload;
        comm->broken = true;
        break;
      case wire::Type::kBroken:
        comm->broken = true;
        break;
      case wire::Type::kDone: {
        auto it = comm->pending.find(m.h.id);
        if (it == comm->pending.end()) break;
        if (it->second.bytes > 0 && m.payload.size() == it->second.bytes) {
          DeviceAccess access(-1);
          std::memcpy(it->second.recv, m.payload.data(), m.payload.size());
        }
        StreamEnd(it->second.stream);
        comm->pending.erase(it);
        break;
      }
      default:
        break;
    }
    joined_cv.notify_all();
  }
  std::lock_guard<std::mutex> l(mu);
  comm->broken = true;  // after a leave, nothing asks
  joined_cv.notify_all();
}

}  // namespace

// Under mu: a remote rank's operation, sent to its hub with the `send_bytes`
// it sends; its completion brings `recv_bytes` into `recv`.
ncclResult_t IssueRemote(ncclComm* comm, wire::OpCode what, int64_t root_or_peer, size_t count,
                         ncclDataType_t type, ncclRedOp_t op, const void* send, size_t send_bytes,
                         void* recv, size_t recv_bytes, cudaStream_t stream) {
  wire::Message m;
  m.h.type = static_cast<uint32_t>(wire::Type::kOp);
  m.h.id = comm->next_op++;
  m.h.a = static_cast<int64_t>(what);
  m.h.b = root_or_peer;
  m.h.c = static_cast<int64_t>(count);
  m.h.d = static_cast<int64_t>(type) | (static_cast<int64_t>(op) << 8);
  if (send_bytes > 0) {
    DeviceAccess access(-1);
    m.payload.assign(static_cast<const char*>(send), send_bytes);
  }
  StreamBegin(stream);
  comm->pending[m.h.id] = Pending{recv, recv_bytes, stream};
  comm->conn->Post(std::move(m));
  return ncclSuccess;
}

// This process's listener for ranks of other processes (once, at its first
// ncclGetUniqueId); its threads live as long as the process.
void StartHub() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int fd = wire::Listen(static_cast<int64_t>(getpid()));
    if (fd < 0) {
      std::fprintf(stderr,
                   "CUDA emulation: NCCL ranks of other processes cannot join this one's groups: "
                   "listen: %s\n",
                   std::strerror(errno));
      return;
    }
    std::thread([fd] {
      for (;;) {
        const int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          return;
        }
        std::thread(ServeRemote, c).detach();
      }
    }).detach();
  });
}

// Joins the group of id `b` held by another process, as `comm`.
ncclResult_t JoinRemote(const IdBody& b, const std::string& key, int nranks, ncclComm* comm) {
  const int fd = wire::Connect(b.pid);
  if (fd < 0) {
    return Error(
        nullptr, ncclSystemError,
        "cannot reach the NCCL id's process " + std::to_string(b.pid) +
            " (it has ended, or is in another network namespace): " + std::strerror(errno));
  }
  comm->remote = true;
  comm->nranks = nranks;
  comm->conn = std::make_shared<wire::Conn>(fd);
  wire::Message j;
  j.h.type = static_cast<uint32_t>(wire::Type::kJoin);
  j.h.a = nranks;
  j.h.b = comm->rank;
  j.payload = key;
  comm->conn->Post(std::move(j));
  comm->reader = std::thread(ReadHub, comm);
  return ncclSuccess;
}

// A remote rank's end: a leave (`clean`) or not, then its reader.
void EndRemote(ncclComm* comm, bool clean) {
  if (clean) {
    wire::Message m;
    m.h.type = static_cast<uint32_t>(wire::Type::kLeave);
    comm->conn->Post(std::move(m));
  }
  comm->conn->Close(clean);
  if (comm->reader.joinable()) comm->reader.join();
}

}  // namespace loom::cuda_emu::nccl_group
