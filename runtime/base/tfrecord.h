// TFRecord files (TensorFlow's record format, which TensorBoard's event
// files use): each record is
//   uint64 length, uint32 masked CRC-32C of those 8 bytes,
//   `length` bytes, uint32 masked CRC-32C of them,
// little endian, where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
#ifndef LOOM_RUNTIME_BASE_TFRECORD_H_
#define LOOM_RUNTIME_BASE_TFRECORD_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);

// Appends records to a file, each flushed to the OS as written.
class TfRecordWriter {
 public:
  // Creates `path`; ALREADY_EXISTS if it exists (nothing is truncated).
  static absl::StatusOr<TfRecordWriter> Create(const std::string& path);
  TfRecordWriter(TfRecordWriter&& o) noexcept : file_(o.file_), path_(std::move(o.path_)) {
    o.file_ = nullptr;
  }
  TfRecordWriter& operator=(TfRecordWriter&& o) noexcept {
    if (this != &o) {
      if (file_ != nullptr) std::fclose(file_);
      file_ = o.file_;
      path_ = std::move(o.path_);
      o.file_ = nullptr;
    }
    return *this;
  }
  ~TfRecordWriter();
  absl::Status Append(absl::string_view record);
  const std::string& path() const { return path_; }

 private:
  TfRecordWriter(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {}
  std::FILE* file_;
  std::string path_;
};

// Every record of `path`, each CRC checked. DATA_LOSS naming the record and
// its offset for a bad CRC or a record cut short.
absl::StatusOr<std::vector<std::string>> ReadTfRecords(const std::string& path);

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_TFRECORD_H_
