// Tensor bytes between processes over UCX (Debian libucx 1.13): tagged
// messages between workers that found each other through gRPC (a worker's
// address travels in a gRPC message; the bytes never do).
//
// One UcxEndpointSet per process side: it owns a ucp context and worker, is
// thread-safe (one mutex serialises every ucp call), and keeps one endpoint
// per remote address. Transports are UCX's choice (shared memory, CMA or TCP
// on one host; RDMA where present); UCX_TLS narrows them, e.g. UCX_TLS=tcp.
//
// Sends are asynchronous: Send() keeps the bytes alive (shared_ptr) until
// UCX is done with them. A background thread drives progress (sleeping on
// the worker's event fd when idle), since a peer's wire-up and every
// rendezvous need this side to make progress too; while a transfer is in
// flight it polls for ~100 µs before sleeping. Endpoints ask UCX for
// peer-failure handling, so that a peer killed in the middle of a transfer
// fails the transfer instead of aborting this process (UCX 1.13 then offers
// only TCP between processes of one host: LOOM_UCX_PEER_ERRORS=0 turns it
// off for shared memory and CMA, at that risk). Receives
// block with a deadline and cancel cleanly on timeout, so a peer that dies
// or never sends cannot hang the caller (RecvAll: buffers with owners).
#ifndef LOOM_RUNTIME_COMM_UCX_H_
#define LOOM_RUNTIME_COMM_UCX_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom {

// Whether endpoints ask UCX for peer-failure handling (the default; not
// with LOOM_UCX_PEER_ERRORS=0). ucx_perftest's -e is the same.
bool PeerErrorHandling();

class UcxWorker {
 public:
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create();
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This worker's address, to hand to peers.
  const std::string& address() const { return address_; }

  // Sends `size` bytes at `data` to the worker at `remote_address` with
  // `tag`. `keep_alive` owns the bytes until the send completes; `done`
  // (optional) runs then, from a Progress() call, with the outcome. A send
  // still in flight after the send timeout (its receiver gone, or never
  // asking for it) fails: its endpoint is closed, which ends every send on
  // it with an error and releases their bytes; the next Send to that
  // address makes a new endpoint. Only with peer-failure handling (UCX
  // allows closing an endpoint with sends in flight only then).
  absl::Status Send(const std::string& remote_address, uint64_t tag, const void* data, size_t size,
                    std::shared_ptr<const void> keep_alive,
                    std::function<void(absl::Status)> done = nullptr);

  struct RecvBuffer {
    uint64_t tag;
    void* data;
    size_t size;  // exactly this many bytes are expected
    // Owns `data` (optional): see RecvAll.
    std::shared_ptr<void> keep_alive = nullptr;
  };
  // Receives every buffer (any order of arrival), driving progress until
  // all arrived or `timeout` passed: DEADLINE_EXCEEDED then, and the
  // outstanding receives are cancelled. DATA_LOSS on a size mismatch.
  //
  // UCX cannot cancel a receive that already matched a message still
  // arriving (a rendezvous whose sender died or is cut off mid-transfer):
  // when every buffer has a keep_alive, RecvAll returns at once anyway and
  // this worker keeps such receives, and their buffers, until they end;
  // without one it waits for them.
  absl::Status RecvAll(const std::vector<RecvBuffer>& buffers, absl::Duration timeout);

  // Makes every RecvAll in progress, and every later one, return CANCELLED
  // (a process shutting down, or a job regrouping). Thread-safe.
  void Cancel();
  // Ends Cancel(): receives wait again (a regrouped job goes on).
  void ClearCancel();
  bool cancelled() const { return cancelled_.load(); }

  // Waits until no send is in flight or `timeout` passed.
  bool Flush(absl::Duration timeout);

  // How long a send may stay in flight (default kSendTimeout).
  void SetSendTimeout(absl::Duration timeout);
  static constexpr absl::Duration kSendTimeout = absl::Minutes(10);

  struct Stats {
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    int64_t send_errors = 0;
    int64_t receives_abandoned = 0;  // left to finish after a cancel or timeout (RecvAll)
    int64_t sends_expired = 0;       // failed by the send timeout (also in send_errors)
  };
  Stats stats() const;

 private:
  struct Impl;
  explicit UcxWorker(std::unique_ptr<Impl> impl);
  absl::StatusOr<void*> Endpoint(const std::string& remote_address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ProgressLoop();
  // Closes the endpoints of sends past their deadline (at most once a
  // second; see Send).
  void ExpireSendsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Impl> impl_;
  std::string address_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> cancelled_{false};
  std::thread progress_thread_;
  std::map<std::string, void*> endpoints_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int receiving_ ABSL_GUARDED_BY(mu_) = 0;  // RecvAll calls driving progress
  absl::Duration send_timeout_ ABSL_GUARDED_BY(mu_) = kSendTimeout;
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // RecvAll calls that returned with receives UCX could not cancel: their
  // requests and buffers, freed once those end.
  struct RecvBatch;
  std::vector<std::unique_ptr<RecvBatch>> abandoned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_RUNTIME_COMM_UCX_H_
