// loom-schedule: the scheduler's planning and assignment, offline.
//
//   loom-schedule plan --batch SCAN.jsonl --gpus 1296 --global_batch 4096
//       [--config vit300m-llm7b | --llava CONFIG | --llm_from CONFIG --vision_from CONFIG]
//       [--output plan.json] [--job_output job.txtpb|job.json] [--values_output values.json]
//       [--macro_batches 32 --plan_candidates 8 --algorithm loom]
//
// The plan search's best --plan_candidates configurations (by the cost
// model on the scan's mean batch) are each simulated over --macro_batches
// global batches drawn from the scan, assigned by --algorithm
// (runtime/scheduling/macro.h); the one with the least mean simulated
// iteration is the plan, its p50/p90/max in the plan's `simulated`, and
// every candidate's on stderr. --macro_batches 0 plans on the mean alone.
//
// A CONFIG is a Hugging Face model directory or its config.json itself
// (runtime/hf/pretrained.h ModelConfigOfConfigs): the plan needs the
// configs alone. --job_output writes the plan as the job config `loom up
// --config` and loom-scheduler take; --values_output as the Helm chart's
// values (`helm install -f`).
//
// --gpu_kinds FILE plans on a cluster of several GPU kinds instead of
// --gpus (runtime/scheduling/gpu_kinds.h): each module on one kind, the
// least predicted iteration, or with --minimise_cost the least cost per
// sample among plans predicted within --max_iteration_seconds (plan.h
// SearchHeterogeneousPlans). The plan names each module's kind and the
// cluster's cost an hour; --values_output also places each module on its
// kind's nodes (the kind's node_selector as workers.<module>.nodeSelector).
//   loom-schedule assign --batch SCAN.jsonl (--plan plan.json |
//       --llm_dp N --microbatches M --encoder_dp E) --algorithm loom --output out.json
//   loom-schedule simulate --batch SCAN.jsonl (--plan plan.json | --llm_dp N ...)
//       [--macro_batches 32 --global_batch B --algorithm loom] [--output dist.json]
//
// simulate: one plan's simulated iteration over --macro_batches global
// batches drawn from the scan (macro.h): mean, p50, p90, max.
//   loom-schedule profile --config tiny [--device cpu|cuda:N] [--output profile.json]
//
// profile: the model's modules timed on the device and the cost model's
// coefficients fitted to them (profile.h); assign and simulate take it
// (--profile FILE) in place of the analytic coefficients.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "loom/job/v1/job.pb.h"
#include "nlohmann/json.hpp"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/base/file.h"
#include "runtime/hf/model_flags.h"
#include "runtime/hf/pretrained.h"
#include "runtime/model/config.h"
#include "runtime/model/ops.h"
#include "runtime/model/precision.h"
#include "runtime/scheduling/batch_file.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/gpu_kinds.h"
#include "runtime/scheduling/macro.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/profile.h"
#include "runtime/scheduling/schedule.h"
#include "runtime/scheduling/schedule_commands.h"

ABSL_FLAG(std::string, batch, "", "Samples, one scan line each (loom-preprocess scan --output).");
ABSL_FLAG(std::string, output, "-", "Where the JSON goes; - for stdout.");
ABSL_FLAG(std::string, config, "vit300m-llm1b", "Model config (plan, and the cost model).");
// plan
ABSL_FLAG(int, gpus, 0, "plan: GPUs in the cluster.");
ABSL_FLAG(std::string, gpu_kinds, "",
          "plan: a JSON file of the cluster's GPU kinds (runtime/scheduling/gpu_kinds.h), "
          "instead of --gpus and the --gpu_* flags: each module is placed on one kind.");
ABSL_FLAG(bool, minimise_cost, false,
          "plan --gpu_kinds: the least cost per sample instead of the least iteration time.");
ABSL_FLAG(double, max_iteration_seconds, 0,
          "plan --gpu_kinds --minimise_cost: the longest predicted iteration allowed (0: any).");
ABSL_FLAG(int, gpus_per_node, 8, "plan: GPUs per node (TP stays inside one).");
ABSL_FLAG(double, gpu_tflops, 989, "plan: peak dense bf16 TFLOP/s of one GPU.");
ABSL_FLAG(double, gpu_memory_gib, 80, "plan: memory of one GPU.");
ABSL_FLAG(double, link_gbps, 400, "plan: network bandwidth per GPU between nodes, Gb/s.");
ABSL_FLAG(int, global_batch, 0, "plan: samples per iteration (default: the batch file's size).");
ABSL_FLAG(int, max_microbatches, 64, "plan: most microbatches per LLM rank.");
ABSL_FLAG(std::string, recompute, "none",
          "plan: how the workers keep activations, priced by the time and memory models and "
          "written into the job for both modules: none, selective or full "
          "(runtime/model/precision.h Recompute); auto: the search chooses each module's.");
ABSL_FLAG(std::string, freeze, "",
          "plan, assign, simulate: modules that do not train, comma-separated: vision, "
          "projector, llm (priced cheaper: by the cost model, or by --profile's frozen points).");
ABSL_FLAG(std::string, job_output, "",
          "plan: also write the plan as a job config (.json: JSON, else text format) for "
          "`loom up --config` and loom-scheduler --job.");
ABSL_FLAG(std::string, values_output, "",
          "plan: also write the plan as Helm values ({\"job\": ...}) for `helm install -f`; "
          "the chart runs disaggregated layouts, so the search then leaves colocated ones out.");
ABSL_FLAG(bool, colocate, true,
          "plan: consider colocated layouts too (the encoder's ranks on the LLM's first-stage "
          "GPUs: the job's parallel.colocate).");
ABSL_FLAG(bool, sequence_parallel, true,
          "plan: price sequence parallelism in TP groups (the job's parallel.sequence_parallel).");
ABSL_FLAG(std::string, shards, "", "plan: the job's data.shards (the shards the scan read).");
ABSL_FLAG(int, macro_batches, 32,
          "plan: global batches drawn from the scan to simulate each candidate plan on "
          "(runtime/scheduling/macro.h); 0: choose on the mean batch alone.");
ABSL_FLAG(int, plan_candidates, 8,
          "plan: how many of the search's best configurations the macro-batches judge.");
ABSL_FLAG(uint64_t, macro_seed, 1, "plan: the seed the macro-batches are drawn with.");
ABSL_FLAG(std::string, device, "cuda", "plan: the job's device for both modules.");
ABSL_FLAG(std::string, precision, "bf16",
          "plan: the job's precision, which the memory model prices (fp32 or bf16).");
ABSL_FLAG(bool, shard_optimizer, false,
          "plan: the job shards AdamW's state over each module's DP ranks (ZeRO-1, "
          "optimizer { shard: true }), which the memory model prices.");
// assign
ABSL_FLAG(std::string, plan, "", "assign: a plan from `loom-schedule plan`.");
ABSL_FLAG(int, llm_dp, 0, "assign: LLM DP ranks (instead of --plan).");
ABSL_FLAG(int, microbatches, 0, "assign: microbatches per LLM rank (instead of --plan).");
ABSL_FLAG(int, encoder_dp, 0, "assign: encoder DP ranks (instead of --plan).");
ABSL_FLAG(std::string, algorithm, "loom",
          "assign, and plan's macro-batches: sequential, lpt, disttrain, entrain, ilp, loom.");
ABSL_FLAG(double, ilp_seconds, 10, "assign: time limit of the ilp algorithm.");
ABSL_FLAG(std::string, profile, "",
          "assign, simulate: a profile from `loom-schedule profile`: its fitted coefficients "
          "price the samples in place of the plan's. plan: the search's candidates are priced "
          "by it (a TP it did not measure scaled by the planner's TP model) and the macro-batches "
          "choose among them.");
// profile
ABSL_FLAG(std::string, profile_device, "cpu", "profile: where the modules run: cpu, cuda:N.");
ABSL_FLAG(bool, profile_communication, true,
          "profile: this host's all-reduces (Gloo, 2 and 4 ranks) and UCX transfers too.");
ABSL_FLAG(int, profile_repeats, 3, "profile: timed runs per point (the median), after a warm-up.");
ABSL_FLAG(std::string, profile_tiles, "1,2,4,8",
          "profile: encoder tiles per bin, comma-separated.");
ABSL_FLAG(std::string, profile_tokens, "128,256,512,1024",
          "profile: LLM tokens per bin (multiples of 4), comma-separated.");
ABSL_FLAG(std::string, profile_precision, "fp32",
          "profile: fp32, or bf16 mixed precision (validate: the job's precision instead).");
ABSL_FLAG(std::string, profile_tp, "1",
          "profile: TP degrees, comma-separated: the first the profile's own, the others its "
          "at_tp (TP > 1 on the CPU alone: the group's ranks as threads over Gloo). validate adds "
          "the layouts' TPs.");

namespace loom::sched {
namespace {

absl::Status WriteJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(m, &json, o); !s.ok()) {
    return absl::InternalError(std::string(s.message()));
  }
  json += "\n";
  const std::string out = absl::GetFlag(FLAGS_output);
  if (out == "-") {
    std::fputs(json.c_str(), stdout);
    return absl::OkStatus();
  }
  return WriteFileAtomically(out, json);
}

ClusterSpec ClusterFromFlags() {
  ClusterSpec c;
  c.gpus = absl::GetFlag(FLAGS_gpus);
  c.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  c.peak_flops = absl::GetFlag(FLAGS_gpu_tflops) * 1e12;
  c.memory_bytes = absl::GetFlag(FLAGS_gpu_memory_gib) * (1ull << 30);
  c.inter_node_bytes_per_second = absl::GetFlag(FLAGS_link_gbps) * 1e9 / 8;
  return c;
}

std::vector<SampleShape> Shapes(const BatchFile& batch) {
  std::vector<SampleShape> shapes;
  for (const auto& s : batch.samples) shapes.push_back(ShapeOf(s));
  return shapes;
}

// A job's hf field for a source path: the directory (a config.json file's
// own), where the workers read the weights.
std::string ModelDir(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return path;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// The job config that runs `plan`: its model, degrees, batch and frozen
// modules, with the flags' data, device and precision.
absl::StatusOr<job::v1::JobConfig> JobOfPlan(const scheduler::v1::Plan& plan,
                                             const hf::ModelSource& source, const Frozen& frozen) {
  job::v1::JobConfig job;
  if (source.pretrained()) {
    job::v1::HfConfig* h = job.mutable_hf();
    if (!source.llava.empty()) h->set_llava(ModelDir(source.llava));
    if (!source.llm_from.empty()) h->set_llm_from(ModelDir(source.llm_from));
    if (!source.vision_from.empty()) h->set_vision_from(ModelDir(source.vision_from));
    if (source.vision_feature_layer) h->set_vision_feature_layer(*source.vision_feature_layer);
  } else {
    job.set_model(source.config);
  }
  job::v1::DataConfig* d = job.mutable_data();
  d->set_global_batch(plan.global_batch());
  d->set_shards(absl::GetFlag(FLAGS_shards));
  job::v1::ParallelConfig* p = job.mutable_parallel();
  p->set_encoder_tp(plan.encoder().tp());
  p->set_encoder_pp(plan.encoder().pp());
  p->set_encoder_dp(plan.encoder().dp());
  p->set_llm_tp(plan.llm().tp());
  p->set_llm_pp(plan.llm().pp());
  p->set_llm_dp(plan.llm().dp());
  p->set_microbatches(plan.microbatches());
  p->set_colocate(plan.colocated());
  p->set_sequence_parallel(plan.sequence_parallel());
  if (frozen.vision || frozen.projector || frozen.llm) {
    job.mutable_freeze()->set_vision(frozen.vision);
    job.mutable_freeze()->set_projector(frozen.projector);
    job.mutable_freeze()->set_llm(frozen.llm);
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (absl::StatusOr<int> dev = ParseDevice(device); !dev.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", dev.status().message()));
  }
  job.mutable_device()->set_encoder(device);
  job.mutable_device()->set_llm(device);
  if (absl::StatusOr<Precision> pr = ParsePrecision(absl::GetFlag(FLAGS_precision)); !pr.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--precision: ", pr.status().message()));
  }
  job.set_precision(absl::GetFlag(FLAGS_precision));
  if (absl::GetFlag(FLAGS_shard_optimizer)) job.mutable_optimizer()->set_shard(true);
  job.mutable_recompute()->set_encoder(plan.encoder_recompute());
  job.mutable_recompute()->set_llm(plan.llm_recompute());
  return job;
}

absl::StatusOr<std::string> JobJson(const job::v1::JobConfig& job) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.add_whitespace = true;
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(job, &json, o); !s.ok()) {
    return absl::InternalError(std::string(s.message()));
  }
  return json;
}

// `kinds`' node selectors of the plan's modules as the chart's values
// ("" when neither has one).
std::string PlacementValues(const scheduler::v1::Plan& plan, const std::vector<GpuKind>& kinds) {
  nlohmann::json workers = nlohmann::json::object();
  for (const auto& [module, kind] :
       {std::pair<const char*, std::string>{"encoder", plan.encoder().gpu_kind()},
        {"llm", plan.llm().gpu_kind()}}) {
    for (const GpuKind& k : kinds) {
      if (k.name != kind || k.node_selector.empty()) continue;
      workers[module]["nodeSelector"] = k.node_selector;
    }
  }
  return workers.empty() ? "" : workers.dump(2);
}

absl::Status WriteJob(const job::v1::JobConfig& job, const std::string& placement) {
  if (const std::string path = absl::GetFlag(FLAGS_job_output); !path.empty()) {
    std::string text;
    if (absl::EndsWith(path, ".json")) {
      absl::StatusOr<std::string> json = JobJson(job);
      if (!json.ok()) return json.status();
      text = *json;
    } else if (!google::protobuf::TextFormat::PrintToString(job, &text)) {
      return absl::InternalError("--job_output: the job did not print");
    }
    if (absl::Status s = WriteFileAtomically(path, text); !s.ok()) return s;
  }
  if (const std::string path = absl::GetFlag(FLAGS_values_output); !path.empty()) {
    absl::StatusOr<std::string> json = JobJson(job);
    if (!json.ok()) return json.status();
    const std::string workers = placement.empty() ? "" : ",\n\"workers\": " + placement;
    if (absl::Status s = WriteFileAtomically(path, "{\"job\": " + *json + workers + "}\n");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

int Plan(const BatchFile& batch) {
  const hf::ModelSource source = hf::ModelSourceFromFlags(absl::GetFlag(FLAGS_config));
  absl::StatusOr<ModelConfig> model = hf::ModelConfigOfConfigs(source);
  if (!model.ok()) {
    return Fail(absl::Status(
        model.status().code(),
        absl::StrCat(source.pretrained() ? "--" : "--config: ", model.status().message())));
  }
  const int global_batch = absl::GetFlag(FLAGS_global_batch) > 0
                               ? absl::GetFlag(FLAGS_global_batch)
                               : static_cast<int>(batch.samples.size());
  PlanLimits limits;
  limits.max_microbatches = absl::GetFlag(FLAGS_max_microbatches);
  if (absl::GetFlag(FLAGS_recompute) == "auto") {
    limits.search_recompute = true;
  } else {
    absl::StatusOr<Recompute> recompute = ParseRecompute(absl::GetFlag(FLAGS_recompute));
    if (!recompute.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--recompute: ", recompute.status().message(), " (or auto)")));
    }
    limits.recompute = *recompute;
  }
  absl::StatusOr<Precision> precision = ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--precision: ", precision.status().message())));
  }
  limits.precision = *precision;
  limits.shard_optimizer = absl::GetFlag(FLAGS_shard_optimizer);
  limits.colocate = absl::GetFlag(FLAGS_colocate) && absl::GetFlag(FLAGS_values_output).empty();
  limits.sequence_parallel = absl::GetFlag(FLAGS_sequence_parallel);
  absl::StatusOr<Frozen> frozen = ParseFrozen(absl::GetFlag(FLAGS_freeze));
  if (!frozen.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--freeze: ", frozen.status().message())));
  }
  limits.frozen = *frozen;
  const int macro_batches = absl::GetFlag(FLAGS_macro_batches);
  const int plan_candidates = absl::GetFlag(FLAGS_plan_candidates);
  if (macro_batches < 0 || plan_candidates < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--macro_batches (", macro_batches,
                                                        ") must be >= 0 and --plan_candidates (",
                                                        plan_candidates, ") >= 1")));
  }
  const std::vector<SampleShape> shapes = Shapes(batch);
  const int count = macro_batches > 0 ? plan_candidates : 1;
  std::vector<GpuKind> kinds;
  absl::StatusOr<std::vector<scheduler::v1::Plan>> candidates;
  if (const std::string path = absl::GetFlag(FLAGS_gpu_kinds); !path.empty()) {
    if (absl::GetFlag(FLAGS_gpus) > 0) {
      return Fail(absl::InvalidArgumentError(
          "--gpu_kinds: the kinds' counts are the cluster; leave --gpus out"));
    }
    if (limits.search_recompute) {
      return Fail(absl::InvalidArgumentError(
          "--gpu_kinds: --recompute auto is not searched across kinds; name none, selective "
          "or full"));
    }
    absl::StatusOr<std::vector<GpuKind>> read = ReadGpuKinds(path);
    if (!read.ok()) return Fail(read.status());
    kinds = *std::move(read);
    HeterogeneousOptions options;
    options.minimise_cost = absl::GetFlag(FLAGS_minimise_cost);
    options.max_iteration_seconds = absl::GetFlag(FLAGS_max_iteration_seconds);
    if (options.max_iteration_seconds < 0) {
      return Fail(absl::InvalidArgumentError("--max_iteration_seconds: must be >= 0"));
    }
    candidates = SearchHeterogeneousPlans(kinds, *model, StatsOf(shapes, global_batch), limits,
                                          options, count);
  } else {
    if (absl::GetFlag(FLAGS_minimise_cost) || absl::GetFlag(FLAGS_max_iteration_seconds) > 0) {
      return Fail(absl::InvalidArgumentError(
          "--minimise_cost and --max_iteration_seconds: they need --gpu_kinds (priced kinds)"));
    }
    candidates =
        SearchPlans(ClusterFromFlags(), *model, StatsOf(shapes, global_batch), limits, count);
  }
  if (!candidates.ok()) return Fail(candidates.status());
  if (const std::string path = absl::GetFlag(FLAGS_profile); !path.empty()) {
    if (!kinds.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--profile: a profile measures one device, and --gpu_kinds plans on several; plan "
          "without it (the kinds' spec figures price them)"));
    }
    if (macro_batches == 0) {
      return Fail(absl::InvalidArgumentError(
          "--profile: the macro-batches choose among the profiled candidates: set "
          "--macro_batches > 0"));
    }
    absl::StatusOr<scheduler::v1::Profile> profile = ReadProfile(path);
    if (!profile.ok()) return Fail(profile.status());
    for (scheduler::v1::Plan& c : *candidates) {
      std::string scaled;
      if (absl::Status s = ApplyProfile(*profile, &c, &scaled, limits.frozen); !s.ok()) {
        return Fail(absl::Status(s.code(), absl::StrCat("--profile ", path, ": ", s.message())));
      }
      if (!scaled.empty()) {
        std::fprintf(stderr, "loom-schedule: %s: %s scaled from the profile's TP %d\n",
                     LayoutText(c).c_str(), scaled.c_str(), profile->tp());
      }
    }
  }
  absl::StatusOr<scheduler::v1::Plan> plan = candidates->front();
  if (macro_batches > 0) {
    MacroBatchOptions m;
    m.batches = macro_batches;
    m.seed = absl::GetFlag(FLAGS_macro_seed);
    m.algorithm = absl::GetFlag(FLAGS_algorithm);
    m.ilp_time_limit_seconds = absl::GetFlag(FLAGS_ilp_seconds);
    std::vector<scheduler::v1::IterationDistribution> each;
    plan = ChooseOverMacroBatches(*candidates, shapes, m, &each);
    if (!plan.ok()) return Fail(plan.status());
    if (absl::GetFlag(FLAGS_minimise_cost)) {
      // The least cost per sample over the macro-batches (the cost an hour
      // times the mean simulated iteration), within the iteration bound.
      const double bound = absl::GetFlag(FLAGS_max_iteration_seconds);
      int cheapest = -1;
      for (size_t i = 0; i < each.size(); ++i) {
        if (bound > 0 && each[i].mean() > bound) continue;
        const auto cost = [&](size_t j) {
          return (*candidates)[j].cost_per_hour() * each[j].mean();
        };
        if (cheapest < 0 || cost(i) < cost(cheapest)) cheapest = static_cast<int>(i);
      }
      if (cheapest < 0) {
        return Fail(absl::ResourceExhaustedError(absl::StrCat(
            "--max_iteration_seconds ", bound, ": no candidate's mean simulated iteration over ",
            macro_batches, " macro-batches is within it")));
      }
      plan = (*candidates)[cheapest];
      *plan->mutable_simulated() = each[cheapest];
    }
    for (size_t i = 0; i < each.size(); ++i) {
      const scheduler::v1::IterationDistribution& d = each[i];
      std::fprintf(stderr,
                   "loom-schedule: candidate %zu: %s: predicted %.6g s (mean batch); simulated "
                   "over %d batches (%s): mean %.6g p50 %.6g p90 %.6g max %.6g s%s\n",
                   i + 1, LayoutText((*candidates)[i]).c_str(),
                   (*candidates)[i].predicted_iteration_seconds(), d.batches(),
                   d.algorithm().c_str(), d.mean(), d.p50(), d.p90(), d.max(),
                   LayoutText((*candidates)[i]) == LayoutText(*plan) ? "  <- the plan" : "");
    }
  }
  if (absl::Status s = WriteJson(*plan); !s.ok()) return Fail(s);
  absl::StatusOr<job::v1::JobConfig> job = JobOfPlan(*plan, source, *frozen);
  if (!job.ok()) return Fail(job.status());
  if (absl::Status s = WriteJob(*job, PlacementValues(*plan, kinds)); !s.ok()) return Fail(s);
  if (!kinds.empty()) {
    std::fprintf(stderr, "loom-schedule: plan: encoder on %s, LLM on %s, %d GPUs, %.6g an hour\n",
                 plan->encoder().gpu_kind().c_str(), plan->llm().gpu_kind().c_str(),
                 plan->cluster_gpus(), plan->cost_per_hour());
  }
  return 0;
}

absl::StatusOr<scheduler::v1::Plan> PlanForAssign() {
  absl::StatusOr<scheduler::v1::Plan> plan = PlanFromFileOrDegrees(
      absl::GetFlag(FLAGS_plan), {absl::GetFlag(FLAGS_llm_dp), absl::GetFlag(FLAGS_microbatches),
                                  absl::GetFlag(FLAGS_encoder_dp)});
  if (plan.ok() && plan->model().empty()) plan->set_model(absl::GetFlag(FLAGS_config));
  return plan;
}

// The plan's cost coefficients: --profile's when given; a plan from
// degrees has none: one GPU's at the model's analytic FLOPs.
absl::Status FillCosts(scheduler::v1::Plan* plan) {
  absl::StatusOr<Frozen> frozen = ParseFrozen(absl::GetFlag(FLAGS_freeze));
  if (!frozen.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--freeze: ", frozen.status().message()));
  }
  if (const std::string path = absl::GetFlag(FLAGS_profile); !path.empty()) {
    absl::StatusOr<scheduler::v1::Profile> profile = ReadProfile(path);
    if (!profile.ok()) {
      return absl::Status(profile.status().code(),
                          absl::StrCat("--profile ", profile.status().message()));
    }
    if (!plan->has_costs()) *plan->mutable_costs() = scheduler::v1::CostCoefficients();
    if (absl::Status s = ApplyProfile(*profile, plan, nullptr, *frozen); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--profile ", path, ": ", s.message()));
    }
    return absl::OkStatus();
  }
  if (plan->has_costs()) return absl::OkStatus();
  absl::StatusOr<ModelConfig> model = ModelConfigByName(plan->model());
  if (!model.ok()) return model.status();
  *plan->mutable_costs() = CoefficientsOnOneGpu(*model, ClusterSpec(), *frozen);
  return absl::OkStatus();
}

std::vector<int> IntList(const std::string& flag, const std::string& text, absl::Status* error) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      *error =
          absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", part, "\" is not a number"));
      return {};
    }
    out.push_back(v);
  }
  return out;
}

int ProfileCommand() {
  absl::StatusOr<ModelConfig> model = ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<scheduler::v1::Profile> p = ProfileFromFlags(*model, {}, "");
  if (!p.ok()) return Fail(p.status());
  if (absl::Status s = WriteJson(*p); !s.ok()) return Fail(s);
  return 0;
}

int AssignCommand(const BatchFile& batch) {
  absl::StatusOr<scheduler::v1::Plan> plan = PlanForAssign();
  if (!plan.ok()) return Fail(plan.status());
  std::vector<std::string> keys;
  std::vector<SampleLoad> loads;
  for (const auto& s : batch.samples) keys.push_back(s.key());
  if (batch.has_costs && absl::GetFlag(FLAGS_profile).empty()) {
    for (const auto& s : batch.samples) loads.push_back({s.encoder_cost(), s.llm_cost(), 0});
  } else {
    if (absl::Status s = FillCosts(&*plan); !s.ok()) return Fail(s);
    const scheduler::v1::CostCoefficients& costs = plan->costs();
    loads = CostModel(costs).Loads(Shapes(batch), costs.transfer_per_image_token());
  }
  absl::StatusOr<scheduler::v1::Assignment> a = AssignForPlan(
      *plan, keys, loads, absl::GetFlag(FLAGS_algorithm), absl::GetFlag(FLAGS_ilp_seconds));
  if (!a.ok()) return Fail(a.status());
  if (absl::Status s = WriteJson(*a); !s.ok()) return Fail(s);
  const auto& sum = a->summary();
  std::fprintf(stderr,
               "loom-schedule: %s: %d samples in %d bins; max/bound encoder %.4f llm %.4f; "
               "simulated iteration %.6g s; %.3f ms\n",
               sum.algorithm().c_str(), sum.samples(), sum.bins(),
               sum.encoder().max_over_lower_bound(), sum.llm().max_over_lower_bound(),
               sum.simulated_iteration_seconds(), sum.wall_seconds() * 1e3);
  return 0;
}

// The simulated iteration of one plan over macro-batches drawn from the
// scan: its distribution as JSON.
int SimulateCommand(const BatchFile& batch) {
  absl::StatusOr<scheduler::v1::Plan> plan = PlanForAssign();
  if (!plan.ok()) return Fail(plan.status());
  if (absl::Status s = FillCosts(&*plan); !s.ok()) return Fail(s);
  // --global_batch, else the plan's, else the batch file's size.
  const int flag_batch = absl::GetFlag(FLAGS_global_batch);
  plan->set_global_batch(flag_batch > 0             ? flag_batch
                         : plan->global_batch() > 0 ? plan->global_batch()
                                                    : static_cast<int>(batch.samples.size()));
  MacroBatchOptions m;
  m.batches = absl::GetFlag(FLAGS_macro_batches);
  m.seed = absl::GetFlag(FLAGS_macro_seed);
  m.algorithm = absl::GetFlag(FLAGS_algorithm);
  m.ilp_time_limit_seconds = absl::GetFlag(FLAGS_ilp_seconds);
  absl::StatusOr<scheduler::v1::IterationDistribution> d =
      SimulateMacroBatches(*plan, Shapes(batch), m);
  if (!d.ok()) return Fail(d.status());
  if (absl::Status s = WriteJson(*d); !s.ok()) return Fail(s);
  std::fprintf(stderr,
               "loom-schedule: %s: simulated over %d batches of %d (%s): mean %.6g p50 %.6g p90 "
               "%.6g max %.6g s\n",
               LayoutText(*plan).c_str(), d->batches(), plan->global_batch(),
               d->algorithm().c_str(), d->mean(), d->p50(), d->p90(), d->max());
  return 0;
}

}  // namespace

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "loom-schedule: %s\n", std::string(s.message()).c_str());
  return 2;
}

absl::StatusOr<scheduler::v1::Profile> ProfileFromFlags(const ModelConfig& model,
                                                        const std::vector<int>& more_tps,
                                                        const std::string& precision) {
  std::unique_ptr<Ops> owned;
  absl::StatusOr<Ops*> ops = OpsForDevice(absl::GetFlag(FLAGS_profile_device), &owned);
  if (!ops.ok()) {
    return absl::Status(ops.status().code(),
                        absl::StrCat("--profile_device: ", ops.status().message()));
  }
  ProfileOptions o;
  o.repeats = absl::GetFlag(FLAGS_profile_repeats);
  o.communication = absl::GetFlag(FLAGS_profile_communication);
  const std::string pr = precision.empty() ? absl::GetFlag(FLAGS_profile_precision) : precision;
  absl::StatusOr<Precision> parsed = ParsePrecision(pr);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(precision.empty() ? "--profile_precision: " : "job.precision: ",
                     parsed.status().message()));
  }
  o.precision = *parsed;
  absl::Status error;
  o.tiles = IntList("profile_tiles", absl::GetFlag(FLAGS_profile_tiles), &error);
  if (error.ok()) o.tokens = IntList("profile_tokens", absl::GetFlag(FLAGS_profile_tokens), &error);
  if (error.ok()) o.tps = IntList("profile_tp", absl::GetFlag(FLAGS_profile_tp), &error);
  if (!error.ok()) return error;
  for (int tp : more_tps) {
    if (std::find(o.tps.begin(), o.tps.end(), tp) == o.tps.end()) o.tps.push_back(tp);
  }
  absl::StatusOr<scheduler::v1::Profile> p = ProfileModules(model, *ops, o);
  if (!p.ok()) return p.status();
  std::vector<const scheduler::v1::Profile*> each = {&*p};
  for (const scheduler::v1::Profile& at : p->at_tp()) each.push_back(&at);
  for (const scheduler::v1::Profile* x : each) {
    std::fprintf(stderr,
                 "loom-schedule: profile of %s on %s in %s at TP %d: %.4g s a tile (largest misfit "
                 "%.1f%%), %.4g s a token + %.4g s a squared token (largest misfit %.1f%%)\n",
                 x->model().c_str(), x->device().c_str(), p->precision().c_str(), x->tp(),
                 x->encoder_per_tile(), 100 * x->encoder_max_residual(), x->llm_per_token(),
                 x->llm_per_token_sq(), 100 * x->llm_max_residual());
  }
  if (!p->comm().empty()) {
    auto gbps = [](double seconds_per_byte) {
      return seconds_per_byte > 0 ? 1e-9 / seconds_per_byte : 0.0;
    };
    std::fprintf(stderr,
                 "loom-schedule: this host's communication: all-reduce %.3g s a ring step + "
                 "%.3g GB/s, UCX transfer %.3g s + %.3g GB/s (%d points)\n",
                 p->allreduce_latency_seconds(), gbps(p->allreduce_seconds_per_byte()),
                 p->transfer_latency_seconds(), gbps(p->transfer_seconds_per_byte()),
                 p->comm_size());
  }
  return p;
}

}  // namespace loom::sched

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-schedule plan --batch FILE (--gpus N | --gpu_kinds FILE [--minimise_cost]) "
      "[--global_batch B --config NAME | --llava CONFIG "
      "| --llm_from CONFIG --vision_from CONFIG] [--job_output FILE --values_output FILE ...]\n"
      "loom-schedule assign --batch FILE (--plan FILE | --llm_dp N --microbatches M "
      "--encoder_dp E) --algorithm NAME --output FILE\n"
      "loom-schedule simulate --batch FILE (--plan FILE | --llm_dp N ...) [--macro_batches N "
      "--global_batch B --algorithm NAME --profile FILE --output FILE]\n"
      "loom-schedule profile --config NAME [--profile_device cpu|cuda:N --output FILE]\n"
      "loom-schedule validate --config JOB --layouts 'L1;L2;...' [--profile FILE --steps K "
      "--warmup W --dir DIR --output FILE] (--config: a job config file here)");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string command = args.size() == 2 ? args[1] : "";
  if (command != "plan" && command != "assign" && command != "simulate" && command != "profile" &&
      command != "validate") {
    std::fprintf(stderr,
                 "loom-schedule: give one command, plan, assign, simulate, profile or validate\n"
                 "%s\n",
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  if (command == "profile") return loom::sched::ProfileCommand();
  if (command == "validate") return loom::sched::ValidateCommand();
  const std::string path = absl::GetFlag(FLAGS_batch);
  if (path.empty()) return loom::sched::Fail(absl::InvalidArgumentError("--batch is required"));
  absl::StatusOr<loom::sched::BatchFile> batch = loom::sched::ReadBatchFile(path);
  if (!batch.ok()) return loom::sched::Fail(batch.status());
  if (command == "simulate") return loom::sched::SimulateCommand(*batch);
  return command == "plan" ? loom::sched::Plan(*batch) : loom::sched::AssignCommand(*batch);
}
