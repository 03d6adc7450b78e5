// The disaggregated-training benchmark (not a test): two measurements, each
// side by side with its reference in one run, runs alternating.
//
// 1. Iteration time of `loom up` (tiny model, encoder DP 2, LLM DP 2, the
//    onevision preset) with the `loom` assignment against `sequential`:
//    per run the mean wall time of the iterations after the warm-up, as LLM
//    rank 0 reports them; the median over alternating runs; the ratio.
// 2. Pipeline layouts (--layouts): per layout, `loom up --trace` with the
//    `loom` and `sequential` assignments, alternating; from each run's trace
//    the measured iteration (first measured event to the last forward or
//    backward) against the simulator's prediction of the same iteration
//    (aim: within 15% once refitted), and the bubble fraction (idle share
//    of each stage's span from its first forward to its last backward)
//    measured and predicted.
// 3. Activation-transfer throughput: Loom's path for embeddings (UcxWorker
//    Send of one buffer per microbatch, the receiver's RecvAll), between two
//    processes, against `ucx_perftest -t tag_bw` (Debian ucx-utils) at the
//    same message size and count, in the same endpoint mode; Loom's
//    receiver once with each message in its own buffer (as a stage
//    receives them) and once all in one (as ucx_perftest does); the ratio
//    of the latter, like for like (aim >= 0.9).
//
//   bazel run -c opt //services/worker/bench:distributed_bench
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/runfiles.h"
#include "runtime/base/stats.h"
#include "runtime/base/trace.h"
#include "runtime/comm/ucx.h"
#include "services/common/subprocess.h"

ABSL_FLAG(std::string, work_dir, "/tmp/loom-distributed-bench", "Data, runs and logs.");
ABSL_FLAG(int, rounds, 3, "Alternating rounds of each measurement.");
ABSL_FLAG(int, steps, 12, "Iterations per `loom up` run.");
ABSL_FLAG(int, warmup, 2, "Iterations left out at the start of each run.");
ABSL_FLAG(int, samples, 512, "onevision samples generated for the runs.");
ABSL_FLAG(std::string, sizes, "65536,1048576,8388608", "Transfer message sizes (bytes).");
ABSL_FLAG(int64_t, transfer_bytes, 512 << 20, "Bytes moved per transfer measurement.");
ABSL_FLAG(bool, skip_training, false, "Only the transfer measurement.");
ABSL_FLAG(std::string, layouts,
          "encoder_dp: 1 llm_dp: 1 llm_pp: 2 microbatches: 4;"
          "encoder_dp: 1 encoder_pp: 2 llm_dp: 1 llm_pp: 2 microbatches: 4;"
          "encoder_dp: 1 llm_dp: 2 llm_pp: 2 microbatches: 4",
          "Pipeline layouts (ParallelConfig fields), ';'-separated; empty: none.");
ABSL_FLAG(int, pipeline_steps, 20, "Iterations per pipeline-layout run.");
ABSL_FLAG(int, pipeline_warmup, 6,
          "Iterations left out at the start of a pipeline-layout run (the cost model refits).");
// Internal: the receiving process of the transfer measurement.
ABSL_FLAG(std::string, receiver, "", "(internal) run as receiver; write the address here.");
ABSL_FLAG(std::string, peer, "", "(internal) the sender's address file.");

namespace {

using loom::Median;
using loom::Subprocess;

int Messages(int64_t size) {
  return static_cast<int>(
      std::clamp<int64_t>(absl::GetFlag(FLAGS_transfer_bytes) / size, 16, 4000));
}

std::vector<int64_t> Sizes() {
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t v;
    if (absl::SimpleAtoi(s, &v) && v > 0) sizes.push_back(v);
  }
  return sizes;
}

std::string Hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

// Waits for a file another process writes atomically.
std::string AwaitFile(const std::string& path) {
  for (int i = 0; i < 3000; ++i) {
    absl::StatusOr<std::string> s = loom::ReadFile(path);
    if (s.ok() && !s->empty()) return *s;
    usleep(10000);
  }
  return "";
}

constexpr uint64_t kAckTag = 0xACC;

// Where the receiver puts the messages of one measurement: each in its own
// buffer (as a stage receives each microbatch's activations), or all in one
// (as ucx_perftest's tag_bw does: the same `size` bytes over and over,
// which stay in cache).
enum class Landing { kDistinct, kOne };
constexpr Landing kLandings[] = {Landing::kDistinct, Landing::kOne};

// The receiver: for each size, round and landing, twice (warm-up + timed):
// receive all messages, then acknowledge.
int Receiver() {
  auto ucx = loom::UcxWorker::Create();
  if (!ucx.ok()) return 1;
  (void)loom::WriteFileAtomically(absl::GetFlag(FLAGS_receiver), Hex((*ucx)->address()));
  const std::string peer = Unhex(AwaitFile(absl::GetFlag(FLAGS_peer)));
  auto ack = std::make_shared<int>(1);
  for (int64_t size : Sizes()) {
    const int n = Messages(size);
    std::vector<char> buf(static_cast<size_t>(size) * n);
    for (int round = 0; round < 4 * absl::GetFlag(FLAGS_rounds); ++round) {
      const Landing landing = kLandings[(round / 2) % 2];
      std::vector<loom::UcxWorker::RecvBuffer> bufs;
      for (int i = 0; i < n; ++i) {
        const int64_t at = landing == Landing::kOne ? 0 : size * i;
        bufs.push_back(
            {static_cast<uint64_t>(1000000 + i), buf.data() + at, static_cast<size_t>(size)});
      }
      if (!(*ucx)->RecvAll(bufs, absl::Seconds(120)).ok()) return 1;
      (void)(*ucx)->Send(peer, kAckTag, ack.get(), sizeof(int), ack);
    }
  }
  (*ucx)->Flush(absl::Seconds(10));
  return 0;
}

// Loom's transfer: n sends of `size` bytes, timed until the receiver's ack.
double LoomTransfer(loom::UcxWorker* ucx, const std::string& peer, int64_t size) {
  const int n = Messages(size);
  auto data = std::make_shared<std::vector<char>>(static_cast<size_t>(size), 1);
  int ack = 0;
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < n; ++i) {
    (void)ucx->Send(peer, 1000000 + i, data->data(), data->size(), data);
  }
  if (!ucx->RecvAll({{kAckTag, &ack, sizeof(int)}}, absl::Seconds(120)).ok()) return 0;
  const double s = absl::ToDoubleSeconds(absl::Now() - t0);
  return static_cast<double>(size) * n / s / (1 << 20);
}

// ucx_perftest -t tag_bw at `size`: the "Final" line's overall bandwidth (MB/s, 2^20 bytes).
double Perftest(int64_t size, int port, const std::string& log_dir) {
  const int n = Messages(size);
  std::vector<std::string> common = {"-t", "tag_bw",        "-s", absl::StrCat(size),
                                     "-n", absl::StrCat(n), "-p", absl::StrCat(port)};
  if (loom::PeerErrorHandling()) common.push_back("-e");  // the same endpoints as Loom's
  std::vector<std::string> server = {"/usr/bin/ucx_perftest"};
  server.insert(server.end(), common.begin(), common.end());
  const std::string srv_log = absl::StrCat(log_dir, "/perftest_server_", port, ".log");
  const std::string cli_log = absl::StrCat(log_dir, "/perftest_client_", port, ".log");
  std::remove(srv_log.c_str());  // logs are appended to; a stale Final line must not count
  std::remove(cli_log.c_str());
  auto srv = Subprocess::Start(server, srv_log);
  if (!srv.ok()) return 0;
  usleep(300000);
  std::vector<std::string> client = {"/usr/bin/ucx_perftest", "127.0.0.1"};
  client.insert(client.end(), common.begin(), common.end());
  auto cli = Subprocess::Start(client, cli_log);
  if (!cli.ok()) return 0;
  (void)(*cli)->Wait(absl::Seconds(120));
  (void)(*srv)->Wait(absl::Seconds(10));
  for (absl::string_view line : absl::StrSplit((*cli)->ReadLog(), '\n')) {
    if (!absl::StartsWith(line, "Final:")) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double bw = 0;
    if (f.size() >= 7 && absl::SimpleAtod(f[6], &bw)) return bw;
  }
  std::fprintf(stderr, "ucx_perftest gave no Final line:\n%s\n", (*cli)->ReadLog().c_str());
  return 0;
}

// False when a measurement produced no figure (the cause is printed).
bool TransferBench(const std::string& self, const std::string& dir) {
  auto ucx = loom::UcxWorker::Create();
  if (!ucx.ok()) {
    std::fprintf(stderr, "distributed_bench: UCX: %s\n",
                 std::string(ucx.status().message()).c_str());
    return false;
  }
  const std::string me = dir + "/sender.addr", peer_file = dir + "/receiver.addr";
  std::remove(peer_file.c_str());
  (void)loom::WriteFileAtomically(me, Hex((*ucx)->address()));
  auto rx = Subprocess::Start(
      {self, "--receiver=" + peer_file, "--peer=" + me, "--sizes=" + absl::GetFlag(FLAGS_sizes),
       absl::StrCat("--transfer_bytes=", absl::GetFlag(FLAGS_transfer_bytes)),
       absl::StrCat("--rounds=", absl::GetFlag(FLAGS_rounds))},
      dir + "/receiver.log");
  if (!rx.ok()) {
    std::fprintf(stderr, "distributed_bench: cannot start the receiver: %s\n",
                 std::string(rx.status().message()).c_str());
    return false;
  }
  const std::string peer = Unhex(AwaitFile(peer_file));
  std::printf(
      "\nActivation transfer between two processes (UCX %s, peer-failure handling %s), "
      "median of %d alternating runs:\n",
      std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "transports of UCX's choice",
      loom::PeerErrorHandling() ? "on: ucx_perftest -e" : "off (LOOM_UCX_PEER_ERRORS=0)",
      absl::GetFlag(FLAGS_rounds));
  std::printf(
      "  (loom: the receiver puts each message in its own buffer, as a stage does; loom, one "
      "buffer: all\n   in one, as ucx_perftest does; the ratio is the latter's, like for like)\n");
  std::printf("  %10s %8s %12s %18s %20s %8s\n", "size", "messages", "loom MiB/s",
              "loom, one buffer", "ucx_perftest MiB/s", "ratio");
  int port = 13400;
  bool complete = !peer.empty() && !Sizes().empty();
  if (peer.empty()) std::fprintf(stderr, "distributed_bench: the receiver wrote no address\n");
  for (int64_t size : Sizes()) {
    if (peer.empty()) break;
    std::vector<double> ours[2], ref;
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      for (int l = 0; l < 2; ++l) {                  // kLandings' order, as the receiver takes them
        (void)LoomTransfer(ucx->get(), peer, size);  // warm-up (wire-up, registration)
        ours[l].push_back(LoomTransfer(ucx->get(), peer, size));
      }
      ref.push_back(Perftest(size, port++, dir));
    }
    const double distinct = Median(ours[0]), a = Median(ours[1]), b = Median(ref);
    std::printf("  %10lld %8d %12.0f %18.0f %20.0f %8.3f\n", static_cast<long long>(size),
                Messages(size), distinct, a, b, b > 0 ? a / b : 0);
    std::fflush(stdout);
    if (distinct <= 0 || a <= 0 || b <= 0) {
      std::fprintf(stderr, "distributed_bench: no transfer figure at %lld bytes (%s)\n",
                   static_cast<long long>(size), a <= 0 ? "loom" : "ucx_perftest");
      complete = false;
    }
  }
  (void)(*rx)->Wait(absl::Seconds(60));
  return complete;
}

struct RunResult {
  double seconds = 0;    // mean iteration time after the warm-up
  double imbalance = 0;  // mean assignment objective
};

RunResult LoomUp(const std::string& loom_up, const std::string& bin_dir, const std::string& dir,
                 const std::string& algorithm, int run, const std::string& parallel = "",
                 const std::string& trace = "") {
  const std::string config = absl::StrCat(dir, "/", algorithm, ".txtpb");
  std::string job =
      absl::StrCat("algorithm: '", algorithm, "'\ndata { samples: ", absl::GetFlag(FLAGS_samples),
                   " generated_dir: '", dir, "/data' }\n");
  if (!parallel.empty()) absl::StrAppend(&job, "parallel { ", parallel, " }\n");
  (void)loom::WriteFileAtomically(config, job);
  const std::string log = absl::StrCat(dir, "/", algorithm, "-", run, ".log");
  std::remove(log.c_str());
  std::vector<std::string> argv = {
      loom_up,
      "--bin_dir=" + bin_dir,
      "--config=" + config,
      "--run_dir=" + absl::StrCat(dir, "/run-", algorithm, "-", run),
      absl::StrCat("--steps=", trace.empty() ? absl::GetFlag(FLAGS_steps)
                                             : absl::GetFlag(FLAGS_pipeline_steps)),
      "--json"};
  if (!trace.empty()) argv.push_back("--trace=" + trace);
  auto up = Subprocess::Start(argv, log);
  RunResult r;
  if (!up.ok()) {
    std::fprintf(stderr, "distributed_bench: cannot start %s: %s\n", loom_up.c_str(),
                 std::string(up.status().message()).c_str());
    return r;
  }
  (void)(*up)->Wait(absl::Minutes(10));
  std::vector<double> secs, imb;
  const std::vector<std::string> lines = absl::StrSplit((*up)->ReadLog(), '\n');
  for (const std::string& line : lines) {
    double it, s, m;
    if (!loom::JsonNumberField(line, "iteration", &it) ||
        !loom::JsonNumberField(line, "seconds", &s) ||
        !loom::JsonNumberField(line, "microbatch_imbalance", &m) ||
        it < absl::GetFlag(FLAGS_warmup)) {
      continue;
    }
    secs.push_back(s);
    imb.push_back(m);
  }
  for (double s : secs) r.seconds += s / secs.size();
  for (double m : imb) r.imbalance += m / imb.size();
  if (secs.empty()) {
    std::fprintf(stderr, "distributed_bench: %s run %d produced no iterations; its log (%s):\n%s\n",
                 algorithm.c_str(), run, log.c_str(), (*up)->ReadLog().c_str());
  }
  return r;
}

// Figures of one traced run, means over the iterations after the warm-up.
struct TraceFigures {
  double measured = 0, predicted = 0;                // seconds per iteration
  double bubble_measured = 0, bubble_predicted = 0;  // idle share of the stages' spans
  int iterations = 0;
};

TraceFigures FromTrace(const std::string& path, int warmup) {
  TraceFigures f;
  absl::StatusOr<std::string> json = loom::ReadFile(path);
  loom::trace::v1::TraceFile file;
  if (!json.ok() || !google::protobuf::util::JsonStringToMessage(*json, &file).ok()) {
    std::fprintf(stderr, "distributed_bench: cannot read the trace %s\n", path.c_str());
    return f;
  }
  for (const loom::trace::IterationFigures& i : loom::trace::TraceIterations(file)) {
    if (i.iteration < warmup) continue;
    f.measured += i.measured_seconds;
    f.predicted += i.predicted_seconds;
    f.bubble_measured += i.measured_bubble;
    f.bubble_predicted += i.predicted_bubble;
    ++f.iterations;
  }
  if (f.iterations > 0) {
    f.measured /= f.iterations;
    f.predicted /= f.iterations;
    f.bubble_measured /= f.iterations;
    f.bubble_predicted /= f.iterations;
  }
  return f;
}

// False when a layout produced no figure (the cause is printed).
bool PipelineBench(const std::string& loom_up, const std::string& bin_dir, const std::string& dir) {
  const std::vector<std::string> layouts =
      absl::StrSplit(absl::GetFlag(FLAGS_layouts), ';', absl::SkipEmpty());
  if (layouts.empty()) return true;
  std::printf(
      "\nPipeline layouts, tiny model, onevision, 16 samples/iteration, iterations %d..%d, "
      "median of %d alternating runs; measured vs the simulator's prediction of the same "
      "iterations:\n  %-62s %-10s %10s %10s %9s %8s %8s\n",
      absl::GetFlag(FLAGS_pipeline_warmup) + 1, absl::GetFlag(FLAGS_pipeline_steps),
      absl::GetFlag(FLAGS_rounds), "layout", "assignment", "measured s", "predicted", "pred/meas",
      "bubble", "pred.");
  bool complete = true;
  int run = 100;
  for (const std::string& layout : layouts) {
    std::map<std::string, std::vector<TraceFigures>> figures;
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      for (const char* alg : r % 2 == 0 ? std::vector<const char*>{"sequential", "loom"}
                                        : std::vector<const char*>{"loom", "sequential"}) {
        const std::string trace = absl::StrCat(dir, "/trace-", run, ".json");
        std::remove(trace.c_str());
        (void)LoomUp(loom_up, bin_dir, dir, alg, run++, layout, trace);
        figures[alg].push_back(FromTrace(trace, absl::GetFlag(FLAGS_pipeline_warmup)));
      }
    }
    double measured[2] = {0, 0};
    int k = 0;
    for (const char* alg : {"sequential", "loom"}) {
      std::vector<double> m, p, bm, bp;
      for (const TraceFigures& f : figures[alg]) {
        if (f.iterations == 0) continue;
        m.push_back(f.measured);
        p.push_back(f.predicted);
        bm.push_back(f.bubble_measured);
        bp.push_back(f.bubble_predicted);
      }
      if (m.empty()) {
        std::fprintf(stderr, "distributed_bench: layout \"%s\", %s: no traced iteration\n",
                     layout.c_str(), alg);
        complete = false;
        continue;
      }
      measured[k++] = Median(m);
      std::printf("  %-62s %-10s %10.4f %10.4f %9.3f %8.3f %8.3f\n", layout.c_str(), alg, Median(m),
                  Median(p), Median(p) / Median(m), Median(bm), Median(bp));
    }
    if (measured[0] > 0 && measured[1] > 0) {
      std::printf("  %-62s sequential/loom %.3f\n", "", measured[0] / measured[1]);
    }
    std::fflush(stdout);
  }
  return complete;
}

}  // namespace

int main(int argc, char** argv) {
  loom::ExportRunfilesDir();  // loom-up and the services it starts read their data here
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_receiver).empty()) return Receiver();
  const std::string dir = absl::GetFlag(FLAGS_work_dir);
  (void)loom::MakeDirectories(dir);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[n > 0 ? n : 0] = 0;

  if (!absl::GetFlag(FLAGS_skip_training)) {
    std::string tried, loom_up, bin_dir;
    if (!loom::FindLoomUp(&loom_up, &bin_dir, &tried)) {
      std::fprintf(stderr, "loom-up not found (%s); use bazel run\n", tried.c_str());
      return 1;
    }
    std::map<std::string, std::vector<double>> secs, imb;
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      for (const char* alg : r % 2 == 0 ? std::vector<const char*>{"sequential", "loom"}
                                        : std::vector<const char*>{"loom", "sequential"}) {
        RunResult res = LoomUp(loom_up, bin_dir, dir, alg, r);
        secs[alg].push_back(res.seconds);
        imb[alg].push_back(res.imbalance);
        std::printf("  run %d %-10s  %.4f s/iteration  imbalance %.4f\n", r, alg, res.seconds,
                    res.imbalance);
        std::fflush(stdout);
      }
    }
    const double s = Median(secs["sequential"]), l = Median(secs["loom"]);
    for (const auto& [alg, v] : secs) {
      if (std::count(v.begin(), v.end(), 0.0) > 0) {
        std::fprintf(stderr, "distributed_bench: FAILED: a %s run produced no figure (above)\n",
                     alg.c_str());
        return 1;
      }
    }
    std::printf(
        "\nIteration time, onevision preset, tiny model, encoder DP 2 + LLM DP 2 processes, 16 "
        "samples/iteration, iterations %d..%d, median of %d alternating runs:\n"
        "  sequential %.4f s   loom %.4f s   ratio sequential/loom %.3f   (microbatch "
        "imbalance %.4f vs %.4f)\n",
        absl::GetFlag(FLAGS_warmup) + 1, absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_rounds), s,
        l, l > 0 ? s / l : 0, Median(imb["sequential"]), Median(imb["loom"]));
    std::fflush(stdout);
    if (!PipelineBench(loom_up, bin_dir, dir)) {
      std::fprintf(stderr, "distributed_bench: FAILED: a pipeline layout produced no figure\n");
      return 1;
    }
  }
  if (!TransferBench(self, dir)) {
    std::fprintf(stderr, "distributed_bench: FAILED: the transfer measurement is incomplete\n");
    return 1;
  }
  return 0;
}
