#include "runtime/comm/collective.h"

#include <signal.h>

#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace loom {

absl::Status Communicator::AllGather(float* data, int64_t n) {
  const auto [begin, end] = ChunkRange(n, rank(), size());
  std::fill(data, data + begin, 0.0f);
  std::fill(data + end, data + n, 0.0f);
  return AllreduceSum(data, n);
}

absl::StatusOr<std::string> PartOf(const KeyValueStore::Read& r, const std::string& whole) {
  if (r.parts <= 1) return whole;
  if (r.part < 0 || r.part >= r.parts || whole.size() % r.parts != 0) {
    return absl::FailedPreconditionError(absl::StrCat("key \"", r.key, "\": ", whole.size(),
                                                      " bytes do not cut into part ", r.part,
                                                      " of ", r.parts));
  }
  const size_t n = whole.size() / r.parts;
  return whole.substr(n * r.part, n);
}

absl::StatusOr<std::vector<KeyValueStore::Value>> KeyValueStore::GetMany(
    const std::vector<Read>& reads, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  std::vector<Value> values(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    absl::StatusOr<std::string> v =
        Get(reads[i].key, std::max(until - absl::Now(), absl::ZeroDuration()));
    if (!v.ok()) {
      if (v.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      return v.status();
    }
    absl::StatusOr<std::string> part = PartOf(reads[i], *v);
    if (!part.ok()) return part.status();
    values[i] = {true, *std::move(part), v->size()};
  }
  return values;
}

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&] { return values_.count(key) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key \"", key, "\" not set within ", absl::FormatDuration(timeout)));
  }
  return values_[key];
}

absl::Status InMemoryStore::Delete(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  for (const std::string& k : keys) values_.erase(k);
  return absl::OkStatus();
}

size_t InMemoryStore::size() {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

namespace {

// Gloo's Store interface over a KeyValueStore. Gloo expects exceptions. Waits
// in slices, so that a Cancellation ends them.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(KeyValueStore* store, absl::Duration timeout, const Cancellation* cancel, int rank,
            int size)
      : store_(store), timeout_(timeout), cancel_(cancel), rank_(rank), size_(size) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
    set_.push_back(key);
  }
  // The keys this rank set.
  const std::vector<std::string>& keys_set() const { return set_; }
  // Gloo waits for a key, then gets it: the value the wait fetched is kept
  // for the get, so each key costs one call to the store, not two.
  std::vector<char> get(const std::string& key) override {
    std::string v;
    if (auto it = waited_.find(key); it != waited_.end()) {
      v = std::move(it->second);
      waited_.erase(it);
    } else {
      v = Fetch(key, timeout_);
    }
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      if (waited_.count(k) == 0) waited_[k] = Fetch(k, absl::FromChrono(timeout));
    }
  }

 private:
  static std::chrono::milliseconds ToChrono(absl::Duration d) {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  }
  // Gloo's full mesh (gloo/rendezvous/context.cc) reads, under its group's
  // prefix, "rank_<j>" of every rank j below this one and "<j>" of every
  // peer: a list of addresses, one per rank but j, of which this rank uses
  // only its own. The first such read fetches them all in one GetMany,
  // only this rank's address of each list (the rest left zero, which Gloo
  // does not read), so a rank of a group of n costs a few calls and n
  // addresses, not 2n calls and n² addresses. Anything else (or a list
  // that does not cut evenly) is read one key at a time.
  std::string Fetch(const std::string& key, absl::Duration timeout) {
    if (auto it = fetched_.find(key); it != fetched_.end()) {
      std::string v = std::move(it->second);
      fetched_.erase(it);
      return v;
    }
    const size_t slash = key.rfind('/');
    const std::string prefix = slash == std::string::npos ? "" : key.substr(0, slash + 1);
    const std::string name = key.substr(prefix.size());
    int j = -1;
    std::vector<KeyValueStore::Read> reads;
    if (!addresses_fetched_ && absl::SimpleAtoi(name, &j) && j != rank_ && size_ > 2) {
      addresses_fetched_ = true;
      for (int p = 0; p < size_; ++p) {
        if (p != rank_)
          reads.push_back({absl::StrCat(prefix, p), rank_ > p ? rank_ - 1 : rank_, size_ - 1});
      }
    } else if (!hosts_fetched_ && absl::StartsWith(name, "rank_") && rank_ > 1) {
      hosts_fetched_ = true;
      for (int p = 0; p < rank_; ++p) reads.push_back({absl::StrCat(prefix, "rank_", p)});
    }
    if (!reads.empty()) {
      absl::Status s = FetchAll(reads, timeout);
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        fetched_.clear();  // not lists of addresses after all: key by key
      } else if (!s.ok()) {
        throw std::runtime_error(std::string(s.message()));
      }
      return Fetch(key, timeout);
    }
    return Get(key, timeout);
  }

  // GetMany in slices (a Cancellation ends the wait) until every read is
  // in fetched_, each part at its place in a value of the whole size.
  absl::Status FetchAll(std::vector<KeyValueStore::Read> reads, absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    while (!reads.empty()) {
      if (cancel_ != nullptr && cancel_->cancelled()) {
        return absl::CancelledError(absl::StrCat("cancelled waiting for \"", reads[0].key, "\""));
      }
      const absl::Duration slice =
          std::max(absl::ZeroDuration(), std::min(until - absl::Now(), absl::Milliseconds(1000)));
      absl::StatusOr<std::vector<KeyValueStore::Value>> got = store_->GetMany(reads, slice);
      if (!got.ok()) return got.status();
      std::vector<KeyValueStore::Read> missing;
      for (size_t i = 0; i < reads.size(); ++i) {
        const KeyValueStore::Value& v = (*got)[i];
        if (!v.found) {
          missing.push_back(reads[i]);
          continue;
        }
        std::string whole(v.size, '\0');
        const size_t at = reads[i].parts > 1 ? v.size / reads[i].parts * reads[i].part : 0;
        whole.replace(at, v.value.size(), v.value);
        fetched_[reads[i].key] = std::move(whole);
      }
      reads = std::move(missing);
      if (!reads.empty() && absl::Now() >= until) {
        return absl::DeadlineExceededError(absl::StrCat("rendezvous key \"", reads[0].key,
                                                        "\" not set within ",
                                                        absl::FormatDuration(timeout)));
      }
    }
    return absl::OkStatus();
  }

  std::string Get(const std::string& key, absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    for (;;) {
      if (cancel_ != nullptr && cancel_->cancelled()) {
        throw std::runtime_error(absl::StrCat("cancelled waiting for \"", key, "\""));
      }
      const absl::Duration slice =
          cancel_ == nullptr ? timeout : std::min(until - absl::Now(), absl::Milliseconds(200));
      absl::StatusOr<std::string> v = store_->Get(key, std::max(slice, absl::ZeroDuration()));
      if (v.ok()) return *std::move(v);
      if (v.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= until) {
        throw std::runtime_error(v.status().code() == absl::StatusCode::kDeadlineExceeded
                                     ? absl::StrCat("rendezvous key \"", key, "\" not set within ",
                                                    absl::FormatDuration(timeout))
                                     : std::string(v.status().message()));
      }
    }
  }

  KeyValueStore* store_;
  absl::Duration timeout_;
  const Cancellation* cancel_;
  std::vector<std::string> set_;
  std::map<std::string, std::string> waited_;  // fetched by wait, not yet by get
  const int rank_, size_;
  std::map<std::string, std::string> fetched_;  // by Fetch's GetMany, not read yet
  bool addresses_fetched_ = false, hosts_fetched_ = false;
};

// Ring allreduce over the context's unbound buffers: chunk c of n is reduced
// once, along the ring from rank c+1 to rank c, and then copied to every
// rank, so every rank ends with the same bits; a reduce-scatter is the first
// half, an all-gather the second. Every wait is a Cancellation point.
class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration timeout,
                   Cancellation* cancel, std::function<absl::Duration()> wait_limit)
      : context_(std::move(context)),
        timeout_(timeout),
        cancel_(cancel),
        wait_limit_(std::move(wait_limit)) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  absl::Status AllreduceSum(float* data, int64_t n) override {
    return Collective(data, n, Phases::kBoth, [](float a, float b) { return a + b; });
  }
  absl::Status AllreduceSum(double* data, int64_t n) override {
    return Collective(data, n, Phases::kBoth, [](double a, double b) { return a + b; });
  }
  absl::Status AllreduceMax(float* data, int64_t n) override {
    return Collective(data, n, Phases::kBoth, [](float a, float b) { return std::max(a, b); });
  }
  absl::Status ReduceScatterSum(float* data, int64_t n) override {
    return Collective(data, n, Phases::kScatter, [](float a, float b) { return a + b; });
  }
  absl::Status AllGather(float* data, int64_t n) override {
    return Collective(data, n, Phases::kGather, [](float a, float) { return a; });
  }

 private:
  // The ring's two halves: reduce-scatter, then all-gather.
  enum class Phases { kScatter, kGather, kBoth };

  template <typename T, typename Reduce>
  absl::Status Collective(T* data, int64_t n, Phases phases, Reduce reduce) {
    if (size() == 1 || n == 0) return absl::OkStatus();
    if (!broken_.ok()) return broken_;
    absl::Status s = Ring(data, n, phases, reduce);
    if (!s.ok()) {
      // Peers still waiting on this rank learn at once (their sockets close).
      context_->closeConnections();
      broken_ = absl::FailedPreconditionError(
          absl::StrCat("Gloo group unusable after an earlier error: ", s.message()));
    }
    return s;
  }

  template <typename T, typename Reduce>
  absl::Status Ring(T* data, int64_t n, Phases phases, Reduce reduce) {
    const int p = size(), r = rank();
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    // Chunk c (any integer, taken mod p): ChunkRange(n, c mod p, p).
    auto index = [p](int c) { return ((c % p) + p) % p; };
    auto begin = [&](int c) { return ChunkRange(n, index(c), p).first; };
    auto length = [&](int c) {
      const auto [b, e] = ChunkRange(n, index(c), p);
      return e - b;
    };
    std::vector<T> incoming(phases == Phases::kGather ? 0 : static_cast<size_t>(n / p + 1));
    const uint64_t call = static_cast<uint64_t>(tag_++);
    try {
      std::unique_ptr<gloo::transport::UnboundBuffer> out =
          context_->createUnboundBuffer(data, static_cast<size_t>(n) * sizeof(T));
      std::unique_ptr<gloo::transport::UnboundBuffer> in =
          phases == Phases::kGather
              ? nullptr
              : context_->createUnboundBuffer(incoming.data(), incoming.size() * sizeof(T));
      Cancellation::Scope scope(cancel_, [&] {
        out->abortWaitSend();
        out->abortWaitRecv();
        if (in != nullptr) in->abortWaitRecv();
      });
      const std::chrono::milliseconds timeout(
          absl::ToInt64Milliseconds(wait_limit_ ? wait_limit_() : timeout_));
      auto cancelled = [&] {
        return absl::CancelledError(
            absl::StrCat("Gloo collective over ", p, " ranks cancelled (a recovery or a stop)"));
      };
      // Steps 0 .. p-2 reduce-scatter: chunk c starts at rank c+1 and is
      // reduced along the ring, so after them rank r holds chunk r whole.
      // Steps p-1 .. 2p-3 pass the whole chunks around.
      const int first = phases == Phases::kGather ? p - 1 : 0;
      const int last = phases == Phases::kScatter ? p - 1 : 2 * (p - 1);
      for (int step = first; step < last; ++step) {
        const bool scatter = step < p - 1;
        const int s = scatter ? step : step - (p - 1);
        const int send_chunk = scatter ? r - s - 1 : r - s;
        const int recv_chunk = scatter ? r - s - 2 : r - s - 1;
        const uint64_t slot = (uint64_t{0x4c} << 56) | (call << 24) | static_cast<uint64_t>(step);
        const int64_t send_n = length(send_chunk), recv_n = length(recv_chunk);
        if (scope.cancelled()) return cancelled();
        if (send_n > 0) {
          out->send(right, slot, static_cast<size_t>(begin(send_chunk)) * sizeof(T),
                    static_cast<size_t>(send_n) * sizeof(T));
        }
        if (recv_n > 0) {
          gloo::transport::UnboundBuffer* into = scatter ? in.get() : out.get();
          const size_t offset = scatter ? 0 : static_cast<size_t>(begin(recv_chunk)) * sizeof(T);
          into->recv(left, slot, offset, static_cast<size_t>(recv_n) * sizeof(T));
          if (!into->waitRecv(timeout)) return cancelled();
          if (scatter) {
            T* chunk = data + begin(recv_chunk);
            for (int64_t i = 0; i < recv_n; ++i) chunk[i] = reduce(incoming[i], chunk[i]);
          }
        }
        if (send_n > 0 && !out->waitSend(timeout)) return cancelled();
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("Gloo collective over ", p, " ranks failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::Context> context_;
  absl::Duration timeout_;
  Cancellation* cancel_;
  std::function<absl::Duration()> wait_limit_;
  uint32_t tag_ = 0;
  absl::Status broken_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KeyValueStore* store,
                                                          const GlooOptions& options) {
  // Gloo writes with writev(2): to a peer that has gone, that raises SIGPIPE,
  // which would kill this process instead of failing the collective. Unless
  // the process chose a handler of its own, SIGPIPE is ignored (EPIPE then).
  static std::once_flag no_sigpipe;
  std::call_once(no_sigpipe, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("Gloo group \"", options.prefix, "\": rank ",
                                                   options.rank, " is not in [0, ", options.size,
                                                   ")"));
  }
  try {
    gloo::transport::tcp::attr attr;
    if (!options.host.empty()) attr.hostname = options.host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    GlooStore base(store, options.timeout, options.cancel, options.rank, options.size);
    gloo::rendezvous::PrefixStore prefixed(options.prefix, base);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout)));
    context->connectFullMesh(prefixed, device);
    auto communicator = std::unique_ptr<Communicator>(
        new GlooCommunicator(context, options.timeout, options.cancel, options.wait_limit));
    // Every rank has read every key it needs once all are connected: the
    // barrier (a ring allreduce ends on a rank only once every rank entered
    // it) says so, then each rank drops its own keys.
    if (options.size > 1) {
      float one = 1;
      if (absl::Status s = communicator->AllreduceSum(&one, 1); !s.ok()) return s;
    }
    if (!base.keys_set().empty()) {
      if (absl::Status s = store->Delete(base.keys_set()); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("Gloo group \"", options.prefix, "\" rank ", options.rank,
                                         ": deleting its keys: ", s.message()));
      }
    }
    return communicator;
  } catch (const std::exception& e) {
    if (options.cancel != nullptr && options.cancel->cancelled()) {
      return absl::CancelledError(absl::StrCat("Gloo group \"", options.prefix, "\" rank ",
                                               options.rank, " of ", options.size,
                                               ": rendezvous cancelled: ", e.what()));
    }
    return absl::UnavailableError(absl::StrCat("Gloo group \"", options.prefix, "\" rank ",
                                               options.rank, " of ", options.size,
                                               ": cannot connect: ", e.what()));
  }
}

}  // namespace loom

namespace loom {

absl::Status OnGlooThreads(KeyValueStore* store, const std::string& prefix, int size,
                           absl::Duration timeout,
                           const std::function<absl::Status(int, Communicator*)>& fn) {
  std::vector<absl::Status> status(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.prefix = prefix;
      o.rank = r;
      o.size = size;
      o.host = "127.0.0.1";
      o.timeout = timeout;
      absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectGloo(store, o);
      status[r] = comm.ok() ? fn(r, comm->get()) : comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom
