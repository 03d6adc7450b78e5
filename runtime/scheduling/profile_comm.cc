#include "runtime/scheduling/profile_comm.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/base/stats.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/ucx.h"
#include "runtime/model/memory.h"
#include "runtime/scheduling/profile.h"

namespace loom::sched {
namespace {

constexpr int64_t kMostBytes = int64_t{256} << 20;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median seconds of `repeats` all-reduces of each size in `bytes` over
// `ranks` threads (Gloo on 127.0.0.1), after one warm-up each: rank 0's.
absl::StatusOr<std::vector<double>> TimeAllreduces(int ranks, const std::vector<int64_t>& bytes,
                                                   int repeats) {
  std::vector<double> out(bytes.size());
  InMemoryStore store;
  absl::Status s = OnGlooThreads(
      &store, absl::StrCat("profile-allreduce", ranks), ranks, absl::Seconds(120),
      [&](int rank, Communicator* comm) -> absl::Status {
        for (size_t k = 0; k < bytes.size(); ++k) {
          std::vector<float> data(static_cast<size_t>(std::max<int64_t>(1, bytes[k] / 4)), 1.0f);
          std::vector<double> seconds;
          for (int i = 0; i <= repeats; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            if (absl::Status e = comm->AllreduceSum(data.data(), static_cast<int64_t>(data.size()));
                !e.ok()) {
              return e;
            }
            if (i > 0) seconds.push_back(SecondsSince(t0));
          }
          if (rank == 0) out[k] = Median(seconds);
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return out;
}

// The median seconds of `repeats` transfers of `bytes` from one UCX worker
// to another (send, then the receiver's RecvAll), after one warm-up.
absl::StatusOr<double> TimeTransfer(UcxWorker* from, UcxWorker* to, int64_t bytes, int repeats,
                                    uint64_t* tag) {
  auto data = std::make_shared<std::vector<char>>(static_cast<size_t>(bytes), 1);
  std::vector<char> in(static_cast<size_t>(bytes));
  std::vector<double> seconds;
  for (int i = 0; i <= repeats; ++i) {
    const uint64_t t = (*tag)++;
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = from->Send(to->address(), t, data->data(), data->size(), data); !s.ok()) {
      return s;
    }
    if (absl::Status s = to->RecvAll({{t, in.data(), in.size()}}, absl::Seconds(60)); !s.ok()) {
      return s;
    }
    if (i > 0) seconds.push_back(SecondsSince(t0));
  }
  return Median(seconds);
}

}  // namespace

absl::Status ProfileCommunication(const ModelConfig& model, const CommProfileOptions& options,
                                  scheduler::v1::Profile* profile) {
  constexpr int64_t kF = sizeof(float);
  const int64_t vision = kF * VitStageParameters(model.vit, 0, model.vit.layers, 1),
                projector = kF * ProjectorParameters(model),
                llm = kF * LlmStageParameters(model.llm, 0, model.llm.layers, 1),
                token = kF * model.llm.dim;
  profile->set_vision_gradient_bytes(vision);
  profile->set_projector_gradient_bytes(projector);
  profile->set_llm_gradient_bytes(llm);
  profile->set_embedding_bytes_per_image_token(token);
  profile->clear_comm();

  // All-reduces: each module's gradient, over each group size, at most
  // kMostBytes each (a large model's 4 GB gradient on 4 threads would not
  // fit a host; the fit carries the time to larger sizes).
  const std::vector<int64_t> sizes = {std::min(kMostBytes, vision + projector),
                                      std::min(kMostBytes, llm)};
  std::vector<std::vector<double>> ax;
  std::vector<double> ay;
  for (int ranks : options.allreduce_ranks) {
    if (ranks < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: an all-reduce over ", ranks, " ranks (want 2 or more)"));
    }
    absl::StatusOr<std::vector<double>> t = TimeAllreduces(ranks, sizes, options.repeats);
    if (!t.ok()) return t.status();
    for (size_t k = 0; k < sizes.size(); ++k) {
      scheduler::v1::CommPoint* pt = profile->add_comm();
      pt->set_kind("allreduce");
      pt->set_ranks(ranks);
      pt->set_bytes(sizes[k]);
      pt->set_seconds((*t)[k]);
      ax.push_back({2.0 * (ranks - 1), 2.0 * (ranks - 1) / ranks * static_cast<double>(sizes[k])});
      ay.push_back((*t)[k]);
    }
  }
  // Transfers between two UCX workers.
  std::vector<int64_t> transfers = options.transfer_bytes;
  if (transfers.empty()) {
    transfers = {64 * token, 256 * token, 1024 * token, 4096 * token};
    std::sort(transfers.begin(), transfers.end());
    transfers.erase(std::unique(transfers.begin(), transfers.end()), transfers.end());
  }
  absl::StatusOr<std::unique_ptr<UcxWorker>> from = UcxWorker::Create(), to = UcxWorker::Create();
  if (!from.ok()) return from.status();
  if (!to.ok()) return to.status();
  std::vector<std::vector<double>> tx;
  std::vector<double> ty;
  uint64_t tag = 1;
  for (int64_t bytes : transfers) {
    absl::StatusOr<double> t = TimeTransfer(from->get(), to->get(), bytes, options.repeats, &tag);
    if (!t.ok()) return t.status();
    scheduler::v1::CommPoint* pt = profile->add_comm();
    pt->set_kind("transfer");
    pt->set_ranks(2);
    pt->set_bytes(bytes);
    pt->set_seconds(*t);
    tx.push_back({1.0, static_cast<double>(bytes)});
    ty.push_back(*t);
  }
  const std::vector<double> a = FitNonNegative(ax, ay), t = FitNonNegative(tx, ty);
  profile->set_allreduce_latency_seconds(a[0]);
  profile->set_allreduce_seconds_per_byte(a[1]);
  profile->set_transfer_latency_seconds(t[0]);
  profile->set_transfer_seconds_per_byte(t[1]);
  for (scheduler::v1::CommPoint& pt : *profile->mutable_comm()) {
    const double b = static_cast<double>(pt.bytes());
    pt.set_fitted_seconds(pt.kind() == "allreduce"
                              ? a[0] * 2.0 * (pt.ranks() - 1) +
                                    a[1] * 2.0 * (pt.ranks() - 1) / pt.ranks() * b
                              : t[0] + t[1] * b);
  }
  return absl::OkStatus();
}

bool ApplyProfileCommunication(const scheduler::v1::Profile& profile, const Frozen& frozen,
                               scheduler::v1::Plan* plan) {
  if (profile.comm().empty()) return false;
  // A rank's all-reduce: its share of the module's gradient (the layers
  // split over tp x pp; the projector whole on every rank of the encoder's
  // last stage, the stage that reduces the most).
  auto allreduce = [&](double bytes, int dp) {
    if (dp <= 1 || bytes <= 0) return 0.0;
    return profile.allreduce_latency_seconds() * 2.0 * (dp - 1) +
           profile.allreduce_seconds_per_byte() * 2.0 * (dp - 1) / dp * bytes;
  };
  const scheduler::v1::ModulePlan& e = plan->encoder();
  const scheduler::v1::ModulePlan& l = plan->llm();
  const double encoder =
      (frozen.vision ? 0.0
                     : static_cast<double>(profile.vision_gradient_bytes()) /
                           (std::max(1, e.tp()) * std::max(1, e.pp()))) +
      (frozen.projector ? 0.0 : static_cast<double>(profile.projector_gradient_bytes()));
  const double llm = frozen.llm ? 0.0
                                : static_cast<double>(profile.llm_gradient_bytes()) /
                                      (std::max(1, l.tp()) * std::max(1, l.pp()));
  plan->mutable_encoder()->set_allreduce_seconds(allreduce(encoder, e.dp()));
  plan->mutable_llm()->set_allreduce_seconds(allreduce(llm, l.dp()));
  // A bin's embeddings go to every rank of its LLM replica's TP group.
  plan->mutable_costs()->set_transfer_per_image_token(
      profile.transfer_seconds_per_byte() *
      static_cast<double>(profile.embedding_bytes_per_image_token()) * std::max(1, l.tp()));
  return true;
}

}  // namespace loom::sched
