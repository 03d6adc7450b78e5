#include "runtime/base/tfrecord.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"

namespace loom {
namespace {

// The published check values: CRC-32C of "123456789" (the catalogue's
// check), and RFC 3720 (iSCSI) B.4's 32 zero bytes, 32 0xFF bytes and 0..31.
TEST(TfRecordTest, Crc32cMatchesThePublishedValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  const uint32_t c = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TfRecordTest, RecordsReadBackAndDamageIsNamed) {
  const std::string path = testing::TempPath("records.tfrecord");
  const std::vector<std::string> want = {"", "one", std::string(1000, 'x'), std::string("\0\1", 2)};
  {
    std::remove(path.c_str());
    absl::StatusOr<TfRecordWriter> w = TfRecordWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const std::string& r : want) ASSERT_TRUE(w->Append(r).ok());
  }
  EXPECT_EQ(TfRecordWriter::Create(path).status().code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::vector<std::string>> got = ReadTfRecords(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  // The format's bytes: the 3-byte record "one" is 8 + 4 + 3 + 4 bytes.
  absl::StatusOr<std::string> bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 4 * 16 + 0 + 3 + 1000 + 2);
  EXPECT_EQ(bytes->substr(16, 8), std::string("\3\0\0\0\0\0\0\0", 8));
  // One flipped byte in a record's data, then one in a length.
  std::string damaged = *bytes;
  damaged[16 + 12 + 1] ^= 1;  // "one" -> "oie"
  ASSERT_TRUE(WriteFileAtomically(path, damaged).ok());
  absl::Status s = ReadTfRecords(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("record 1 at byte 16: data CRC"), std::string::npos) << s;
  damaged = *bytes;
  damaged[16] = 4;
  ASSERT_TRUE(WriteFileAtomically(path, damaged).ok());
  s = ReadTfRecords(path).status();
  EXPECT_NE(s.message().find("record 1 at byte 16: length CRC"), std::string::npos) << s;
  ASSERT_TRUE(WriteFileAtomically(path, bytes->substr(0, bytes->size() - 3)).ok());
  s = ReadTfRecords(path).status();
  EXPECT_NE(s.message().find("record 3 at byte"), std::string::npos) << s;
  EXPECT_NE(s.message().find("cut short"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom
