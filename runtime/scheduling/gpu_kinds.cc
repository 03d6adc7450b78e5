#include "runtime/scheduling/gpu_kinds.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"

namespace loom::sched {
namespace {

using nlohmann::json;

// The number at `key` of kind `what` (`fallback` when absent and not
// required).
absl::StatusOr<double> Number(const json& kind, const std::string& what, const char* key,
                              bool required, double fallback) {
  auto it = kind.find(key);
  if (it == kind.end()) {
    if (!required) return fallback;
    return absl::InvalidArgumentError(absl::StrCat(what, ": no \"", key, "\""));
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" is not a number"));
  }
  return it->get<double>();
}

}  // namespace

absl::StatusOr<std::vector<GpuKind>> ParseGpuKinds(const std::string& json_text) {
  const json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("GPU kinds: not JSON");
  if (!doc.is_object() || !doc.contains("kinds") || !doc["kinds"].is_array() ||
      doc["kinds"].empty()) {
    return absl::InvalidArgumentError(
        "GPU kinds: want {\"kinds\": [{\"name\": ..., \"count\": ...}, ...]} with one kind at "
        "least");
  }
  for (const auto& [key, value] : doc.items()) {
    if (key != "kinds") {
      return absl::InvalidArgumentError(absl::StrCat("GPU kinds: unknown field \"", key, "\""));
    }
  }
  static const std::set<std::string> kFields = {"name",
                                                "count",
                                                "tflops",
                                                "memory_gib",
                                                "price_per_hour",
                                                "gpus_per_node",
                                                "intra_node_gb_per_s",
                                                "inter_node_gbps",
                                                "node_selector"};
  std::vector<GpuKind> kinds;
  std::set<std::string> names;
  for (size_t i = 0; i < doc["kinds"].size(); ++i) {
    const json& k = doc["kinds"][i];
    std::string what = absl::StrCat("GPU kind ", i);
    if (!k.is_object()) return absl::InvalidArgumentError(what + ": not an object");
    if (!k.contains("name") || !k["name"].is_string() || k["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(what + ": no \"name\" (a non-empty string)");
    }
    GpuKind kind;
    kind.name = k["name"].get<std::string>();
    what = absl::StrCat("GPU kind \"", kind.name, "\"");
    if (!names.insert(kind.name).second) {
      return absl::InvalidArgumentError(what + ": named twice");
    }
    for (const auto& [key, value] : k.items()) {
      if (kFields.count(key) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": unknown field \"", key, "\""));
      }
    }
    const ClusterSpec defaults;
    absl::StatusOr<double> count = Number(k, what, "count", true, 0);
    absl::StatusOr<double> tflops = Number(k, what, "tflops", true, 0);
    absl::StatusOr<double> memory = Number(k, what, "memory_gib", true, 0);
    absl::StatusOr<double> price = Number(k, what, "price_per_hour", true, 0);
    absl::StatusOr<double> per_node =
        Number(k, what, "gpus_per_node", false, defaults.gpus_per_node);
    absl::StatusOr<double> intra =
        Number(k, what, "intra_node_gb_per_s", false, defaults.intra_node_bytes_per_second / 1e9);
    absl::StatusOr<double> inter =
        Number(k, what, "inter_node_gbps", false, defaults.inter_node_bytes_per_second * 8 / 1e9);
    for (const absl::StatusOr<double>* x :
         {&count, &tflops, &memory, &price, &per_node, &intra, &inter}) {
      if (!x->ok()) return x->status();
    }
    const auto whole = [](double x) { return x >= 1 && x <= 1 << 30 && x == std::floor(x); };
    if (!whole(*count) || !whole(*per_node)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": count ", *count,
                                                     " and gpus_per_node ", *per_node,
                                                     " must be whole numbers from 1 to 2^30"));
    }
    if (!(*tflops > 0) || !(*memory > 0) || !(*intra > 0) || !(*inter > 0) || !(*price >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": tflops, memory_gib, intra_node_gb_per_s and inter_node_gbps must be > 0 and "
          "price_per_hour >= 0"));
    }
    kind.count = static_cast<int>(*count);
    kind.price_per_hour = *price;
    kind.gpu.gpus = kind.count;
    kind.gpu.gpus_per_node = static_cast<int>(*per_node);
    kind.gpu.peak_flops = *tflops * 1e12;
    kind.gpu.memory_bytes = *memory * (1ull << 30);
    kind.gpu.intra_node_bytes_per_second = *intra * 1e9;
    kind.gpu.inter_node_bytes_per_second = *inter * 1e9 / 8;
    if (auto it = k.find("node_selector"); it != k.end()) {
      if (!it->is_object()) {
        return absl::InvalidArgumentError(what + ": \"node_selector\" is not an object");
      }
      for (const auto& [label, value] : it->items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": node_selector \"", label, "\" is not a string"));
        }
        kind.node_selector[label] = value.get<std::string>();
      }
    }
    kinds.push_back(std::move(kind));
  }
  return kinds;
}

absl::StatusOr<std::vector<GpuKind>> ReadGpuKinds(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<GpuKind>> kinds = ParseGpuKinds(*text);
  if (!kinds.ok()) {
    return absl::Status(kinds.status().code(), absl::StrCat(path, ": ", kinds.status().message()));
  }
  return kinds;
}

}  // namespace loom::sched
