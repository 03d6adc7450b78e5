// libFuzzer target: the WebDataset tar reader on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::data::ShardLimits limits;
  limits.max_member_bytes = 1 << 20;
  limits.max_members_per_sample = 64;
  loom::data::MemoryShard shard = loom::data::ReadShardFromMemory(
      std::string_view(reinterpret_cast<const char*>(data), size), limits);
  size_t total = 0;
  for (const auto& s : shard.samples) {
    for (const auto& [ext, bytes] : s.files) total += ext.size() + bytes.size();
  }
  return total > size + (1 << 30) ? 1 : 0;  // keep the reads observable
}
