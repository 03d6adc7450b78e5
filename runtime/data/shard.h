// WebDataset tar shards: files grouped by sample key.
//
// A member "dir/abc.0.png" belongs to sample key "dir/abc" with extension
// "0.png": the key runs to the first '.' of the base name, as WebDataset
// defines it. The files of one sample are consecutive in the tar.
//
// Shards are read with libarchive (tar only; no compression, so a sample can
// be read at its byte offset: an index of the shard gives every sample's
// offset and the loader reads samples in any order). Reading never trusts
// the archive: a truncated or corrupt tar ends the shard at the last good
// member, the sample cut off by it is reported broken, and members larger
// than ShardLimits are refused before their bytes are read.
#ifndef LOOM_RUNTIME_DATA_SHARD_H_
#define LOOM_RUNTIME_DATA_SHARD_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::data {

struct ShardLimits {
  int64_t max_member_bytes = 256LL << 20;
  int max_members_per_sample = 256;
};

// Splits a member name into key and extension. False if the base name has
// no '.', or the key or extension would be empty.
bool SplitMemberName(std::string_view name, std::string* key, std::string* extension);

// The files of one sample: extension -> bytes.
struct SampleFiles {
  std::string key;
  std::map<std::string, std::string> files;
};

// Where a sample starts in its shard.
struct SampleRef {
  std::string key;
  int64_t offset = 0;  // byte offset of its first member's header
  int members = 0;
};

// A sample the index could not accept, and why. `reason` is a skip reason
// of the pipeline: "truncated_tar" or "member_too_large".
struct BrokenSample {
  std::string key;
  std::string reason;
  std::string detail;
};

struct ShardIndex {
  std::string path;
  std::vector<SampleRef> samples;
  std::vector<BrokenSample> broken;
  std::string error;  // why reading stopped before the end, if it did
};

// Reads every member header of the tar at `path`. Only an unreadable file is
// an error; a damaged archive gives the samples before the damage.
absl::StatusOr<ShardIndex> IndexShard(const std::string& path, const ShardLimits& limits);

// Reads the sample at `ref` (from IndexShard of the same file).
absl::StatusOr<SampleFiles> ReadSample(const std::string& path, const SampleRef& ref,
                                       const ShardLimits& limits);

// Every sample of a tar held in memory, in order (for the fuzzer and tests).
// Damaged archives give the samples before the damage plus `broken`.
struct MemoryShard {
  std::vector<SampleFiles> samples;
  std::vector<BrokenSample> broken;
  std::string error;
};
MemoryShard ReadShardFromMemory(std::string_view tar, const ShardLimits& limits);

// Writes samples as a tar (ustar) to `path` atomically, members in the order
// given, with fixed owner, mode and mtime so the same samples give the same
// bytes. Used by loom-datagen and tests.
struct TarMember {
  std::string name;
  std::string bytes;
};
absl::Status WriteTar(const std::string& path, const std::vector<TarMember>& members);
// The same, into memory.
absl::StatusOr<std::string> TarToMemory(const std::vector<TarMember>& members);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_SHARD_H_
