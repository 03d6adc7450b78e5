#include "runtime/comm/ucx.h"

#include <poll.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
// clang-format off
#include <ucp/api/ucp.h>
// clang-format on

namespace loom {

namespace {
struct EpErrorArg {
  std::vector<ucp_ep_h>* dead;
  std::map<std::string, void*>* endpoints;
};
}  // namespace

struct SendOp;

struct UcxWorker::Impl {
  EpErrorArg error_arg{};
  std::set<SendOp*> sends;  // in flight (SendDone takes them out)
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;
  std::vector<ucp_ep_h> dead;  // endpoints whose peer failed, closed on the next call
  // Signalled (with mu_ held) when the last RecvAll driving progress returns,
  // and on shutdown: the progress thread waits on it meanwhile.
  absl::CondVar receivers_done;
};

namespace {

// A worker address travels inside an envelope: "LUCX", the raw length (4
// bytes, little endian) and an FNV-1a hash of the raw bytes (8 bytes). UCX
// parses raw addresses with assertions that abort the process, so bytes
// that did not come from UcxWorker::address() must be refused before UCX
// sees them.
constexpr char kMagic[4] = {'L', 'U', 'C', 'X'};
constexpr size_t kEnvelope = 16;

uint64_t Fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ULL;
  return h;
}

std::string Seal(const std::string& raw) {
  std::string out(kEnvelope, '\0');
  std::memcpy(out.data(), kMagic, 4);
  const uint32_t n = static_cast<uint32_t>(raw.size());
  const uint64_t h = Fnv1a(raw.data(), raw.size());
  std::memcpy(out.data() + 4, &n, 4);
  std::memcpy(out.data() + 8, &h, 8);
  return out + raw;
}

absl::StatusOr<std::string> Unseal(const std::string& sealed) {
  uint32_t n = 0;
  uint64_t h = 0;
  if (sealed.size() >= kEnvelope) {
    std::memcpy(&n, sealed.data() + 4, 4);
    std::memcpy(&h, sealed.data() + 8, 8);
  }
  if (sealed.size() < kEnvelope || std::memcmp(sealed.data(), kMagic, 4) != 0 ||
      n != sealed.size() - kEnvelope || h != Fnv1a(sealed.data() + kEnvelope, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a Loom UCX worker address (", sealed.size(), " bytes)"));
  }
  return sealed.substr(kEnvelope);
}

absl::Status UcsError(const char* what, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat("UCX ", what, ": ", ucs_status_string(s)));
}

// Progress once; if nothing happened, sleep on the worker's event fd for at
// most `max_wait_ms` (so a waiting thread does not spin on a 2-core box).
void ProgressOrWait(ucp_worker_h worker, int efd, int max_wait_ms) {
  if (ucp_worker_progress(worker) != 0) return;
  if (efd >= 0 && ucp_worker_arm(worker) == UCS_OK) {
    pollfd p{efd, POLLIN, 0};
    ::poll(&p, 1, max_wait_ms);
  }
}

// Idle polls before sleeping on the event fd while work is outstanding
// (~100 µs): a transfer in flight usually has its next event within
// microseconds, and shared-memory transports' events wake late.
constexpr int kSpins = 2000;

// While this worker's own sends are in flight, a waiting RecvAll keeps
// polling this long after the last event before it sleeps: a rendezvous
// send completes only through this side's progress, and its events (one per
// message: ~1 ms apart at 8 MiB) come further apart than kSpins polls.
// Sleeping between them (and being woken by the peer) cost ~10% of the
// throughput of a transfer in flight on a 2-core host.
constexpr absl::Duration kInFlightSpin = absl::Milliseconds(2);

void CloseEndpoint(ucp_worker_h worker, ucp_ep_h ep) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(r);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create() {
  auto impl = std::make_unique<Impl>();
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcsError("config", s);
  }
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  ucs_status_t s = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (s != UCS_OK) return UcsError("init", s);
  ucp_worker_params_t wp;
  std::memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // our mutex serialises every call
  if (s = ucp_worker_create(impl->context, &wp, &impl->worker); s != UCS_OK) {
    ucp_cleanup(impl->context);
    return UcsError("worker", s);
  }
  if (ucp_worker_get_efd(impl->worker, &impl->efd) != UCS_OK) impl->efd = -1;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (s = ucp_worker_get_address(impl->worker, &addr, &len); s != UCS_OK) {
    ucp_worker_destroy(impl->worker);
    ucp_cleanup(impl->context);
    return UcsError("address", s);
  }
  std::string address(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(impl->worker, addr);
  std::unique_ptr<UcxWorker> w(new UcxWorker(std::move(impl)));
  w->address_ = Seal(address);
  w->progress_thread_ = std::thread([p = w.get()] { p->ProgressLoop(); });
  return w;
}

UcxWorker::UcxWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void UcxWorker::ProgressLoop() {
  int idle_polls = 0;
  for (;;) {
    bool sleep = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (receiving_ > 0) {
        // A RecvAll is driving progress itself; polling here too would only
        // take a core from it. Wait for it to finish without waking: a
        // wake-up every millisecond to look (as this did) preempted the
        // spinning RecvAll on a 2-core host and contended mu_ with it (or
        // held mu_ while descheduled), costing a third of the throughput
        // against raw UCP.
        impl_->receivers_done.Wait(&mu_);
        continue;
      }
      ExpireSendsLocked();
      if (ucp_worker_progress(impl_->worker) != 0) {
        idle_polls = 0;
        continue;
      }
      // Sends in flight: keep polling (the lock is free between polls, so
      // Send() gets in) a while before sleeping on the event fd.
      if (in_flight_ > 0 && ++idle_polls < kSpins) continue;
      idle_polls = 0;
      sleep = impl_->efd >= 0 && ucp_worker_arm(impl_->worker) == UCS_OK;
    }
    if (sleep) {
      pollfd p{impl_->efd, POLLIN, 0};
      ::poll(&p, 1, 10);
    }
  }
}

UcxWorker::~UcxWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    impl_->receivers_done.SignalAll();
  }
  if (progress_thread_.joinable()) progress_thread_.join();
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < 1000 && in_flight_ > 0; ++i) ProgressOrWait(impl_->worker, impl_->efd, 1);
  for (auto& [addr, ep] : endpoints_) CloseEndpoint(impl_->worker, static_cast<ucp_ep_h>(ep));
  for (ucp_ep_h ep : impl_->dead) CloseEndpoint(impl_->worker, ep);
  ucp_worker_destroy(impl_->worker);
  ucp_cleanup(impl_->context);
}

bool PeerErrorHandling() {
  const char* v = std::getenv("LOOM_UCX_PEER_ERRORS");
  return v == nullptr || std::string(v) != "0";
}

namespace {
void EndpointError(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* a = static_cast<EpErrorArg*>(arg);
  for (auto it = a->endpoints->begin(); it != a->endpoints->end(); ++it) {
    if (it->second == ep) {
      a->endpoints->erase(it);
      a->dead->push_back(ep);
      return;
    }
  }
}
}  // namespace

absl::StatusOr<void*> UcxWorker::Endpoint(const std::string& remote_address) {
  for (ucp_ep_h ep : impl_->dead) CloseEndpoint(impl_->worker, ep);
  impl_->dead.clear();
  auto it = endpoints_.find(remote_address);
  if (it != endpoints_.end()) return it->second;
  absl::StatusOr<std::string> raw = Unseal(remote_address);
  if (!raw.ok()) return raw.status();
  EpErrorArg* arg = &impl_->error_arg;
  arg->dead = &impl_->dead;
  arg->endpoints = &endpoints_;
  ucp_ep_params_t p;
  std::memset(&p, 0, sizeof(p));
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  p.address = reinterpret_cast<const ucp_address_t*>(raw->data());
  // Peer-failure handling: without it UCX 1.13 aborts a process whose
  // cross-memory-attach read finds its sender gone (a peer SIGKILLed in the
  // middle of a transfer takes its receiver with it). It also excludes the
  // shared-memory and CMA transports, leaving TCP between processes of one
  // host at about a third of the bandwidth; LOOM_UCX_PEER_ERRORS=0 trades
  // that safety for the bandwidth.
  if (PeerErrorHandling()) {
    p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = EndpointError;
    p.err_handler.arg = arg;
  }
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(impl_->worker, &p, &ep); s != UCS_OK) {
    return UcsError("endpoint", s);
  }
  endpoints_[remote_address] = ep;
  return static_cast<void*>(ep);
}

struct SendOp {
  std::shared_ptr<const void> keep_alive;
  std::function<void(absl::Status)> done;
  size_t size;
  int* in_flight;
  UcxWorker::Stats* stats;
  std::set<SendOp*>* sends;
  ucp_ep_h ep;
  absl::Time deadline;
};

namespace {
void SendDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  --*op->in_flight;
  op->sends->erase(op);
  if (status == UCS_OK) {
    op->stats->bytes_sent += static_cast<int64_t>(op->size);
  } else {
    ++op->stats->send_errors;
  }
  if (op->done) op->done(status == UCS_OK ? absl::OkStatus() : UcsError("send", status));
  ucp_request_free(request);
  delete op;
}
}  // namespace

absl::Status UcxWorker::Send(const std::string& remote_address, uint64_t tag, const void* data,
                             size_t size, std::shared_ptr<const void> keep_alive,
                             std::function<void(absl::Status)> done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<void*> ep = Endpoint(remote_address);
  if (!ep.ok()) return ep.status();
  auto* op = new SendOp{std::move(keep_alive),
                        std::move(done),
                        size,
                        &in_flight_,
                        &stats_,
                        &impl_->sends,
                        static_cast<ucp_ep_h>(*ep),
                        absl::Now() + send_timeout_};
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = SendDone;
  p.user_data = op;
  ucs_status_ptr_t r = ucp_tag_send_nbx(static_cast<ucp_ep_h>(*ep), data, size, tag, &p);
  if (r == nullptr) {
    stats_.bytes_sent += static_cast<int64_t>(size);
    if (op->done) op->done(absl::OkStatus());
    delete op;
    return absl::OkStatus();
  }
  if (UCS_PTR_IS_ERR(r)) {
    ++stats_.send_errors;
    delete op;
    return UcsError("send", UCS_PTR_STATUS(r));
  }
  ++in_flight_;
  impl_->sends.insert(op);
  return absl::OkStatus();
}

void UcxWorker::SetSendTimeout(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  send_timeout_ = timeout;
}

void UcxWorker::ExpireSendsLocked() {
  if (impl_->sends.empty()) return;
  const absl::Time now = absl::Now();
  if (now < next_expiry_ || !PeerErrorHandling()) return;
  next_expiry_ = now + absl::Seconds(1);
  std::set<ucp_ep_h> stuck;
  for (const SendOp* op : impl_->sends) {
    if (op->deadline <= now) stuck.insert(op->ep);
  }
  for (ucp_ep_h ep : impl_->dead) stuck.erase(ep);  // closed by the next Endpoint()
  for (ucp_ep_h ep : stuck) {
    for (auto it = endpoints_.begin(); it != endpoints_.end();) {
      it = it->second == ep ? endpoints_.erase(it) : std::next(it);
    }
    for (const SendOp* op : impl_->sends) {
      if (op->ep == ep) ++stats_.sends_expired;
    }
    CloseEndpoint(impl_->worker, ep);  // its sends end now, with an error
  }
}

namespace {
struct RecvOp {
  void* request = nullptr;
  bool done = false;
  ucs_status_t status = UCS_OK;
  ucp_tag_recv_info_t info{};
  size_t* pending = nullptr;  // the batch's count of posted, not yet completed requests
};

void RecvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<RecvOp*>(user_data);
  op->done = true;
  --*op->pending;
  op->status = status;
  if (info != nullptr) op->info = *info;
}

// Once a cancel or a deadline ended a RecvAll: how long its cancelled
// receives get to complete before the buffers that have owners are left
// behind (cancelling an unmatched receive completes it at once).
constexpr absl::Duration kCancelDrain = absl::Milliseconds(100);
}  // namespace

// One RecvAll's requests; on the heap, since UCX holds pointers into it.
struct UcxWorker::RecvBatch {
  explicit RecvBatch(size_t n) : ops(n) {}
  std::vector<RecvOp> ops;  // never resized: UCX holds &ops[i]
  size_t pending = 0;       // requests posted and not completed (RecvDone counts down)
  std::vector<std::shared_ptr<void>> keep_alive;
};

void UcxWorker::Cancel() { cancelled_.store(true); }

void UcxWorker::ClearCancel() { cancelled_.store(false); }

absl::Status UcxWorker::RecvAll(const std::vector<RecvBuffer>& buffers, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto batch = std::make_unique<RecvBatch>(buffers.size());
  std::vector<RecvOp>& ops = batch->ops;
  size_t& pending = batch->pending;
  bool owned = true;  // every buffer has an owner this worker can keep
  for (const RecvBuffer& b : buffers) {
    owned = owned && b.keep_alive != nullptr;
    batch->keep_alive.push_back(b.keep_alive);
  }
  absl::MutexLock lock(&mu_);
  // Earlier abandoned receives that ended since.
  for (size_t i = 0; i < abandoned_.size();) {
    if (abandoned_[i]->pending > 0) {
      ++i;
      continue;
    }
    for (RecvOp& op : abandoned_[i]->ops) {
      if (op.request != nullptr) ucp_request_free(op.request);
    }
    abandoned_.erase(abandoned_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  absl::Status result;
  for (size_t i = 0; i < buffers.size(); ++i) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    // No immediate completion: UCX 1.13 leaves recv_info's length at 0 when
    // a receive matches an already-arrived message inside the call (seen
    // with UCX_TLS=tcp); the callback always reports it.
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = RecvDone;
    p.user_data = &ops[i];
    p.recv_info.tag_info = &ops[i].info;
    ops[i].pending = &pending;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(impl_->worker, buffers[i].data, buffers[i].size,
                                          buffers[i].tag, ~uint64_t{0}, &p);
    if (r == nullptr) {
      ops[i].done = true;
    } else if (UCS_PTR_IS_ERR(r)) {
      ops[i].done = true;
      ops[i].status = UCS_PTR_STATUS(r);
      result = UcsError("recv", ops[i].status);
      break;
    } else {
      ops[i].request = r;
      ++pending;
    }
  }
  int idle_polls = 0;
  bool progressed = true;  // since the last look at the clock
  absl::Time last_event = absl::InfinitePast();
  ++receiving_;
  for (uint32_t polls = 0; result.ok() && pending > 0; ++polls) {
    // The cancel flag and the clock every 64 polls (and after each wait):
    // the loop itself is the hot path while bytes stream in.
    if (polls % 64 == 0) {
      ExpireSendsLocked();
      if (cancelled_.load()) {
        result = absl::CancelledError("UCX receive cancelled: this worker is stopping");
        break;
      }
      if (absl::Now() >= deadline) {
        result = absl::DeadlineExceededError(absl::StrCat("UCX receive of ", buffers.size(),
                                                          " buffers timed out after ",
                                                          absl::FormatDuration(timeout)));
        break;
      }
    }
    mu_.Unlock();
    mu_.Lock();
    if (ucp_worker_progress(impl_->worker) != 0) {
      idle_polls = 0;
      progressed = true;
    } else if (++idle_polls >= kSpins) {
      idle_polls = 0;
      polls = 63;  // look at the clock next
      const absl::Time now = absl::Now();
      if (progressed) last_event = now;
      progressed = false;
      if (in_flight_ > 0 && now - last_event < kInFlightSpin) continue;
      // Sleep on the event fd without holding mu_: Send() from other threads
      // must not wait out the sleep.
      if (impl_->efd >= 0 && ucp_worker_arm(impl_->worker) == UCS_OK) {
        mu_.Unlock();
        pollfd p{impl_->efd, POLLIN, 0};
        ::poll(&p, 1, 5);
        mu_.Lock();
      }
    }
  }
  if (--receiving_ == 0) impl_->receivers_done.SignalAll();
  // Cancel what is still outstanding, then free every request.
  for (RecvOp& op : ops) {
    if (op.request != nullptr && !op.done) ucp_request_cancel(impl_->worker, op.request);
  }
  const absl::Time drain_until = absl::Now() + kCancelDrain;
  while (pending > 0) {
    ucp_worker_progress(impl_->worker);
    if (owned && absl::Now() >= drain_until) {
      // Matched, still arriving, not cancellable: left to finish.
      stats_.receives_abandoned += static_cast<int64_t>(pending);
      abandoned_.push_back(std::move(batch));
      return result.ok() ? absl::UnavailableError("UCX receive did not end") : result;
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].request != nullptr) ucp_request_free(ops[i].request);
    if (!result.ok() || !ops[i].done) continue;
    if (ops[i].status != UCS_OK) {
      result = UcsError("recv", ops[i].status);
    } else if (ops[i].info.length != buffers[i].size) {
      result =
          absl::DataLossError(absl::StrCat("UCX tag ", buffers[i].tag, ": expected ",
                                           buffers[i].size, " bytes, got ", ops[i].info.length));
    } else {
      stats_.bytes_received += static_cast<int64_t>(buffers[i].size);
    }
  }
  return result;
}

bool UcxWorker::Flush(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (in_flight_ == 0) return true;
      ProgressOrWait(impl_->worker, impl_->efd, 2);
    }
    if (absl::Now() >= deadline) return false;
  }
}

UcxWorker::Stats UcxWorker::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace loom
