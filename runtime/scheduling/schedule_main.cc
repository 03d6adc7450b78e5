// loom-schedule: the scheduler's planning and assignment, offline.
//
//   loom-schedule plan --batch SCAN.jsonl --gpus 1296 --global_batch 4096
//       [--config vit300m-llm7b] [--output plan.json]
//   loom-schedule assign --batch SCAN.jsonl (--plan plan.json |
//       --llm_dp N --microbatches M --encoder_dp E) --algorithm loom --output out.json
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/batch_file.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/schedule.h"

ABSL_FLAG(std::string, batch, "", "Samples, one scan line each (loom-preprocess scan --output).");
ABSL_FLAG(std::string, output, "-", "Where the JSON goes; - for stdout.");
ABSL_FLAG(std::string, config, "vit300m-llm1b", "Model config (plan, and the cost model).");
// plan
ABSL_FLAG(int, gpus, 0, "plan: GPUs in the cluster.");
ABSL_FLAG(int, gpus_per_node, 8, "plan: GPUs per node (TP stays inside one).");
ABSL_FLAG(double, gpu_tflops, 989, "plan: peak dense bf16 TFLOP/s of one GPU.");
ABSL_FLAG(double, gpu_memory_gib, 80, "plan: memory of one GPU.");
ABSL_FLAG(double, link_gbps, 400, "plan: network bandwidth per GPU between nodes, Gb/s.");
ABSL_FLAG(int, global_batch, 0, "plan: samples per iteration (default: the batch file's size).");
ABSL_FLAG(int, max_microbatches, 64, "plan: most microbatches per LLM rank.");
ABSL_FLAG(bool, recompute, false, "plan: full activation recompute.");
ABSL_FLAG(std::string, freeze, "",
          "plan: modules that do not train, comma-separated: vision, projector, llm.");
// assign
ABSL_FLAG(std::string, plan, "", "assign: a plan from `loom-schedule plan`.");
ABSL_FLAG(int, llm_dp, 0, "assign: LLM DP ranks (instead of --plan).");
ABSL_FLAG(int, microbatches, 0, "assign: microbatches per LLM rank (instead of --plan).");
ABSL_FLAG(int, encoder_dp, 0, "assign: encoder DP ranks (instead of --plan).");
ABSL_FLAG(std::string, algorithm, "loom",
          "assign: sequential, lpt, disttrain, entrain, ilp, loom.");
ABSL_FLAG(double, ilp_seconds, 10, "assign: time limit of the ilp algorithm.");

namespace loom::sched {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "loom-schedule: %s\n", std::string(s.message()).c_str());
  return 2;
}

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

int Plan(const BatchFile& batch) {
  absl::StatusOr<ModelConfig> model = ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!model.ok()) return Fail(model.status());
  const int global_batch = absl::GetFlag(FLAGS_global_batch) > 0
                               ? absl::GetFlag(FLAGS_global_batch)
                               : static_cast<int>(batch.samples.size());
  PlanLimits limits;
  limits.max_microbatches = absl::GetFlag(FLAGS_max_microbatches);
  limits.recompute = absl::GetFlag(FLAGS_recompute);
  absl::StatusOr<Frozen> frozen = ParseFrozen(absl::GetFlag(FLAGS_freeze));
  if (!frozen.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--freeze: ", frozen.status().message())));
  }
  limits.frozen = *frozen;
  absl::StatusOr<scheduler::v1::Plan> plan =
      SearchPlan(ClusterFromFlags(), *model, StatsOf(Shapes(batch), global_batch), limits);
  if (!plan.ok()) return Fail(plan.status());
  if (absl::Status s = WriteJson(*plan); !s.ok()) return Fail(s);
  return 0;
}

absl::StatusOr<scheduler::v1::Plan> PlanForAssign() {
  absl::StatusOr<scheduler::v1::Plan> plan = PlanFromFileOrDegrees(
      absl::GetFlag(FLAGS_plan), {absl::GetFlag(FLAGS_llm_dp), absl::GetFlag(FLAGS_microbatches),
                                  absl::GetFlag(FLAGS_encoder_dp)});
  if (plan.ok() && plan->model().empty()) plan->set_model(absl::GetFlag(FLAGS_config));
  return plan;
}

int AssignCommand(const BatchFile& batch) {
  absl::StatusOr<scheduler::v1::Plan> plan = PlanForAssign();
  if (!plan.ok()) return Fail(plan.status());
  std::vector<std::string> keys;
  std::vector<SampleLoad> loads;
  for (const auto& s : batch.samples) keys.push_back(s.key());
  if (batch.has_costs) {
    for (const auto& s : batch.samples) loads.push_back({s.encoder_cost(), s.llm_cost(), 0});
  } else {
    scheduler::v1::CostCoefficients costs = plan->costs();
    if (!plan->has_costs()) {
      absl::StatusOr<ModelConfig> model =
          ModelConfigByName(plan->model().empty() ? absl::GetFlag(FLAGS_config) : plan->model());
      if (!model.ok()) return Fail(model.status());
      costs = CoefficientsOnOneGpu(*model, ClusterSpec());
    }
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

}  // namespace
}  // namespace loom::sched

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-schedule plan --batch FILE --gpus N [--global_batch B --config NAME ...]\n"
      "loom-schedule assign --batch FILE (--plan FILE | --llm_dp N --microbatches M "
      "--encoder_dp E) --algorithm NAME --output FILE");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || (std::string(args[1]) != "plan" && std::string(args[1]) != "assign")) {
    std::fprintf(stderr, "loom-schedule: give one command, plan or assign\n%s\n",
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string path = absl::GetFlag(FLAGS_batch);
  if (path.empty()) return loom::sched::Fail(absl::InvalidArgumentError("--batch is required"));
  absl::StatusOr<loom::sched::BatchFile> batch = loom::sched::ReadBatchFile(path);
  if (!batch.ok()) return loom::sched::Fail(batch.status());
  return std::string(args[1]) == "plan" ? loom::sched::Plan(*batch)
                                        : loom::sched::AssignCommand(*batch);
}
