// The CUDA emulation's NCCL groups (internal): what nccl.cc, which matches
// every rank's operations, shares with nccl_remote.cc, which reaches ranks of
// other processes (a remote rank's side and its proxy's at the hub).
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_EMU_NCCL_GROUP_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_EMU_NCCL_GROUP_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nccl.h"
#include "nccl_wire.h"

namespace loom::cuda_emu::nccl_group {

inline constexpr char kMagic[16] = "loom-cuda-emu";

struct IdBody {
  char magic[16];
  int64_t pid;
  uint64_t serial;
  uint64_t nonce;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

// Which collective a rank's part belongs to.
enum class Kind { kAllReduce, kReduce, kBroadcast };

// A proxy's operation at the hub: its bytes, and where its completion goes.
struct ProxyOp {
  std::shared_ptr<wire::Conn> conn;
  uint64_t id = 0;
  std::string send, recv;
};

struct Op {
  Kind kind = Kind::kAllReduce;
  int root = -1;  // kReduce, kBroadcast
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  cudaStream_t stream = nullptr;
  std::shared_ptr<ProxyOp> proxy;  // a rank of another process: completes there
};

struct Group;

// A remote rank's operation in flight: where its received bytes go.
struct Pending {
  void* recv = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
};

}  // namespace loom::cuda_emu::nccl_group

struct ncclComm {
  std::shared_ptr<loom::cuda_emu::nccl_group::Group> group;  // null for a remote rank
  int rank = 0;
  int nranks = 0;
  int device = 0;
  uint64_t next_collective = 0;
  std::string last_error;
  // At the hub, a proxy for a rank of another process; in that process, the
  // remote rank: its connection (the other's ends are unused).
  std::shared_ptr<loom::cuda_emu::wire::Conn> conn;
  // A remote rank's state, under mu; its reader thread applies the hub's
  // messages.
  bool remote = false;
  bool joined = false, broken = false;
  std::string join_error;
  uint64_t next_op = 0;
  std::map<uint64_t, loom::cuda_emu::nccl_group::Pending> pending;
  std::thread reader;
};

namespace loom::cuda_emu::nccl_group {

struct Group {
  int size = 0;
  int joined = 0;
  bool broken = false;  // a rank aborted: the others' work never completes
  std::vector<ncclComm*> members;
  std::map<uint64_t, std::map<int, Op>> collectives;           // sequence -> rank -> its part
  std::map<std::pair<int, int>, std::deque<Op>> sends, recvs;  // (from, to)
};

extern std::mutex mu;  // guards every group and communicator
extern std::condition_variable joined_cv;

// Under mu: the group cannot go on (a rank aborted or misused it); its
// remote ranks are told.
void Break(Group& g);
// Records `why` as the last error (the thread's and `comm`'s) and returns `r`.
ncclResult_t Error(ncclComm* comm, ncclResult_t r, const std::string& why);
size_t TypeBytes(ncclDataType_t t);
// Whether `comm` can take an operation (joined, not broken); an error if not.
ncclResult_t CheckComm(ncclComm* comm);
// A part done: its stream's count falls, or (a proxy's) its rank is sent
// the bytes it receives.
void Complete(const Op& op);
// Under mu: a send or receive of `op.count` bytes between `comm` and
// `peer` meets its match, or waits for it.
ncclResult_t IssuePointToPoint(ncclComm* comm, bool sending, int peer, const Op& op);
// Under mu: `comm`'s part of its next collective; the last part issued runs
// it.
ncclResult_t IssueCollective(ncclComm* comm, const Op& part);
// Under mu: forgets what `comm` issued and did not complete.
void Drop(ncclComm* comm);
// Whether rank `rank` receives in collective `kind` rooted at `root`.
bool Receives(Kind kind, int rank, int root);
// Under mu: `c` (rank `rank` of `nranks`) joins the group of id `key`,
// which it makes if it is the first; false with `why` if it cannot. The
// last rank to join tells the remote ranks.
bool JoinGroup(const std::string& key, int nranks, int rank, ncclComm* c, std::string* why);

// nccl_remote.cc.
// Under mu: a remote rank's operation, sent to its hub with the `send_bytes`
// it sends; its completion brings `recv_bytes` into `recv`.
ncclResult_t IssueRemote(ncclComm* comm, wire::OpCode what, int64_t root_or_peer, size_t count,
                         ncclDataType_t type, ncclRedOp_t op, const void* send, size_t send_bytes,
                         void* recv, size_t recv_bytes, cudaStream_t stream);
// This process's listener for ranks of other processes (once, at its first
// ncclGetUniqueId); its threads live as long as the process.
void StartHub();
// Joins the group of id `b` held by another process, as `comm`.
ncclResult_t JoinRemote(const IdBody& b, const std::string& key, int nranks, ncclComm* comm);
// A remote rank's end: a leave (`clean`) or not, then its reader.
void EndRemote(ncclComm* comm, bool clean);

}  // namespace loom::cuda_emu::nccl_group

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_EMU_NCCL_GROUP_H_
