// The CUDA emulation's NCCL between processes (nccl.cc): framed messages
// over a Unix stream socket. The process that draws an ncclUniqueId listens
// on the abstract socket named by its pid; a rank in another process
// connects there and its operations travel as messages to that process,
// which matches them with every other rank's (its own threads' and other
// processes'), so one place orders each group as the in-process emulation
// does. Sockets of the abstract namespace belong to a network namespace: a
// rank in another one cannot connect (and is told so).
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_EMU_NCCL_WIRE_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_EMU_NCCL_WIRE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace loom::cuda_emu::wire {

enum class Type : uint32_t {
  kJoin = 1,    // rank -> hub: payload the id's key; a nranks, b rank
  kJoined = 2,  // hub -> rank: every rank has joined
  kError = 3,   // hub -> rank: the join was refused; payload why
  kOp = 4,      // rank -> hub: id; a what (OpCode), b root or peer, c count, d type | op << 8;
                // payload the bytes it sends
  kDone = 5,    // hub -> rank: op `id` is complete; payload the bytes it receives
  kBroken = 6,  // hub -> rank: a rank of the group aborted or misused it
  kLeave = 7,   // rank -> hub: a clean end (ncclCommDestroy)
};
enum class OpCode : int64_t { kAllReduce = 0, kReduce = 1, kBroadcast = 2, kSend = 3, kRecv = 4 };

struct Header {
  uint32_t type = 0;
  uint32_t reserved = 0;
  uint64_t id = 0;
  int64_t a = 0, b = 0, c = 0, d = 0;
  uint64_t payload = 0;  // bytes after the header
};

struct Message {
  Header h;
  std::string payload;
};

// One end of a connection. Post() never blocks on the socket: a thread of
// the connection writes what was posted, in order, so that no caller holds
// a lock across a write its peer may be slow to read.
class Conn {
 public:
  explicit Conn(int fd);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  void Post(Message m);
  // The next message; false at the end of the stream or an error.
  bool Read(Message* m);
  // Writes what is posted (`flush`) or drops it, then shuts the socket in
  // both directions: a Read in progress returns false, the peer reads the
  // end. Idempotent.
  void Close(bool flush);

 private:
  void WriteLoop();

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> out_;
  bool closing_ = false, flush_ = false;
  std::thread writer_;
};

// The listening socket of process `pid` (abstract namespace); -1 on an
// error (errno says).
int Listen(int64_t pid);
// A connection to process `pid`'s listener; -1 on an error (errno says).
int Connect(int64_t pid);

}  // namespace loom::cuda_emu::wire

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_EMU_NCCL_WIRE_H_
