// The job config (loom.job.v1.JobConfig): loading from a file in JSON or
// protobuf text format, the defaults, and validation.
//
// Errors name the field: an unknown field ("data.shard" in JSON or text),
// a value of the wrong type, or a value out of range ("parallel.llm_dp: must
// be >= 1, got 0"). Defaults are those written in job.proto.
#ifndef LOOM_SERVICES_COMMON_JOB_H_
#define LOOM_SERVICES_COMMON_JOB_H_

#include <string>

#include "absl/status/statusor.h"
#include "loom/job/v1/job.pb.h"
#include "runtime/hf/pretrained.h"
#include "runtime/model/memory.h"
#include "runtime/model/model.h"
#include "runtime/train/trainer.h"

namespace loom {

// Fills every field left unset with its default. `run_dir` roots the
// generated data and the checkpoints.
void ApplyJobDefaults(const std::string& run_dir, job::v1::JobConfig* job);

// INVALID_ARGUMENT naming the first bad field.
absl::Status ValidateJob(const job::v1::JobConfig& job);

// Parses `text`: JSON when its first non-blank character is '{', else text
// format. `origin` names the source in errors. No defaults applied.
absl::StatusOr<job::v1::JobConfig> ParseJobConfig(const std::string& text,
                                                  const std::string& origin);

// ReadFile + ParseJobConfig + ApplyJobDefaults + ValidateJob.
absl::StatusOr<job::v1::JobConfig> LoadJobConfig(const std::string& path,
                                                 const std::string& run_dir);

// Where the job's model comes from: `model`, or the `hf` directories.
hf::ModelSource JobModelSource(const job::v1::JobConfig& job);

// ResolveModel(JobModelSource(job)), errors naming the job's field
// ("hf.llava: ...", "model: ...").
absl::StatusOr<hf::PretrainedModel> JobModel(const job::v1::JobConfig& job);

// The modules the job does not train (job.freeze).
Frozen JobFrozen(const job::v1::JobConfig& job);
// The device (device.encoder or device.llm) of the encoder's or the LLM's
// workers, a name for ParseDevice (runtime/model/ops.h).
const std::string& JobDevice(const job::v1::JobConfig& job, bool encoder);
// Whether the module's device is a GPU (not "cpu").
bool JobModuleOnGpu(const job::v1::JobConfig& job, bool encoder);

// What one rank of pipeline stage `stage` of the encoder (`encoder`) or the
// LLM holds under the job's precision, optimizer sharding, freezing, layout
// and devices (runtime/model/memory.h): for LLM microbatches of `tokens`
// tokens, `image_tokens` of them image positions, or encoder bins of
// `tiles` tiles, `bins` of them kept at once (`kept_tiles`: their tiles in
// all where known, EncoderStageMemory). On a GPU (device.encoder or
// device.llm) it counts what the device holds, on the CPU the host memory.
MemoryEstimate JobStageMemory(const job::v1::JobConfig& job, const ModelConfig& model, bool encoder,
                              int stage, int64_t tokens, int64_t image_tokens, int64_t tiles,
                              int bins, int64_t kept_tiles = -1);

// A generator rank's memory at `images` output images a bin, `bins` bins
// (its denoiser's blocks of pipeline stage `stage` priced as an encoder's;
// on device.llm's kind); `stage` -1: the largest stage's.
MemoryEstimate JobGeneratorMemory(const job::v1::JobConfig& job, const ModelConfig& model,
                                  int64_t images, int bins, int stage = -1);

// With device.memory_gib set: RESOURCE_EXHAUSTED naming the module, the
// stage and the figures when some rank of some stage would hold more than
// that at the token caps (called by ValidateJob).
absl::Status CheckJobMemory(const job::v1::JobConfig& job, const ModelConfig& model);

// The job as one line of JSON (for logs and for handing to a child process).
std::string JobToJson(const job::v1::JobConfig& job);

// The job's shards as loom-preprocess's --shards takes them: data.shards,
// or the mixture data.sources as "GLOB=WEIGHT,..." (runtime/data/loader.h,
// ParseShardSources); empty for a generated preset.
std::string JobShards(const job::v1::JobConfig& job);

// Batches in a validation pass: data.validation.samples in whole global
// batches; 0 without data.validation.
int ValidationBatches(const job::v1::JobConfig& job);

// What a resume must not change, as one line (runtime/checkpoint/steps.h):
// the model (its name, or its directories), the seed, the global batch and
// the data. The parallel degrees,
// the assignment algorithm and the step count may change.
std::string JobCheckpointIdentity(const job::v1::JobConfig& job);

// The optimizer's options for `job` (after ApplyJobDefaults): AdamW,
// clipping, weight decay, the learning-rate schedule and each module's peak.
TrainOptions JobTrainOptions(const job::v1::JobConfig& job);

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_JOB_H_
