#include "runtime/base/tfrecord.h"

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"

namespace loom {
namespace {

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

void PutLe(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

absl::StatusOr<TfRecordWriter> TfRecordWriter::Create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wbx");  // x: O_EXCL
  if (f == nullptr && errno == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat(path, ": exists"));
  }
  if (f == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  return TfRecordWriter(f, path);
}

TfRecordWriter::~TfRecordWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status TfRecordWriter::Append(absl::string_view record) {
  std::string head;
  PutLe(record.size(), 8, &head);
  PutLe(MaskedCrc32c(head), 4, &head);
  std::string tail;
  PutLe(MaskedCrc32c(record), 4, &tail);
  if (std::fwrite(head.data(), 1, head.size(), file_) != head.size() ||
      std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fwrite(tail.data(), 1, tail.size(), file_) != tail.size() || std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat(path_, ": write failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ReadTfRecords(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes->size()) {
    auto bad = [&](const std::string& what) {
      return absl::DataLossError(
          absl::StrCat(path, ": record ", records.size(), " at byte ", at, ": ", what));
    };
    if (bytes->size() - at < 12) return bad("cut short in its header");
    const char* p = bytes->data() + at;
    if (GetLe(p + 8, 4) != MaskedCrc32c(absl::string_view(p, 8))) return bad("length CRC");
    const uint64_t n = GetLe(p, 8);
    if (bytes->size() - at - 12 < n + 4) return bad(absl::StrCat("cut short (", n, " bytes)"));
    const absl::string_view data(p + 12, n);
    if (GetLe(p + 12 + n, 4) != MaskedCrc32c(data)) return bad("data CRC");
    records.emplace_back(data);
    at += 12 + n + 4;
  }
  return records;
}

}  // namespace loom
