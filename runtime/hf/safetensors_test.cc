#include "runtime/hf/safetensors.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"

namespace loom::hf {
namespace {

// A file of a hand-written header and `data` bytes (header length as given,
// or the header's own).
std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                     uint64_t header_length = 0) {
  const std::string path = testing::TempPath(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header_length ? header_length : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\x01');
  return path;
}

// The error of opening `path`, which must fail.
std::string OpenError(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m = SafetensorsModel::Open(path);
  EXPECT_FALSE(m.ok()) << path;
  return m.ok() ? "" : std::string(m.status().message());
}

TEST(SafetensorsTest, WritesAndReadsF32Bf16F16) {
  const std::vector<float> a = {1.5f, -2.25f, 3.0f, 1e-3f, 0.0f, -0.0f};
  std::vector<uint16_t> b, h;
  for (float x : a) b.push_back(F32ToBf16(x));
  for (float x : a) h.push_back(F32ToF16(x));
  const std::string path = testing::TempPath("one.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"w.f32", DType::kF32, {2, 3}, a.data(), a.size() * 4},
                                {"w.bf16", DType::kBF16, {6}, b.data(), b.size() * 2},
                                {"w.f16", DType::kF16, {3, 2}, h.data(), h.size() * 2},
                                {"empty", DType::kF32, {0, 4}, nullptr, 0}},
                               {{"source", "test"}})
                  .ok());
  absl::StatusOr<std::string> bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>((*bytes)[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data starts 8-byte aligned";
  EXPECT_EQ(bytes->size(), 8 + n + 6 * 4 + 6 * 2 + 6 * 2);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("source"), "test");
  auto m = SafetensorsModel::Open(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->names(), (std::vector<std::string>{"empty", "w.bf16", "w.f16", "w.f32"}));
  EXPECT_EQ((*m)->Find("w.f16")->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ((*m)->Find("w.bf16")->dtype, DType::kBF16);
  for (const char* name : {"w.f32", "w.bf16", "w.f16"}) {
    absl::StatusOr<std::vector<float>> x = (*m)->ReadF32(name);
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_EQ(x->size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      // These values are exact in all three dtypes except 1e-3.
      const double tol = a[i] == 1e-3f ? (name[2] == 'b' ? 4e-6 : 1e-6) : 0;
      EXPECT_NEAR((*x)[i], a[i], tol) << name << "[" << i << "]";
    }
  }
  std::vector<uint16_t> raw(6);
  ASSERT_TRUE((*m)->ReadBytes("w.bf16", raw.data()).ok());
  EXPECT_EQ(raw, b);  // stored bytes come back as written
  EXPECT_EQ((*m)->ReadF32("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, ShardsWithAnIndexAsSavePretrained) {
  std::vector<std::vector<float>> data;
  std::vector<TensorView> views;
  for (int i = 0; i < 5; ++i) data.push_back(std::vector<float>(100, static_cast<float>(i)));
  for (int i = 0; i < 5; ++i) {
    views.push_back(
        {absl::StrCat("layer.", i, ".weight"), DType::kF32, {10, 10}, data[i].data(), 400});
  }
  const std::string dir = testing::TempPath("sharded");
  ASSERT_TRUE(WriteSafetensorsModel(dir, views, 900).ok());  // two tensors per shard
  for (const char* f : {"model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors",
                        "model.safetensors.index.json"}) {
    EXPECT_TRUE(ReadFile(absl::StrCat(dir, "/", f)).ok()) << f;
  }
  absl::StatusOr<std::string> index = ReadFile(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok());
  EXPECT_NE(index->find("\"total_size\": 2000"), std::string::npos) << *index;
  EXPECT_NE(index->find("\"layer.4.weight\": \"model-00003-of-00003.safetensors\""),
            std::string::npos)
      << *index;
  auto m = SafetensorsModel::Open(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->names().size(), 5u);
  for (int i = 0; i < 5; ++i) {
    auto x = (*m)->ReadF32(absl::StrCat("layer.", i, ".weight"));
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(*x, data[i]);
  }
  // Everything in one shard: model.safetensors alone, no index.
  const std::string single = testing::TempPath("single");
  ASSERT_TRUE(WriteSafetensorsModel(single, views, 1 << 20).ok());
  EXPECT_TRUE(ReadFile(single + "/model.safetensors").ok());
  EXPECT_FALSE(ReadFile(single + "/model.safetensors.index.json").ok());
  auto one = SafetensorsModel::Open(single);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->names().size(), 5u);
}

// Every malformed file is an error naming the file and the tensor.
TEST(SafetensorsTest, BadFilesAreClearErrors) {
  const std::string t = R"("dtype":"F32","shape":[2])";
  struct Case {
    const char* name;
    std::string header;
    size_t data;
    std::string error;
  } cases[] = {
      {"gap",
       absl::StrCat(R"({"a":{)", t, R"(,"data_offsets":[0,8]},"b":{)", t,
                    R"(,"data_offsets":[12,20]}})"),
       20, "tensor 'b' begins at 12 but 'a' ends at 8: a gap of 4 bytes"},
      {"overlap",
       absl::StrCat(R"({"a":{)", t, R"(,"data_offsets":[0,8]},"b":{)", t,
                    R"(,"data_offsets":[4,12]}})"),
       12, "tensor 'b' at [4, 12) overlaps 'a' at [0, 8)"},
      {"size", R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12,
       "tensor 'a': 12 bytes at data_offsets [0, 12], but shape [2,2] of F32 needs 16"},
      {"dtype", R"({"a":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", 8,
       "tensor 'a': unknown dtype \"F17\""},
      {"truncated", absl::StrCat(R"({"a":{)", t, R"(,"data_offsets":[0,8]}})"), 5,
       "truncated: tensor 'a' ends at byte 8 of the data, which has 5"},
      {"trailing", absl::StrCat(R"({"a":{)", t, R"(,"data_offsets":[0,8]}})"), 11,
       "3 bytes after the last tensor ('a') belong to no tensor"},
      {"offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", 8,
       "tensor 'a': \"data_offsets\" is not [begin, end]"},
      {"json", R"({"a":{"dtype":"F32",)", 0, "the header is not a JSON object"},
      {"shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "tensor 'a': shape [-2] has an entry that is not a non-negative integer"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteRaw(absl::StrCat(c.name, ".safetensors"), c.header, c.data);
    const std::string error = OpenError(path);
    EXPECT_NE(error.find(path), std::string::npos) << c.name << ": " << error;
    EXPECT_NE(error.find(c.error), std::string::npos) << c.name << ": " << error;
  }
  // A header length over 100 MB, and one longer than the file.
  EXPECT_NE(OpenError(WriteRaw("huge.safetensors", "{}", 0, 200'000'000))
                .find("header of 200000000 bytes is over the 100 MB limit"),
            std::string::npos);
  EXPECT_NE(OpenError(WriteRaw("short.safetensors", "{}", 0, 64))
                .find("truncated: the header needs 64 bytes, the file has 2"),
            std::string::npos);
  const std::string tiny = testing::TempPath("tiny.safetensors");
  ASSERT_TRUE(WriteFileAtomically(tiny, "abc").ok());
  EXPECT_NE(OpenError(tiny).find("truncated: 3 bytes"), std::string::npos);
  EXPECT_EQ(SafetensorsModel::Open(testing::TempPath("absent.safetensors")).status().code(),
            absl::StatusCode::kNotFound);

  // An index naming a shard that is missing, or one without the tensor.
  const std::string dir = testing::TempPath("bad_index");
  const std::vector<float> x = {1, 2};
  ASSERT_TRUE(WriteSafetensorsModel(dir, {{"a", DType::kF32, {2}, x.data(), 8}}, 100).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json",
                                  R"({"weight_map":{"a":"model.safetensors",)"
                                  R"("b":"model-00002-of-00002.safetensors"}})")
                  .ok());
  auto missing = SafetensorsModel::Open(dir);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(
                "shard model-00002-of-00002.safetensors (of tensor 'b') is missing"),
            absl::string_view::npos)
      << missing.status();
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json",
                                  R"({"weight_map":{"a":"model.safetensors",)"
                                  R"("c":"model.safetensors"}})")
                  .ok());
  EXPECT_NE(OpenError(dir).find("weight_map puts tensor 'c' in model.safetensors, which does not "
                                "hold it"),
            std::string::npos);
  const std::string empty = testing::TempPath("empty_dir");
  ASSERT_TRUE(MakeDirectories(empty).ok());
  EXPECT_EQ(SafetensorsModel::Open(empty).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, OtherDtypesOpenButAreNotReadAsFloats) {
  const std::vector<int64_t> ids = {0, 1, 2};
  const std::string path = testing::TempPath("ids.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"position_ids", DType::kI64, {1, 3}, ids.data(), 24}}).ok());
  auto m = SafetensorsModel::Open(path);
  ASSERT_TRUE(m.ok()) << m.status();
  auto x = (*m)->ReadF32("position_ids");
  EXPECT_EQ(x.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(x.status().message().find("'position_ids' is I64"), absl::string_view::npos);
  // A view whose bytes do not match its shape is refused before writing.
  EXPECT_EQ(WriteSafetensors(path, {{"w", DType::kF32, {3}, ids.data(), 8}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SafetensorsModel::Open(path).ok());  // the old file is intact
}

// Every finite half and bfloat16 survives a trip through float; narrowing
// rounds to nearest even.
TEST(SafetensorsTest, HalfConversionsRoundTripAndRoundToEven) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    const float f = F16ToF32(h), g = Bf16ToF32(h);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << v;
    } else {
      ASSERT_EQ(F32ToF16(f), h) << v;
    }
    if (std::isnan(g)) {
      ASSERT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(g)))) << v;
    } else {
      ASSERT_EQ(F32ToBf16(g), h) << v;
    }
  }
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));             // smallest subnormal
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to even (down)
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);                              // overflow: infinity
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: to even (down)
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

}  // namespace
}  // namespace loom::hf
