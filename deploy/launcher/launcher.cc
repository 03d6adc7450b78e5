#include "deploy/launcher/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/base/file.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/hf/model_flags.h"
#include "services/common/chassis.h"
#include "services/common/health_client.h"
#include "services/common/http_get.h"
#include "services/common/job.h"
#include "services/common/security.h"

namespace loom {
namespace {

std::string LogName(const LaunchedService& s) {
  return s.binary->worker ? absl::StrCat(s.binary->name, "-", s.rank) : s.binary->name;
}

// `name` found in PATH (posix_spawn does not search it), or `name`.
std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/sbin:/usr/bin:/sbin:/bin", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  for (const char* dir : {"/usr/sbin", "/sbin"}) {  // not in every user's PATH
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

}  // namespace

absl::StatusOr<std::vector<Placement>> ParsePlacements(absl::string_view spec) {
  std::vector<Placement> out;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement \"", item, "\": ", why,
                       " (want ROLE[:RANK]@NETNS/ADDRESS, e.g. llm_worker@hostb/10.0.0.2)"));
    };
    const size_t at = item.find('@'), slash = item.find('/', at == item.npos ? 0 : at);
    if (at == item.npos || slash == item.npos) return bad("no @NETNS/ADDRESS");
    Placement p;
    absl::string_view who = item.substr(0, at);
    if (const size_t colon = who.find(':'); colon != who.npos) {
      if (!absl::SimpleAtoi(who.substr(colon + 1), &p.rank) || p.rank < 0) {
        return bad("the rank is not a number >= 0");
      }
      who = who.substr(0, colon);
    }
    for (const ServiceBinary& b : ServiceCatalog()) {
      if (RoleLabel(b.role) == who) p.role = b.role;
    }
    if (p.role == common::v1::ROLE_UNSPECIFIED) {
      return bad(absl::StrCat("unknown role \"", who,
                              "\" (preprocess, scheduler, encoder_worker, llm_worker, "
                              "generator_worker)"));
    }
    p.netns = std::string(item.substr(at + 1, slash - at - 1));
    p.host = std::string(item.substr(slash + 1));
    if (p.netns.empty() || p.netns.find('/') != std::string::npos) return bad("no NETNS");
    if (p.host.empty()) return bad("no ADDRESS");
    if (access(absl::StrCat("/run/netns/", p.netns).c_str(), F_OK) != 0) {
      return bad(absl::StrCat("no network namespace \"", p.netns,
                              "\" (ip netns list; ip netns add needs root)"));
    }
    out.push_back(std::move(p));
  }
  return out;
}

const LaunchedService* Launcher::Find(common::v1::Role role) const {
  for (const LaunchedService& s : services_) {
    if (s.binary->role == role) return &s;
  }
  return nullptr;
}

std::string Launcher::scheduler_target() const {
  const LaunchedService* s = Find(common::v1::ROLE_SCHEDULER);
  return s == nullptr ? "" : absl::StrCat(s->host, ":", s->ports.grpc_port);
}

double CpuPeakFlops() {
  std::string cpuinfo;
  if (absl::StatusOr<std::string> r = ReadFile("/proc/cpuinfo"); r.ok()) cpuinfo = *r;
  double hz = 0;
  if (absl::StatusOr<std::string> khz =
          ReadFile("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
      khz.ok()) {
    double v = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(*khz), &v)) hz = v * 1e3;
  }
  if (hz <= 0) {
    const size_t at = cpuinfo.find("cpu MHz");
    const size_t colon = at == std::string::npos ? at : cpuinfo.find(':', at);
    double mhz = 0;
    if (colon != std::string::npos &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(
                             cpuinfo.substr(colon + 1, cpuinfo.find('\n', colon) - colon - 1)),
                         &mhz)) {
      hz = mhz * 1e6;
    }
  }
  if (hz <= 0) hz = 2e9;
  auto has = [&](const char* flag) { return cpuinfo.find(flag) != std::string::npos; };
  // fp32 FLOPs per cycle and core: two FMA units of 16 (AVX-512) or 8 (AVX2) lanes.
  const double per_cycle = has(" avx512f") ? 64 : (has(" avx2") && has(" fma")) ? 32 : 8;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return cores * hz * per_cycle;
}

int CpuSharedDevices() {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int threads = cores;
  for (const char* name : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    int n = 0;
    if (v != nullptr && absl::SimpleAtoi(v, &n) && n > 0) {
      threads = std::min(n, cores);
      break;
    }
  }
  return std::max(1, cores / threads);
}

std::string PrometheusTargets(const std::vector<LaunchedService>& services) {
  std::vector<std::string> groups;
  for (const LaunchedService& s : services) {
    if (s.ports.metrics_port <= 0) continue;
    groups.push_back(absl::StrFormat("{\"targets\":[\"%s:%d\"],\"labels\":{\"service\":\"%s\"}}",
                                     s.host, s.ports.metrics_port, s.binary->name));
  }
  return absl::StrCat("[", absl::StrJoin(groups, ",\n"), "]\n");
}

int ModuleRanks(const job::v1::JobConfig& job, common::v1::Role role) {
  const job::v1::ParallelConfig& p = job.parallel();
  switch (role) {
    case common::v1::ROLE_ENCODER_WORKER:
      return p.encoder_tp() * p.encoder_pp() * p.encoder_dp();
    case common::v1::ROLE_LLM_WORKER:
      return p.llm_tp() * p.llm_pp() * p.llm_dp();
    case common::v1::ROLE_GENERATOR_WORKER:
      return p.generator_tp() * std::max(1, p.generator_pp()) * p.generator_dp();
    default:
      return 1;
  }
}

namespace {

// The flags of `role` beyond the chassis's and the security's.
std::vector<std::string> RoleArgs(const LauncherOptions& options, common::v1::Role role,
                                  const ServiceSlot& slot) {
  const job::v1::JobConfig& job = options.job;
  std::vector<std::string> a;
  switch (role) {
    case common::v1::ROLE_PREPROCESS: {
      a = {"--shards=" + options.shards,
           absl::StrCat("--seed=", job.seed()),
           absl::StrCat("--global_batch=", job.data().global_batch()),
           absl::StrCat("--threads=", job.data().threads()),
           "--chat_template=" + job.data().chat_template(),
           "--image_aspect_ratio=" + job.data().image_aspect_ratio(),
           absl::StrCat("--encoder_max_tokens=", job.parallel().encoder_max_tokens()),
           absl::StrCat("--llm_max_tokens=", job.parallel().llm_max_tokens())};
      for (std::string& flag : hf::ModelSourceFlags(JobModelSource(job))) {
        a.push_back(std::move(flag));
      }
      if (const int batches = ValidationBatches(job); batches > 0) {
        a.push_back("--validation_shards=" + job.data().validation().shards());
        a.push_back(absl::StrCat("--validation_batches=", batches));
      }
      if (options.resume_step > 0) {
        a.push_back(absl::StrCat("--start_iteration=", options.resume_step));
        a.push_back(absl::StrCat("--cursor=", StepDir(job.checkpoint().dir(), options.resume_step),
                                 "/", kDataCursorFile));
      }
      break;
    }
    case common::v1::ROLE_SCHEDULER: {
      // The job itself arrives by SubmitJob (loom.control.v1), as in any deployment.
      a = {"--run_dir=" + options.run_dir, "--preprocess=" + slot.preprocess,
           absl::StrFormat("--peak_flops=%.6g", options.peak_flops)};
      if (!options.trace_dir.empty()) a.push_back("--trace_dir=" + options.trace_dir);
      if (!options.profile.empty()) a.push_back("--profile=" + options.profile);
      if (options.shared_devices > 0) {
        a.push_back(absl::StrCat("--shared_devices=", options.shared_devices));
      }
      if (slot.take_back) a.push_back("--take_back");
      break;
    }
    default: {
      a = {absl::StrCat("--rank=", slot.rank), absl::StrCat("--local_rank=", slot.local_rank),
           "--scheduler=" + slot.scheduler, "--advertise_host=" + slot.host};
      if (!options.trace_dir.empty()) a.push_back("--trace_dir=" + options.trace_dir);
      break;
    }
  }
  if (slot.exit_on_job_end) a.push_back("--exit_on_job_end");
  return a;
}

}  // namespace

std::vector<std::string> ServiceCommand(const LauncherOptions& options, const ServiceBinary& binary,
                                        const ServiceSlot& slot) {
  std::vector<std::string> argv = {
      absl::StrCat(options.bin_dir, "/", binary.package, "/", binary.name),
      absl::StrCat("--host=", slot.host),
      absl::StrCat("--grpc_port=", slot.grpc_port),
      absl::StrCat("--metrics_port=", slot.metrics_port),
  };
  if (!options.insecure) {
    const std::string identity = binary.role == common::v1::ROLE_SCHEDULER    ? kSchedulerIdentity
                                 : binary.role == common::v1::ROLE_PREPROCESS ? kPreprocessIdentity
                                                                              : kWorkerIdentity;
    argv.push_back("--tls_dir=" + IdentityDir(options.certificates, identity));
    argv.push_back("--tls_server_name=" + options.server_name);
    const std::string tokens = options.certificates + "/tokens";
    if (binary.role == common::v1::ROLE_SCHEDULER && access(tokens.c_str(), R_OK) == 0) {
      argv.push_back("--control_tokens=" + tokens);
    }
  } else {
    argv.push_back("--insecure");
  }
  for (std::string& a : RoleArgs(options, binary.role, slot)) argv.push_back(std::move(a));
  return argv;
}

void AssignLocalRanks(bool colocate, std::vector<LaunchedService>* services) {
  auto role = [](const LaunchedService& s) { return s.binary->role; };
  std::map<std::string, int> on_host;
  std::map<int, const LaunchedService*> llm_ranks;
  for (LaunchedService& s : *services) {
    if (!s.binary->worker || (colocate && role(s) == common::v1::ROLE_ENCODER_WORKER)) continue;
    s.local_rank = on_host[s.netns + "/" + s.host]++;
    if (role(s) == common::v1::ROLE_LLM_WORKER) llm_ranks[s.rank] = &s;
  }
  for (LaunchedService& s : *services) {
    if (!colocate || role(s) != common::v1::ROLE_ENCODER_WORKER) continue;
    auto llm = llm_ranks.find(s.rank);
    const bool beside =
        llm != llm_ranks.end() && llm->second->host == s.host && llm->second->netns == s.netns;
    s.local_rank = beside ? llm->second->local_rank : on_host[s.netns + "/" + s.host]++;
  }
}

absl::Status Launcher::Start() {
  if (absl::Status s = MakeDirectories(options_.run_dir + "/logs"); !s.ok()) return s;
  TransportSecurity admin;  // plaintext when insecure
  if (!options_.insecure) {
    if (options_.certificates.empty()) {
      options_.certificates = options_.run_dir + "/tls";
      if (absl::Status s = MakeJobCertificates(options_.certificates, options_.server_name);
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("the job's certificates: ", s.message()));
      }
    }
    admin.tls_dir = IdentityDir(options_.certificates, kAdminIdentity);
    admin.server_name = options_.server_name;
    if (absl::Status s = ValidateTransportSecurity(admin, /*need_identity=*/true); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the job's certificates: ", s.message()));
    }
  }
  SetClientSecurity(admin);
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (options_.control_only && b.worker) continue;  // started elsewhere
    const int ranks = ModuleRanks(options_.job, b.role);
    for (int r = 0; r < ranks; ++r) {
      LaunchedService s;
      s.binary = &b;
      s.rank = r;
      s.host = options_.host;
      for (const Placement& p : options_.placements) {  // the last that matches
        if (p.role == b.role && (p.rank < 0 || p.rank == r)) {
          s.host = p.host;
          s.netns = p.netns;
        }
      }
      services_.push_back(std::move(s));
    }
  }
  AssignLocalRanks(options_.job.parallel().colocate(), &services_);
  // Each stage needs the previous one's port: preprocess, scheduler, then
  // all workers together.
  for (size_t i = 0; i < services_.size();) {
    size_t end = i + 1;
    while (services_[i].binary->worker && end < services_.size()) ++end;
    for (size_t k = i; k < end; ++k) {
      absl::Status s = Launch(services_[k], static_cast<int>(k));
      if (!s.ok()) return s;
    }
    for (size_t k = i; k < end; ++k) {
      LaunchedService& s = services_[k];
      absl::StatusOr<ServingPorts> ports = WaitForServing(*s.process, options_.startup_timeout);
      if (!ports.ok()) {
        return absl::Status(ports.status().code(),
                            absl::StrCat(LogName(s), ": ", ports.status().message()));
      }
      s.ports = *ports;
    }
    i = end;
  }
  for (LaunchedService& s : services_) {
    if (absl::Status st = CheckHealthy(s); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Launcher::Launch(LaunchedService& s, int index) {
  // Fixed ports (--base_port): service i gets base + 2i and base + 2i + 1.
  // --control_only: loom-scheduler on base (the workers' MASTER_PORT), loom-preprocess on base + 2.
  if (options_.control_only) index = s.binary->role == common::v1::ROLE_SCHEDULER ? 0 : 1;
  auto port = [&](int k) { return options_.base_port ? options_.base_port + 2 * index + k : 0; };
  auto target = [&](common::v1::Role role) {
    const LaunchedService* t = Find(role);
    return t == nullptr ? std::string() : absl::StrCat(t->host, ":", t->ports.grpc_port);
  };
  ServiceSlot slot;
  slot.rank = s.rank;
  slot.local_rank = s.local_rank;
  slot.host = s.host;
  slot.grpc_port = s.same_ports ? s.ports.grpc_port : port(0);
  slot.metrics_port = s.same_ports ? s.ports.metrics_port : port(1);
  slot.preprocess = target(common::v1::ROLE_PREPROCESS);
  slot.scheduler = target(common::v1::ROLE_SCHEDULER);
  slot.take_back = s.take_back;
  slot.exit_on_job_end = options_.control_only;
  std::vector<std::string> argv;
  if (!s.netns.empty()) argv = {FindInPath("ip"), "netns", "exec", s.netns};
  for (std::string& a : ServiceCommand(options_, *s.binary, slot)) argv.push_back(std::move(a));
  const std::string log = absl::StrCat(options_.run_dir, "/logs/", LogName(s), ".log");
  // A replacement, or a run (e.g. a resume) in the same folder, keeps the
  // earlier logs (.prev the newest, .prev.1 ...: a crash's log survives
  // later recoveries); the new one must not hold an old "serving" record.
  KeepEarlierLogs(log);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, log);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrCat(LogName(s), ": ", p.status().message(),
                                                        " (built? ./loom up builds it)"));
  }
  s.process = std::move(*p);
  return absl::OkStatus();
}

absl::Status Launcher::CheckHealthy(LaunchedService& s) {
  const std::string target = absl::StrCat(s.host, ":", s.ports.grpc_port);
  for (const std::string& service : {std::string(), s.binary->grpc_service}) {
    if (absl::Status st = WaitUntilServing(target, service, absl::Seconds(10)); !st.ok()) {
      return absl::UnavailableError(absl::StrCat(LogName(s), ": ", st.message()));
    }
  }
  absl::StatusOr<HttpResponse> m =
      HttpGet(s.host, s.ports.metrics_port, "/metrics", absl::Seconds(10));
  if (!m.ok() || m->status_code != 200) {
    return absl::UnavailableError(absl::StrCat(
        LogName(s), ": /metrics not served: ",
        m.ok() ? absl::StrCat("HTTP ", m->status_code) : std::string(m.status().message())));
  }
  s.health = "SERVING";
  return absl::OkStatus();
}

absl::Status Launcher::Replace(common::v1::Role role, int rank, int64_t resume_step) {
  for (size_t i = 0; i < services_.size(); ++i) {
    LaunchedService& s = services_[i];
    if (s.binary->role != role || s.rank != rank) continue;
    if (s.process != nullptr) {
      s.process->Signal(SIGKILL);
      (void)s.process->Wait(absl::Seconds(10));
    }
    s.process.reset();
    s.same_ports = !s.binary->worker;  // others reach it at its address
    s.take_back = role == common::v1::ROLE_SCHEDULER;
    if (!s.same_ports) s.ports = ServingPorts();
    options_.resume_step = resume_step;
    s.health.clear();
    s.exit_status = -1;
    s.awaiting_replacement = false;
    if (absl::Status st = Launch(s, static_cast<int>(i)); !st.ok()) return st;
    absl::StatusOr<ServingPorts> ports = WaitForServing(*s.process, options_.startup_timeout);
    if (!ports.ok()) {
      return absl::Status(ports.status().code(),
                          absl::StrCat(LogName(s), ": ", ports.status().message()));
    }
    s.ports = *ports;
    return CheckHealthy(s);
  }
  return absl::NotFoundError(absl::StrCat("no ", RoleLabel(role), " rank ", rank));
}

void Launcher::AwaitReplacement(const LaunchedService* s) {
  for (LaunchedService& own : services_) {
    if (&own == s) own.awaiting_replacement = true;
  }
}

std::string Launcher::ExitMessage(common::v1::Role role, int rank, absl::Duration wait) {
  for (LaunchedService& s : services_) {
    if (s.binary->role != role || s.rank != rank) continue;
    if (s.process == nullptr || !s.process->Wait(wait).ok()) return "";
    // The log's end: a long run's log is long, and the main's last words
    // come last.
    std::ifstream in(s.process->log_path(), std::ios::binary);
    if (!in) return "";
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size <= 0) return "";
    const std::streamoff tail = std::min<std::streamoff>(size, 64 << 10);
    in.seekg(size - tail);
    std::string text(static_cast<size_t>(tail), '\0');
    in.read(text.data(), tail);
    const std::string prefix = s.binary->name + ": ";
    std::string found;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, prefix)) found = std::string(line.substr(prefix.size()));
    }
    return found;
  }
  return "";
}

const LaunchedService* Launcher::FindExited() {
  for (LaunchedService& s : services_) {
    if (s.process != nullptr && !s.awaiting_replacement && !s.process->running()) {
      absl::StatusOr<int> st = s.process->Wait(absl::ZeroDuration());
      s.exit_status = st.ok() ? *st : -1;
      s.health = "EXITED";
      return &s;
    }
  }
  return nullptr;
}

bool Launcher::Stop(int signal) {
  if (stopped_) return true;
  stopped_ = true;
  for (LaunchedService& s : services_) {
    if (s.process != nullptr) s.process->Signal(signal);
  }
  bool clean = true;
  for (LaunchedService& s : services_) {
    if (s.process == nullptr) continue;
    absl::StatusOr<int> st = s.process->Wait(options_.stop_timeout);
    if (!st.ok()) {
      s.process->Signal(SIGKILL);
      st = s.process->Wait(absl::Seconds(5));
    }
    s.exit_status = st.ok() ? *st : -1;
    s.health = DescribeWaitStatus(s.exit_status);
    clean = clean && s.health == "exit 0";
  }
  return clean;
}

bool Launcher::AwaitExit(absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  for (LaunchedService& s : services_) {
    if (s.process == nullptr) continue;
    absl::StatusOr<int> st = s.process->Wait(std::max(absl::ZeroDuration(), until - absl::Now()));
    if (!st.ok()) continue;  // Stop() below ends it
    s.exit_status = *st;
    s.health = DescribeWaitStatus(*st);
  }
  for (LaunchedService& s : services_) {
    if (s.process != nullptr && s.process->running()) {
      Stop();  // the stragglers
      return false;
    }
  }
  stopped_ = true;
  bool clean = true;
  for (const LaunchedService& s : services_) {
    clean = clean && (s.process == nullptr || s.health == "exit 0");
  }
  return clean;
}

std::string FormatServiceTable(const std::vector<LaunchedService>& services) {
  std::string out = absl::StrFormat("  %-22s %4s %8s  %-22s %-32s %s\n", "SERVICE", "RANK", "PID",
                                    "GRPC", "METRICS", "STATE");
  for (const LaunchedService& s : services) {
    absl::StrAppendFormat(&out, "  %-22s %4s %8d  %-22s %-32s %s\n", s.binary->name,
                          s.binary->worker ? absl::StrCat(s.rank) : "-",
                          s.process ? s.process->pid() : 0,
                          absl::StrCat(s.host, ":", s.ports.grpc_port),
                          absl::StrCat("http://", s.host, ":", s.ports.metrics_port, "/metrics"),
                          s.health.empty() ? "STARTING" : s.health);
  }
  return out;
}

}  // namespace loom
