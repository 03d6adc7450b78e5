#include "runtime/comm/data_key.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

// The reference vectors of SipHash-2-4 (the paper's appendix and its
// reference implementation's table): key 00 01 .. 0f, message 00 01 .. n-1.
TEST(DataKeyTest, SipHashMatchesTheReferenceVectors) {
  unsigned char m[64];
  for (int i = 0; i < 64; ++i) m[i] = static_cast<unsigned char>(i);
  const uint64_t k0 = 0x0706050403020100ULL, k1 = 0x0f0e0d0c0b0a0908ULL;
  EXPECT_EQ(SipHash24(k0, k1, m, 0), 0x726fdb47dd0e0e31ULL);
  EXPECT_EQ(SipHash24(k0, k1, m, 8), 0x93f5f5799a932462ULL);
  EXPECT_EQ(SipHash24(k0, k1, m, 15), 0xa129ca6149be45e5ULL);
  EXPECT_EQ(SipHash24(k0, k1, m, 63), 0x958a324ceb064572ULL);
}

TEST(DataKeyTest, TagsDependOnTheKeyAndKeepTheTopBit) {
  std::string bytes;
  for (int i = 0; i < 16; ++i) bytes.push_back(static_cast<char>(i));
  absl::StatusOr<DataKey> key = DataKey::FromBytes(bytes);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->bytes(), bytes);
  // The tag of logical 0x0706050403020100 is the 8-byte vector's hash.
  EXPECT_EQ(key->Tag(0x0706050403020100ULL), 0x93f5f5799a932462ULL | (1ULL << 63));

  const DataKey a = DataKey::Random(), b = DataKey::Random();
  EXPECT_NE(a.bytes(), b.bytes());
  std::set<uint64_t> tags;
  for (uint64_t logical = 0; logical < 1000; ++logical) {
    EXPECT_NE(a.Tag(logical) >> 63, 0u);
    EXPECT_NE(a.Tag(logical), b.Tag(logical));
    EXPECT_EQ(a.Tag(logical), DataKey::FromBytes(a.bytes())->Tag(logical));
    tags.insert(a.Tag(logical));
  }
  EXPECT_EQ(tags.size(), 1000u);
}

TEST(DataKeyTest, AKeyOfTheWrongLengthIsRefused) {
  for (const std::string& bad : {std::string(), std::string(15, 'k'), std::string(17, 'k')}) {
    absl::StatusOr<DataKey> key = DataKey::FromBytes(bad);
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(key.status().message().find("want 16 bytes, got " + std::to_string(bad.size())),
              std::string::npos)
        << key.status();
  }
}

}  // namespace
}  // namespace loom
