#include "runtime/scheduling/gpu_kinds.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::sched {
namespace {

TEST(GpuKindsTest, KindsAreReadWithTheirDefaults) {
  absl::StatusOr<std::vector<GpuKind>> kinds = ParseGpuKinds(R"({"kinds": [
    {"name": "H100", "count": 1024, "tflops": 989, "memory_gib": 80, "price_per_hour": 3,
     "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    {"name": "L40S", "count": 64, "tflops": 362, "memory_gib": 48, "price_per_hour": 1.5,
     "gpus_per_node": 4, "intra_node_gb_per_s": 32, "inter_node_gbps": 200}]})");
  ASSERT_TRUE(kinds.ok()) << kinds.status();
  ASSERT_EQ(kinds->size(), 2u);
  const GpuKind& h = (*kinds)[0];
  EXPECT_EQ(h.name, "H100");
  EXPECT_EQ(h.count, 1024);
  EXPECT_EQ(h.gpu.gpus, 1024);
  EXPECT_DOUBLE_EQ(h.gpu.peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(h.gpu.memory_bytes, 80.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(h.price_per_hour, 3);
  const ClusterSpec defaults;
  EXPECT_EQ(h.gpu.gpus_per_node, defaults.gpus_per_node);
  EXPECT_DOUBLE_EQ(h.gpu.intra_node_bytes_per_second, defaults.intra_node_bytes_per_second);
  EXPECT_DOUBLE_EQ(h.gpu.inter_node_bytes_per_second, defaults.inter_node_bytes_per_second);
  EXPECT_EQ(h.node_selector.at("nvidia.com/gpu.product"), "NVIDIA-H100-80GB-HBM3");
  const GpuKind& l = (*kinds)[1];
  EXPECT_EQ(l.gpu.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(l.gpu.intra_node_bytes_per_second, 32e9);
  EXPECT_DOUBLE_EQ(l.gpu.inter_node_bytes_per_second, 25e9);  // 200 Gb/s
  EXPECT_TRUE(l.node_selector.empty());
}

TEST(GpuKindsTest, BadFilesAreNamed) {
  const std::string ok = R"("count": 8, "tflops": 989, "memory_gib": 80, "price_per_hour": 3)";
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {"{", "not JSON"},
           {"{\"kinds\": []}", "one kind at least"},
           {"{\"kinds\": [{\"name\": \"A\", " + ok + "}], \"extra\": 1}",
            "unknown field \"extra\""},
           {"{\"kinds\": [{" + ok + "}]}", "GPU kind 0: no \"name\""},
           {"{\"kinds\": [{\"name\": \"A\", " + ok + ", \"colour\": 1}]}",
            "GPU kind \"A\": unknown field \"colour\""},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": 8}]}", "GPU kind \"A\": no \"tflops\""},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": \"8\", \"tflops\": 1, \"memory_gib\": 1, "
            "\"price_per_hour\": 1}]}",
            "\"count\" is not a number"},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": 0, \"tflops\": 1, \"memory_gib\": 1, "
            "\"price_per_hour\": 1}]}",
            "whole numbers from 1 to 2^30"},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": 2.5, \"tflops\": 1, \"memory_gib\": 1, "
            "\"price_per_hour\": 1}]}",
            "whole numbers from 1 to 2^30"},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": 1e10, \"tflops\": 1, \"memory_gib\": 1, "
            "\"price_per_hour\": 1}]}",
            "whole numbers from 1 to 2^30"},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": 8, \"tflops\": 1, \"memory_gib\": 1, "
            "\"price_per_hour\": -1}]}",
            "price_per_hour >= 0"},
           {"{\"kinds\": [{\"name\": \"A\", \"count\": 8, \"tflops\": 0, \"memory_gib\": 1, "
            "\"price_per_hour\": 1}]}",
            "must be > 0"},
           {"{\"kinds\": [{\"name\": \"A\", " + ok + "}, {\"name\": \"A\", " + ok + "}]}",
            "GPU kind \"A\": named twice"},
           {"{\"kinds\": [{\"name\": \"A\", " + ok + ", \"node_selector\": {\"x\": 1}}]}",
            "node_selector \"x\" is not a string"},
       }) {
    absl::StatusOr<std::vector<GpuKind>> kinds = ParseGpuKinds(c.text);
    ASSERT_FALSE(kinds.ok()) << c.text;
    EXPECT_EQ(kinds.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(kinds.status().message().find(c.want), std::string::npos)
        << c.text << ": " << kinds.status();
  }
  absl::StatusOr<std::vector<GpuKind>> missing = ReadGpuKinds("/nonexistent/kinds.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
}

}  // namespace
}  // namespace loom::sched
