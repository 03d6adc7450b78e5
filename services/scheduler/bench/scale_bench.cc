// The scale harness (not a test): a real loom-scheduler and loom-preprocess
// (the binaries, as deployed) and N simulated ranks, threads of this
// process that do what a worker does with the scheduler, without training:
// register, wait for the whole plan, learn their peers' addresses
// (GetWorkers), rendezvous their collective groups
// through the scheduler's store, then per iteration fetch the assignment,
// report the step (LLM rank 0) and wait for each other (as the gradient
// allreduce would) and for --iteration_ms of simulated compute.
//
// The plan for N ranks (N a multiple of 128): the LLM (vit300m-llm70b) TP 8 x
// PP 4 x DP 3N/128, the encoder TP 2 x PP 2 x DP N/16, 4 microbatches per
// LLM replica, a global batch of 2 samples per microbatch: at N = 4,096
// 3,072 LLM ranks, 1,024 encoder ranks, 768 samples an iteration.
//
// The rendezvous is the workers' (training_worker.cc): a group per TP, PP
// and DP axis of each module and the two-rank bridge between the modules'
// rank 0s, each connected as Gloo's full mesh does it: per rank a host key
// and a key holding an address for each peer, read as the workers' store
// adapter reads them (a rank's own address of every peer's list, in one
// GetKeys call), deleted once the
// group is connected (the TCP connections are not made: an in-process
// barrier stands for the barrier over the new group). The keys' sizes are
// measured from a real Gloo group first.
//
// Every rank holds a lease with loom-scheduler (job.recovery.lease_seconds,
// 10 s): it registers a health endpoint of its own, "127.0.A.B:PORT", one
// loopback address per rank, served by --health_servers real gRPC servers of
// this process (listening on every address; the workers' certificate under
// mutual TLS), so the scheduler probes N distinct endpoints as it would N
// worker processes. Once its groups are connected, each rank also watches
// the job's generation as a worker does (--generation_poll): "long", a
// GetGeneration long poll held by the scheduler (training_worker_recovery.cc),
// or "interval", the workers' former empty GetGeneration every 200 ms; the
// pollers are asynchronous calls on two threads of this process, over the
// ranks' connections.
//
// Prints per N: time to all registered, to all groups connected, the
// rendezvous traffic, GetAssignment latency p50/p99 per iteration beside a
// no-op call's (GetInfo, the same threads right after: the reference), and
// loom-scheduler's resident memory; over the steady phase (from all groups
// connected to the last iteration; --duration_s long): GetGeneration calls
// answered, loom-scheduler's CPU (utime + stime of its process from
// /proc/PID/stat, over wall time) and its lease rounds
// (loom_scheduler_lease_round_seconds). Exits 1 when a figure is missing.
//
//   bazel run -c opt //services/scheduler/bench:scale_bench -- --ranks 256,1024,4096
//   bazel run -c opt //services/scheduler/bench:scale_bench -- --ranks 4096 --duration_s 60
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "loom/common/v1/common.pb.h"
#include "runtime/base/file.h"
#include "runtime/base/runfiles.h"
#include "runtime/comm/collective.h"
#include "runtime/data/datagen.h"
#include "runtime/parallel/grid.h"
#include "services/common/channel.h"
#include "services/common/chassis.h"
#include "services/common/http_get.h"
#include "services/common/incarnation.h"
#include "services/common/security.h"
#include "services/common/subprocess.h"
#include "services/worker/scheduler_client.h"

ABSL_FLAG(std::string, ranks, "256,1024,4096", "Simulated ranks per run (multiples of 128).");
ABSL_FLAG(int, iterations, 6, "Iterations per run.");
ABSL_FLAG(int, iteration_ms, 1500, "Simulated compute per iteration.");
ABSL_FLAG(int, samples, 1024, "Samples in the generated dataset (onevision).");
ABSL_FLAG(std::string, work_dir, "/tmp/loom-scale-bench", "Data, runs and logs.");
ABSL_FLAG(int, ranks_per_connection, 0,
          "Simulated ranks sharing one gRPC connection to loom-scheduler (a worker process has "
          "its own); 0: all of them share one.");
ABSL_FLAG(int, duration_s, 0,
          "> 0: iterations run until this many seconds have passed since all groups connected "
          "(at least 2; --iterations is then ignored).");
ABSL_FLAG(std::string, generation_poll, "long",
          "How each rank watches the job's generation once connected: long (a GetGeneration "
          "long poll held up to 1 s, as the workers do), interval (an empty GetGeneration every "
          "200 ms, the workers' former cadence) or none.");
ABSL_FLAG(int, health_servers, 4, "gRPC servers serving the simulated ranks' health endpoints.");
ABSL_FLAG(std::string, scheduler_binary, "",
          "A loom-scheduler binary to run instead of the one built with the bench (a build of "
          "another revision, for before/after figures).");
ABSL_FLAG(int, limit_s, 300,
          "A run whose ranks are not all registered and connected within this many seconds is "
          "stopped and reported as such.");

namespace loom {
namespace {

using common::v1::Role;

constexpr int kLlmTp = 8, kLlmPp = 4, kEncoderTp = 2, kEncoderPp = 2, kMicrobatches = 4;

// A KeyValueStore that records the values set (to measure Gloo's keys).
class RecordingStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    {
      absl::MutexLock lock(&mu_);
      sizes_.emplace_back(key, value.size());
    }
    return inner_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::StatusOr<std::string> v = inner_.Get(key, timeout);
    absl::MutexLock lock(&mu_);
    if (v.ok()) ++gets_;
    return v;
  }
  int64_t gets() {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  absl::Status Delete(const std::vector<std::string>& keys) override { return inner_.Delete(keys); }
  std::vector<std::pair<std::string, size_t>> sizes() {
    absl::MutexLock lock(&mu_);
    return sizes_;
  }

 private:
  InMemoryStore inner_;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, size_t>> sizes_ ABSL_GUARDED_BY(mu_);
  int64_t gets_ ABSL_GUARDED_BY(mu_) = 0;  // answered
};

// Gloo's full mesh (gloo/rendezvous/context.cc) sets two keys per rank:
// "rank_<r>" (a few bytes: where the rank runs, read by the ranks above
// it) and "<r>" (an address for each peer, read by every peer). Their
// sizes and the reads, from a real 4-rank group.
struct GlooKeys {
  size_t host_bytes = 0;      // "rank_<r>"
  size_t bytes_per_peer = 0;  // "<r>" holds one per peer
};

absl::StatusOr<GlooKeys> MeasureGlooKeys() {
  constexpr int kSize = 4;
  RecordingStore store;
  std::vector<absl::Status> status(kSize);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      GlooOptions g;
      g.host = "127.0.0.1";
      g.prefix = "measure";
      g.rank = r;
      g.size = kSize;
      g.timeout = absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<Communicator>> c = ConnectGloo(&store, g);
      status[r] = c.status();
    });
  }
  for (std::thread& t : ranks) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  std::map<std::string, size_t> keys;
  for (const auto& [key, size] : store.sizes()) keys[key] = size;
  GlooKeys k;
  k.host_bytes = keys["measure/rank_0"];
  k.bytes_per_peer = keys["measure/0"] / (kSize - 1);
  for (int r = 0; r < kSize; ++r) {
    if (keys[absl::StrCat("measure/rank_", r)] != k.host_bytes ||
        keys[absl::StrCat("measure/", r)] != k.bytes_per_peer * (kSize - 1)) {
      k.bytes_per_peer = 0;
    }
  }
  // Each rank reads every peer's address key and the host keys of the
  // ranks below it (what the simulated ranks do).
  if (store.gets() != kSize * (kSize - 1) + kSize * (kSize - 1) / 2) {
    return absl::InternalError(absl::StrCat("Gloo read ", store.gets(), " keys for ", kSize,
                                            " ranks, not the pattern this harness emulates"));
  }
  if (keys.size() != 2 * kSize || k.host_bytes == 0 || k.bytes_per_peer == 0) {
    std::string seen;
    for (const auto& [key, size] : keys) absl::StrAppend(&seen, " ", key, "=", size);
    return absl::InternalError(
        absl::StrCat("Gloo's keys are not the two per rank this harness emulates:", seen));
  }
  return k;
}

// A reusable barrier for `n` threads.
class Barrier {
 public:
  // `on_pass` (optional) runs on the last thread to arrive, before any
  // thread passes.
  explicit Barrier(int n, std::function<void()> on_pass = nullptr)
      : n_(n), on_pass_(std::move(on_pass)) {}
  // False when `cancel` was set before every thread arrived.
  bool Wait(const std::atomic<bool>& cancel) {
    absl::MutexLock lock(&mu_);
    const int64_t round = round_;
    if (++arrived_ == n_) {
      if (on_pass_) on_pass_();
      arrived_ = 0;
      ++round_;
      passed_.SignalAll();
      return true;
    }
    // A CondVar, not Mutex::Await: with thousands of waiters, Await
    // evaluates every waiter's condition on each unlock.
    while (round_ == round) {
      if (cancel.load()) return false;
      passed_.WaitWithTimeout(&mu_, absl::Milliseconds(500));
    }
    return true;
  }

 private:
  const int n_;
  const std::function<void()> on_pass_;
  absl::Mutex mu_;
  absl::CondVar passed_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
};

// Barriers by group name, each made for its group's size on first use.
class GroupBarriers {
 public:
  Barrier* Get(const std::string& name, int size) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Barrier>& b = barriers_[name];
    if (b == nullptr) b = std::make_unique<Barrier>(size);
    return b.get();
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Barrier>> barriers_ ABSL_GUARDED_BY(mu_);
};

struct RankResult {
  double registered = 0;  // seconds since the start
  double connected = 0;
  std::map<std::string, double> group_done;  // by axis: seconds since the start
  int64_t bytes_set = 0, bytes_read = 0;
  std::vector<double> assignment_ms, info_ms;  // by iteration
  std::vector<double> peers_ms;                // each GetWorkers call (peer addresses)
  absl::Status error;
};

struct Run {
  int ranks = 0;
  parallel::GridShape encoder, llm;
  std::string scheduler;  // host:port
  // The simulated ranks' health servers (listening on every address).
  std::vector<int> health_ports;
  int scheduler_metrics_port = 0;
  // loom-scheduler's GetAssignment handler-time histogram once iteration 0
  // is over (rank 0 scrapes it between two barriers; iteration 0 waits for
  // the first assignment by design).
  std::map<double, double> handler_after_first;
  GlooKeys gloo;
  absl::Time start;
  GroupBarriers groups;
  std::unique_ptr<Barrier> all;
  std::atomic<int> registered{0}, planned{0}, connected{0};
  std::atomic<bool> cancel{false};  // past --limit_s: the ranks stop
  // --duration_s: the end of the steady phase (unix nanoseconds; set once
  // all groups are connected), and the decision to stop, taken by the last
  // rank through each iteration's barrier.
  std::atomic<int64_t> steady_until{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> stop{false};
  std::atomic<int> finished{0};         // ranks whose SimulateRank returned
  std::atomic<int> iterations_done{0};  // by LLM rank 0
  // Ranks through each group axis ("encoder tp", ...), for the progress lines.
  absl::Mutex axes_mu;
  std::map<std::string, int> axes_done ABSL_GUARDED_BY(axes_mu);
};

// The health endpoint of the rank numbered `i` over both modules: a
// loopback address of its own on one of the health servers.
std::string EndpointOf(const Run& run, int i) {
  return absl::StrCat("127.0.", 1 + i / 250, ".", 1 + i % 250, ":",
                      run.health_ports[i % run.health_ports.size()]);
}

// A histogram of loom-scheduler's /metrics: its buckets (upper bound ->
// cumulative count) and its sum.
struct Scraped {
  std::map<double, double> buckets;
  double sum = 0;
};

absl::StatusOr<Scraped> ScrapeHistogram(int metrics_port, const std::string& name) {
  absl::StatusOr<HttpResponse> r =
      HttpGet("127.0.0.1", metrics_port, "/metrics", absl::Seconds(30));
  if (!r.ok()) return r.status();
  Scraped h;
  std::map<double, double>& buckets = h.buckets;
  const std::string prefix = name + "_bucket{le=\"";
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (absl::ConsumePrefix(&line, name + "_sum ")) (void)absl::SimpleAtod(line, &h.sum);
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    const size_t end = line.find('"');
    const size_t space = line.rfind(' ');
    if (end == absl::string_view::npos || space == absl::string_view::npos) continue;
    double le = 0, count = 0;
    const absl::string_view bound = line.substr(0, end);
    if (bound == "+Inf") {
      le = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(bound, &le)) {
      continue;
    }
    if (absl::SimpleAtod(line.substr(space + 1), &count)) buckets[le] = count;
  }
  if (buckets.empty()) {
    return absl::NotFoundError(absl::StrCat("loom-scheduler's /metrics has no ", name));
  }
  return h;
}

// loom-scheduler's loom_scheduler_get_assignment_seconds buckets.
absl::StatusOr<std::map<double, double>> HandlerHistogram(int metrics_port) {
  absl::StatusOr<Scraped> h =
      ScrapeHistogram(metrics_port, "loom_scheduler_get_assignment_seconds");
  if (!h.ok()) return h.status();
  return h->buckets;
}

// utime + stime of process `pid`, in seconds (/proc/PID/stat).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  // After "pid (comm)": field 3 (state) onwards; utime and stime are 14, 15.
  std::vector<std::string> w = absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
  double utime = 0, stime = 0;
  if (w.size() < 13 || !absl::SimpleAtod(w[11], &utime) || !absl::SimpleAtod(w[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

// Each rank's generation watch (--generation_poll), as asynchronous calls
// over the ranks' own channels, driven by two threads: "long" holds a
// GetGeneration with the generation last answered for up to 1 s and asks
// again at once; "interval" sends an empty GetGeneration 200 ms after the
// previous answer (the workers' former loop).
class GenerationPollers {
 public:
  GenerationPollers(const std::vector<std::shared_ptr<grpc::Channel>>& channels, bool long_poll)
      : long_poll_(long_poll), pollers_(channels.size()) {
    std::map<grpc::Channel*, std::shared_ptr<scheduler::v1::SchedulerService::Stub>> stubs;
    for (size_t i = 0; i < channels.size(); ++i) {
      auto& stub = stubs[channels[i].get()];
      if (stub == nullptr) stub = scheduler::v1::SchedulerService::NewStub(channels[i]);
      pollers_[i].stub = stub;
    }
    active_ = static_cast<int>(pollers_.size());
    // Started spread over 200 ms, as workers that joined at different times.
    for (size_t i = 0; i < pollers_.size(); ++i) {
      Arm(i, absl::Now() + absl::Milliseconds(200) * static_cast<double>(i) / pollers_.size());
    }
    for (int t = 0; t < 2; ++t) threads_.emplace_back([this] { Drive(); });
  }
  ~GenerationPollers() { Stop(); }

  // Lets each poller's outstanding call or wait end (a long poll within its
  // 1 s hold) and asks no more.
  void Stop() {
    if (threads_.empty()) return;
    stopping_ = true;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](int* active) { return *active == 0; }, &active_));
    }
    cq_.Shutdown();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  int64_t answered() const { return answered_.load(); }
  int64_t failed() const { return failed_.load(); }

 private:
  struct Poller {
    std::shared_ptr<scheduler::v1::SchedulerService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    scheduler::v1::GetGenerationResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<scheduler::v1::GetGenerationResponse>> reader;
    grpc::Alarm alarm;
    int64_t known = 0;
  };
  // Tags: 2 * index + 1 for a call, 2 * index + 2 for an alarm.
  void Arm(size_t i, absl::Time at) {
    pollers_[i].alarm.Set(&cq_, absl::ToChronoTime(at), reinterpret_cast<void*>(2 * i + 2));
  }
  void Call(size_t i) {
    Poller& p = pollers_[i];
    p.ctx = std::make_unique<grpc::ClientContext>();
    p.ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(6)));
    scheduler::v1::GetGenerationRequest request;
    if (long_poll_) {
      request.set_known_generation(p.known);
      request.set_wait_ms(1000);
    }
    p.reader = p.stub->PrepareAsyncGetGeneration(p.ctx.get(), request, &cq_);
    p.reader->StartCall();
    p.reader->Finish(&p.response, &p.status, reinterpret_cast<void*>(2 * i + 1));
  }
  void Drive() {
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
      const size_t t = reinterpret_cast<size_t>(tag) - 1;
      const size_t i = t / 2;
      Poller& p = pollers_[i];
      if (t % 2 == 0) {  // a call answered
        if (p.status.ok()) {
          ++answered_;
          p.known = p.response.current().generation();
        } else {
          ++failed_;
        }
      }
      if (stopping_.load()) {
        absl::MutexLock lock(&mu_);
        --active_;
        continue;
      }
      if (t % 2 == 1 || (long_poll_ && p.status.ok())) {
        Call(i);  // an alarm rang, or a long poll answered: ask again
      } else {
        Arm(i, absl::Now() + absl::Milliseconds(200));
      }
    }
  }

  const bool long_poll_;
  std::vector<Poller> pollers_;
  grpc::CompletionQueue cq_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> answered_{0}, failed_{0};
  absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

// The smallest bucket bound under which a fraction `p` of the calls counted
// between two scrapes fall (the percentile's upper bound), and the count.
std::pair<double, double> BucketPercentile(const std::map<double, double>& before,
                                           const std::map<double, double>& after, double p) {
  const double total = after.rbegin()->second - (before.empty() ? 0 : before.rbegin()->second);
  for (const auto& [le, count] : after) {
    auto b = before.find(le);
    if (count - (b == before.end() ? 0 : b->second) >= p * total) return {le, total};
  }
  return {std::numeric_limits<double>::infinity(), total};
}

// One simulated rank: what a worker does with the scheduler.
void SimulateRank(Run* run, std::shared_ptr<grpc::Channel> channel, Role role, int rank,
                  RankResult* out) {
  const bool encoder = role == common::v1::ROLE_ENCODER_WORKER;
  absl::Cleanup finished = [run] { ++run->finished; };
  auto fail = [&](const absl::Status& s) {
    out->error = absl::Status(
        s.code(), absl::StrCat(encoder ? "encoder" : "llm", " rank ", rank, ": ", s.message()));
  };
  SchedulerClient client(channel, absl::Seconds(120), &run->cancel);
  client.set_incarnation(NewIncarnation());  // each simulated rank is a process of its own
  scheduler::v1::Worker w;
  w.set_role(role);
  w.set_rank(rank);
  w.set_ucx_address(absl::StrCat("sim-", encoder ? "e" : "l", rank));
  w.set_endpoint(EndpointOf(*run, encoder ? rank : run->encoder.size() + rank));
  absl::StatusOr<scheduler::v1::RegisterWorkerResponse> reg =
      client.Register(w, absl::Seconds(300));
  if (!reg.ok()) return fail(reg.status());
  if (absl::Status s = client.SetGeneration(reg->generation(), reg->data_key()); !s.ok()) {
    return fail(s);
  }
  out->registered = absl::ToDoubleSeconds(absl::Now() - run->start);
  ++run->registered;
  absl::StatusOr<scheduler::v1::GetPlanResponse> plan =
      client.WaitForAllWorkers(absl::Seconds(600));
  if (!plan.ok()) return fail(plan.status());
  ++run->planned;
  // The addresses a worker asks for (training_worker.cc): its pipeline
  // neighbours now, and per iteration those of the other module's ranks its
  // bins go to when it sends across the modules' border.
  const parallel::GridShape& grid = encoder ? run->encoder : run->llm;
  PeerAddresses peers(&client);
  auto resolve = [&](const std::vector<scheduler::v1::WorkerRef>& refs) -> absl::Status {
    const absl::Time t0 = absl::Now();
    absl::Status s = peers.Resolve(refs);
    if (s.ok() && !refs.empty())
      out->peers_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    return s;
  };
  {
    std::vector<scheduler::v1::WorkerRef> refs;
    for (int peer : {parallel::PrevStageRank(grid, rank), parallel::NextStageRank(grid, rank)}) {
      if (peer < 0) continue;
      refs.emplace_back().set_role(role);
      refs.back().set_rank(peer);
    }
    if (absl::Status s = resolve(refs); !s.ok()) return fail(s);
  }

  // The worker's groups (training_worker.cc, Join), as Gloo's full mesh
  // uses the store.
  const parallel::GridShape& shape = grid;
  const parallel::GridPosition pos = parallel::PositionOf(shape, rank);
  const std::string module = absl::StrCat("g", reg->generation(), "-", encoder ? "encoder" : "llm");
  struct Group {
    std::string prefix;
    int rank, size;
    std::string axis;
  };
  std::vector<Group> groups;
  if (shape.tp > 1) {
    groups.push_back(
        {absl::StrCat(module, "-tp-dp", pos.dp, "-pp", pos.pp), pos.tp, shape.tp, "tp"});
  }
  if (shape.pp > 1) {
    groups.push_back(
        {absl::StrCat(module, "-pp-tp", pos.tp, "-dp", pos.dp), pos.pp, shape.pp, "pp"});
  }
  groups.push_back({absl::StrCat(module, "-dp-tp", pos.tp, "-pp", pos.pp), pos.dp, shape.dp, "dp"});
  if (rank == 0) {
    groups.push_back({absl::StrCat("g", reg->generation(), "-bridge"), !encoder, 2, "bridge"});
  }
  SchedulerStore store(&client);
  for (const Group& g : groups) {
    if (g.size == 1) continue;
    const std::vector<std::pair<std::string, std::string>> mine = {
        {absl::StrCat(g.prefix, "/rank_", g.rank), std::string(run->gloo.host_bytes, 'h')},
        {absl::StrCat(g.prefix, "/", g.rank), std::string(run->gloo.bytes_per_peer * (g.size - 1),
                                                          static_cast<char>('a' + g.rank % 26))}};
    for (const auto& [key, value] : mine) {
      if (absl::Status s = store.Set(key, value); !s.ok()) return fail(s);
      out->bytes_set += static_cast<int64_t>(value.size());
      // Read as the workers' Gloo adapter reads them (collective.cc,
      // GlooStore::Fetch): the host keys of the ranks below in one call,
      // and this rank's own address from every peer's list in one call.
      const bool host = key == mine[0].first;
      std::vector<KeyValueStore::Read> reads;
      for (int peer = 0; peer < (host ? g.rank : g.size); ++peer) {
        if (peer == g.rank) continue;
        KeyValueStore::Read r{absl::StrCat(g.prefix, host ? "/rank_" : "/", peer)};
        if (!host && g.size > 2) {
          r.part = g.rank > peer ? g.rank - 1 : g.rank;
          r.parts = g.size - 1;
        }
        reads.push_back(std::move(r));
      }
      const absl::Time until = absl::Now() + absl::Seconds(600);
      while (!reads.empty()) {
        absl::StatusOr<std::vector<KeyValueStore::Value>> got = store.GetMany(reads, kLongPoll);
        if (!got.ok()) return fail(got.status());
        std::vector<KeyValueStore::Read> missing;
        for (size_t i = 0; i < reads.size(); ++i) {
          if ((*got)[i].found) {
            out->bytes_read += static_cast<int64_t>((*got)[i].value.size());
          } else {
            missing.push_back(reads[i]);
          }
        }
        reads = std::move(missing);
        if (!reads.empty() && (run->cancel.load() || absl::Now() > until)) {
          return fail(absl::DeadlineExceededError(absl::StrCat("key ", reads[0].key, " not set")));
        }
      }
    }
    if (!run->groups.Get(g.prefix, g.size)->Wait(run->cancel)) {  // every peer read its key
      return fail(absl::CancelledError("stopped"));
    }
    if (absl::Status s = store.Delete({mine[0].first, mine[1].first}); !s.ok()) return fail(s);
    out->group_done[g.axis] = absl::ToDoubleSeconds(absl::Now() - run->start);
    absl::MutexLock lock(&run->axes_mu);
    ++run->axes_done[absl::StrCat(encoder ? "encoder " : "LLM ", g.axis)];
  }
  out->connected = absl::ToDoubleSeconds(absl::Now() - run->start);
  ++run->connected;

  const bool timed = absl::GetFlag(FLAGS_duration_s) > 0;
  const int iterations = absl::GetFlag(FLAGS_iterations);
  for (int it = 0; timed || it < iterations; ++it) {
    // The gradient allreduce ends every rank's iteration together.
    if (!run->all->Wait(run->cancel)) return fail(absl::CancelledError("stopped"));
    if (timed && it >= 2 && run->stop.load()) break;  // the same decision for every rank
    if (it == 1) {
      if (encoder && rank == 0) {
        absl::StatusOr<std::map<double, double>> h = HandlerHistogram(run->scheduler_metrics_port);
        if (!h.ok()) return fail(h.status());
        run->handler_after_first = std::move(*h);
      }
      if (!run->all->Wait(run->cancel)) return fail(absl::CancelledError("stopped"));
    }
    absl::Time t0 = absl::Now();
    absl::StatusOr<scheduler::v1::GetAssignmentResponse> a = client.GetAssignment(it);
    out->assignment_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!a.ok()) return fail(a.status());
    if (!a->has_assignment()) {
      return fail(absl::InternalError(
          absl::StrCat("iteration ", it, ": no assignment (", a->job_ended(), ")")));
    }
    if (pos.tp == 0 && pos.pp == (encoder ? grid.pp - 1 : 0)) {
      const parallel::GridShape& other = encoder ? run->llm : run->encoder;
      std::vector<scheduler::v1::WorkerRef> refs;
      for (const scheduler::v1::Bin& b : a->assignment().bins()) {
        if ((encoder ? b.encoder_rank() : b.llm_rank()) != pos.dp) continue;
        for (int t = 0; t < other.tp; ++t) {
          refs.emplace_back().set_role(encoder ? common::v1::ROLE_LLM_WORKER
                                               : common::v1::ROLE_ENCODER_WORKER);
          refs.back().set_rank(parallel::RankOf(
              other, {t, encoder ? 0 : other.pp - 1, encoder ? b.llm_rank() : b.encoder_rank()}));
        }
      }
      if (absl::Status s = resolve(refs); !s.ok()) return fail(s);
    }
    t0 = absl::Now();
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    scheduler::v1::GetInfoResponse info;
    grpc::Status s = client.stub()->GetInfo(&ctx, scheduler::v1::GetInfoRequest(), &info);
    out->info_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!s.ok()) return fail(absl::UnavailableError(s.error_message()));
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_iteration_ms)));
    if (!encoder && rank == 0) {
      scheduler::v1::StepReport step;
      step.set_iteration(it);
      step.set_loss(1);
      step.set_seconds(absl::GetFlag(FLAGS_iteration_ms) / 1e3);
      if (absl::Status r = client.ReportStep(step); !r.ok()) return fail(r);
      ++run->iterations_done;
    }
  }
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// VmHWM and VmRSS of `pid`, in MiB.
std::pair<double, double> Memory(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  double hwm = 0, rss = 0;
  for (std::string line; std::getline(f, line);) {
    std::vector<std::string> w = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (w.size() < 2) continue;
    double kb = 0;
    if (!absl::SimpleAtod(w[1], &kb)) continue;
    if (w[0] == "VmHWM:") hwm = kb / 1024;
    if (w[0] == "VmRSS:") rss = kb / 1024;
  }
  return {hwm, rss};
}

// The job's certificates (MakeJobCertificates); empty: --insecure.
std::string certificates;

absl::StatusOr<std::unique_ptr<Subprocess>> StartService(const std::string& binary,
                                                         const std::string& identity,
                                                         std::vector<std::string> args,
                                                         const std::string& log,
                                                         ServingPorts* ports) {
  std::string tried;
  const std::string path = absl::StartsWith(binary, "/") ? binary : FindRunfile(binary, &tried);
  if (path.empty()) return absl::NotFoundError(absl::StrCat(binary, ": not found in ", tried));
  args.insert(args.begin(), {path, "--host=127.0.0.1", "--grpc_port=0", "--metrics_port=0"});
  args.push_back(certificates.empty() ? "--insecure"
                                      : "--tls_dir=" + IdentityDir(certificates, identity));
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(args, log);
  if (!p.ok()) return p.status();
  absl::StatusOr<ServingPorts> serving = WaitForServing(**p, absl::Seconds(60));
  if (!serving.ok()) return serving.status();
  *ports = *serving;
  return p;
}

int RunOne(int n, const std::string& shards, const GlooKeys& gloo,
           const std::vector<int>& health_ports) {
  const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/n", n);
  std::filesystem::remove_all(dir);
  if (absl::Status s = MakeDirectories(dir); !s.ok()) {
    std::fprintf(stderr, "scale_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  Run run;
  run.ranks = n;
  run.llm = {kLlmTp, kLlmPp, 3 * n / 128};
  run.encoder = {kEncoderTp, kEncoderPp, n / 16};
  run.health_ports = health_ports;
  run.gloo = gloo;
  const int global_batch = 2 * run.llm.dp * kMicrobatches;
  const bool timed = absl::GetFlag(FLAGS_duration_s) > 0;
  const int iterations = timed ? 1000000 : absl::GetFlag(FLAGS_iterations);
  const std::string job = absl::StrCat(
      R"({"name": "scale", "model": "vit300m-llm70b", "seed": 1,)", R"( "data": {"shards": ")",
      shards, R"(", "global_batch": )", global_batch, "},", R"( "parallel": {"encoder_dp": )",
      run.encoder.dp, R"(, "llm_dp": )", run.llm.dp, R"(, "microbatches": )", kMicrobatches,
      R"(, "encoder_tp": )", kEncoderTp, R"(, "llm_tp": )", kLlmTp, R"(, "encoder_pp": )",
      kEncoderPp, R"(, "llm_pp": )", kLlmPp, "},", R"( "train": {"steps": )", iterations, "},",
      R"( "checkpoint": {"dir": ")", dir, R"(/checkpoints"}})");
  if (absl::Status s = WriteFileAtomically(dir + "/job.json", job); !s.ok()) {
    std::fprintf(stderr, "scale_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  ServingPorts pre_ports, sched_ports;
  absl::StatusOr<std::unique_ptr<Subprocess>> preprocess =
      StartService("services/preprocess/loom-preprocess", kPreprocessIdentity,
                   {"--shards=" + shards, absl::StrCat("--global_batch=", global_batch),
                    "--threads=2", "--seed=1"},
                   dir + "/preprocess.log", &pre_ports);
  if (!preprocess.ok()) {
    std::fprintf(stderr, "scale_bench: loom-preprocess: %s\n",
                 std::string(preprocess.status().message()).c_str());
    return 1;
  }
  const std::string scheduler_binary = absl::GetFlag(FLAGS_scheduler_binary).empty()
                                           ? "services/scheduler/loom-scheduler"
                                           : absl::GetFlag(FLAGS_scheduler_binary);
  absl::StatusOr<std::unique_ptr<Subprocess>> scheduler =
      StartService(scheduler_binary, kSchedulerIdentity,
                   {"--job=" + dir + "/job.json", "--run_dir=" + dir + "/run",
                    absl::StrCat("--preprocess=127.0.0.1:", pre_ports.grpc_port)},
                   dir + "/scheduler.log", &sched_ports);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "scale_bench: loom-scheduler: %s\n",
                 std::string(scheduler.status().message()).c_str());
    return 1;
  }
  run.scheduler = absl::StrCat("127.0.0.1:", sched_ports.grpc_port);
  run.scheduler_metrics_port = sched_ports.metrics_port;
  run.all = std::make_unique<Barrier>(
      n, [&run] { run.stop = absl::ToUnixNanos(absl::Now()) >= run.steady_until.load(); });
  const auto [idle_hwm, idle_rss] = Memory((*scheduler)->pid());
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  run.start = absl::Now();
  const int encoder_ranks = run.encoder.size();
  const int per_connection =
      absl::GetFlag(FLAGS_ranks_per_connection) > 0 ? absl::GetFlag(FLAGS_ranks_per_connection) : n;
  std::shared_ptr<grpc::Channel> channel;
  std::vector<std::shared_ptr<grpc::Channel>> channels;  // by rank, for the pollers
  for (int i = 0; i < n; ++i) {
    const bool enc = i < encoder_ranks;
    if (i % per_connection == 0) channel = ServiceChannel(run.scheduler, /*own_connection=*/true);
    channels.push_back(channel);
    threads.emplace_back(SimulateRank, &run, channel,
                         enc ? common::v1::ROLE_ENCODER_WORKER : common::v1::ROLE_LLM_WORKER,
                         enc ? i : i - encoder_ranks, &results[i]);
  }
  // Progress, and the limit: a run that cannot finish says how far it got.
  const absl::Time limit = run.start + absl::Seconds(absl::GetFlag(FLAGS_limit_s));
  bool all_registered = false, stopped = false;
  absl::Time next_progress = run.start + absl::Seconds(10);
  while (run.connected.load() < n) {
    absl::SleepFor(absl::Milliseconds(100));
    if (absl::Now() >= next_progress) {  // how far the rendezvous got, every 10 s
      next_progress += absl::Seconds(10);
      std::string axes;
      {
        absl::MutexLock lock(&run.axes_mu);
        for (const auto& [axis, k] : run.axes_done) absl::StrAppend(&axes, ", ", axis, " ", k);
      }
      std::printf("N=%d: %.0f s: %d registered, %d saw the plan; ranks through each group%s\n", n,
                  absl::ToDoubleSeconds(absl::Now() - run.start), run.registered.load(),
                  run.planned.load(), axes.c_str());
      std::fflush(stdout);
    }
    if (!all_registered && run.registered.load() == n) {
      all_registered = true;
      std::printf("N=%d: all registered at %.2f s\n", n,
                  absl::ToDoubleSeconds(absl::Now() - run.start));
      std::fflush(stdout);
    }
    if (absl::Now() > limit) {
      const auto [h, r] = Memory((*scheduler)->pid());
      std::printf(
          "N=%d: stopped after %d s: %d of %d ranks registered, %d saw the whole plan, %d "
          "connected all their groups; loom-scheduler memory %.0f MiB peak\n",
          n, absl::GetFlag(FLAGS_limit_s), run.registered.load(), n, run.planned.load(),
          run.connected.load(), h);
      std::fflush(stdout);
      run.cancel = true;
      stopped = true;
      break;
    }
  }
  // The steady phase: every rank connected, iterating, watching the
  // generation and holding its lease.
  const std::string poll = absl::GetFlag(FLAGS_generation_poll);
  std::unique_ptr<GenerationPollers> pollers;
  const absl::Time steady_start = absl::Now();
  const double scheduler_cpu0 = ProcessCpuSeconds((*scheduler)->pid());
  const double self_cpu0 = SelfCpuSeconds();
  absl::StatusOr<Scraped> rounds0 =
      stopped ? absl::StatusOr<Scraped>(absl::CancelledError("stopped"))
              : ScrapeHistogram(sched_ports.metrics_port, "loom_scheduler_lease_round_seconds");
  if (!stopped) {
    if (poll != "none") pollers = std::make_unique<GenerationPollers>(channels, poll == "long");
    if (timed) {
      run.steady_until =
          absl::ToUnixNanos(steady_start + absl::Seconds(absl::GetFlag(FLAGS_duration_s)));
    }
  }
  for (absl::Time next = absl::Now() + absl::Seconds(10); run.finished.load() < n;) {
    absl::SleepFor(absl::Milliseconds(100));
    if (absl::Now() < next) continue;
    next += absl::Seconds(10);
    std::printf("N=%d: steady phase %.0f s: %d iterations done, GetGeneration %lld answered\n", n,
                absl::ToDoubleSeconds(absl::Now() - steady_start), run.iterations_done.load(),
                static_cast<long long>(pollers == nullptr ? 0 : pollers->answered()));
    std::fflush(stdout);
  }
  for (std::thread& t : threads) t.join();
  const absl::Time steady_end = absl::Now();
  const double scheduler_cpu = ProcessCpuSeconds((*scheduler)->pid()) - scheduler_cpu0;
  const double self_cpu = SelfCpuSeconds() - self_cpu0;
  absl::StatusOr<Scraped> rounds1 =
      stopped ? absl::StatusOr<Scraped>(absl::CancelledError("stopped"))
              : ScrapeHistogram(sched_ports.metrics_port, "loom_scheduler_lease_round_seconds");
  if (pollers != nullptr) pollers->Stop();
  const auto [hwm, rss] = Memory((*scheduler)->pid());
  absl::StatusOr<std::map<double, double>> handler_end =
      stopped ? absl::StatusOr<std::map<double, double>>(std::map<double, double>())
              : HandlerHistogram(sched_ports.metrics_port);
  (*scheduler)->Signal(SIGTERM);
  (*preprocess)->Signal(SIGTERM);
  (void)(*scheduler)->Wait(absl::Seconds(30));
  (void)(*preprocess)->Wait(absl::Seconds(30));

  for (const RankResult& r : results) {
    if (stopped && !r.error.ok() && r.error.code() != absl::StatusCode::kCancelled) {
      std::printf("N=%d: the first rank that failed: %s\n", n,
                  std::string(r.error.message()).c_str());
      break;
    }
  }
  if (stopped) return 1;
  for (const RankResult& r : results) {
    if (!r.error.ok()) {
      std::printf("N=%d: stopped: %s (logs in %s)\n", n, std::string(r.error.message()).c_str(),
                  dir.c_str());
      return 1;
    }
  }
  double registered = 0, connected = 0;
  int64_t set = 0, read = 0;
  std::map<std::string, double> groups_done;
  for (const RankResult& r : results) {
    for (const auto& [axis, t] : r.group_done) groups_done[axis] = std::max(groups_done[axis], t);
    registered = std::max(registered, r.registered);
    connected = std::max(connected, r.connected);
    set += r.bytes_set;
    read += r.bytes_read;
  }
  std::printf(
      "N=%d (encoder %d x %d x %d, LLM %d x %d x %d, %d samples/iteration): all registered "
      "%.2f s, all groups connected %.2f s; rendezvous %.1f MiB set, %.1f MiB read; "
      "loom-scheduler memory %.0f MiB peak, %.0f MiB at the end (%.0f MiB before the ranks)\n",
      n, run.encoder.tp, run.encoder.pp, run.encoder.dp, run.llm.tp, run.llm.pp, run.llm.dp,
      global_batch, registered, connected, set / 1048576.0, read / 1048576.0, hwm, rss, idle_rss);
  std::string by_axis;
  for (const auto& [axis, t] : groups_done) absl::StrAppendFormat(&by_axis, " %s %.2f s", axis, t);
  std::printf("  the last group of each axis connected at:%s\n", by_axis.c_str());
  std::vector<double> peers_ms;
  for (const RankResult& r : results) {
    peers_ms.insert(peers_ms.end(), r.peers_ms.begin(), r.peers_ms.end());
  }
  std::printf("  peer addresses: %zu GetWorkers calls, p50 %.2f ms p99 %.2f ms\n", peers_ms.size(),
              Percentile(peers_ms, 0.5), Percentile(peers_ms, 0.99));
  const int done = static_cast<int>(results[0].assignment_ms.size());
  if (timed) {  // iterations 1 to the last together
    std::vector<double> a, info;
    for (const RankResult& r : results) {
      a.insert(a.end(), r.assignment_ms.begin() + 1, r.assignment_ms.end());
      info.insert(info.end(), r.info_ms.begin() + 1, r.info_ms.end());
    }
    std::printf(
        "  iterations 1-%d: GetAssignment p50 %.2f ms p99 %.2f ms max %.2f ms | GetInfo (no-op) "
        "p50 %.2f ms p99 %.2f ms\n",
        done - 1, Percentile(a, 0.5), Percentile(a, 0.99), Percentile(a, 1.0),
        Percentile(info, 0.5), Percentile(info, 0.99));
  }
  for (int it = 0; !timed && it < iterations; ++it) {
    std::vector<double> a, info;
    for (const RankResult& r : results) {
      a.push_back(r.assignment_ms[it]);
      info.push_back(r.info_ms[it]);
    }
    const double p99 = Percentile(a, 0.99), ref99 = Percentile(info, 0.99);
    std::printf(
        "  iteration %d: GetAssignment p50 %.2f ms p99 %.2f ms max %.2f ms | GetInfo (no-op) p50 "
        "%.2f ms p99 %.2f ms | p99 ratio %.2f%s\n",
        it, Percentile(a, 0.5), p99, Percentile(a, 1.0), Percentile(info, 0.5), ref99,
        ref99 > 0 ? p99 / ref99 : 0.0, it == 0 ? " (the first: nothing computed ahead yet)" : "");
  }
  if (!handler_end.ok() || run.handler_after_first.empty()) {
    std::printf("N=%d: no GetAssignment handler times: %s\n", n,
                handler_end.ok() ? "not scraped after iteration 0"
                                 : std::string(handler_end.status().message()).c_str());
    return 1;
  }
  const auto [h50, calls] = BucketPercentile(run.handler_after_first, *handler_end, 0.5);
  const auto [h99, unused] = BucketPercentile(run.handler_after_first, *handler_end, 0.99);
  std::printf(
      "  loom-scheduler's own time to answer GetAssignment, iterations 1-%d (%.0f calls, its "
      "histogram): p50 <= %.2f ms, p99 <= %.2f ms\n",
      done - 1, calls, h50 * 1e3, h99 * 1e3);
  const double wall = absl::ToDoubleSeconds(steady_end - steady_start);
  std::printf(
      "  steady phase %.1f s (%d iterations, generation watch: %s, lease %s): loom-scheduler CPU "
      "%.1f s = %.2f cores (utime + stime, /proc/PID/stat); this process (ranks, pollers, health "
      "servers) %.2f cores\n",
      wall, done, poll.c_str(), "10 s, the default", scheduler_cpu, scheduler_cpu / wall,
      self_cpu / wall);
  if (pollers != nullptr) {
    std::printf("  GetGeneration: %lld answered (%.0f per s), %lld failed\n",
                static_cast<long long>(pollers->answered()), pollers->answered() / wall,
                static_cast<long long>(pollers->failed()));
  }
  if (!rounds0.ok() || !rounds1.ok()) {
    std::printf("N=%d: no lease rounds: %s\n", n,
                std::string((rounds0.ok() ? rounds1 : rounds0).status().message()).c_str());
    return 1;
  }
  const auto [r50, round_count] = BucketPercentile(rounds0->buckets, rounds1->buckets, 0.5);
  const auto [rmax, unused_count] = BucketPercentile(rounds0->buckets, rounds1->buckets, 1.0);
  std::printf(
      "  lease rounds (loom_scheduler_lease_round_seconds, %d holders): %.0f in the steady phase, "
      "mean %.3f s, p50 <= %.3f s, max <= %.3f s (histogram bounds)\n",
      n + 1, round_count, round_count > 0 ? (rounds1->sum - rounds0->sum) / round_count : 0.0, r50,
      rmax);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  loom::ExportRunfilesDir();
  std::vector<int> ns;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 128 || n % 128 != 0) {
      std::fprintf(stderr, "scale_bench: --ranks: %s is not a multiple of 128\n",
                   std::string(s).c_str());
      return 2;
    }
    ns.push_back(n);
  }
  const std::string poll = absl::GetFlag(FLAGS_generation_poll);
  if (poll != "long" && poll != "interval" && poll != "none") {
    std::fprintf(stderr, "scale_bench: --generation_poll: long, interval or none, not %s\n",
                 poll.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_iterations) < 2) {
    std::fprintf(stderr,
                 "scale_bench: --iterations: at least 2 (iteration 0 waits for the first "
                 "assignment; the figures are of those after it)\n");
    return 2;
  }
  // Mutual TLS, as deployed, unless --insecure: a throwaway CA made here;
  // the simulated ranks hold the workers' certificate.
  if (!absl::GetFlag(FLAGS_insecure)) {
    loom::certificates = absl::GetFlag(FLAGS_work_dir) + "/tls";
    if (absl::Status s = loom::MakeJobCertificates(loom::certificates); !s.ok()) {
      std::fprintf(stderr, "scale_bench: certificates: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    loom::TransportSecurity worker;
    worker.tls_dir = loom::IdentityDir(loom::certificates, loom::kWorkerIdentity);
    loom::SetClientSecurity(worker);
  }
  std::printf("transport: %s\n",
              loom::certificates.empty() ? "plaintext (--insecure)" : "mutual TLS");
  const std::string data = absl::GetFlag(FLAGS_work_dir) + "/data";
  if (!std::filesystem::exists(data + "/done")) {
    loom::data::DatagenOptions g;
    g.preset = "onevision";
    g.samples = absl::GetFlag(FLAGS_samples);
    g.seed = 1;
    g.out_dir = data;
    if (absl::Status s = loom::data::WriteDataset(g).status(); !s.ok()) {
      std::fprintf(stderr, "scale_bench: datagen: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    (void)loom::WriteFileAtomically(data + "/done", "");
  }
  absl::StatusOr<loom::GlooKeys> gloo = loom::MeasureGlooKeys();
  if (!gloo.ok()) {
    std::fprintf(stderr, "scale_bench: measuring Gloo's keys: %s\n",
                 std::string(gloo.status().message()).c_str());
    return 1;
  }
  std::printf(
      "Gloo full mesh (measured, 4 ranks): per rank a %zu-byte host key and %zu bytes per peer\n",
      gloo->host_bytes, gloo->bytes_per_peer);
  // The simulated ranks' health servers: loom-scheduler holds every rank's
  // lease against them, one loopback address per rank (EndpointOf), so they
  // listen on every address; under mutual TLS with the workers' certificate,
  // as a worker's chassis does.
  std::vector<std::unique_ptr<loom::Chassis>> health;
  std::vector<int> health_ports;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_health_servers)); ++i) {
    loom::ChassisOptions o;
    o.service_name = "scale-bench-ranks";
    o.role = loom::common::v1::ROLE_LLM_WORKER;
    o.host = "0.0.0.0";
    if (!loom::certificates.empty()) {
      o.security.tls_dir = loom::IdentityDir(loom::certificates, loom::kWorkerIdentity);
    }
    health.push_back(std::make_unique<loom::Chassis>(o));
    if (absl::Status s = health.back()->Start(); !s.ok()) {
      std::fprintf(stderr, "scale_bench: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    health_ports.push_back(health.back()->grpc_port());
  }
  int failed = 0;
  for (int n : ns) failed |= loom::RunOne(n, data + "/*.tar", *gloo, health_ports);
  for (auto& h : health) h->Shutdown();
  return failed;
}
