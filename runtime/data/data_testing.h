// Test helpers: samples and shards built in memory.
#ifndef LOOM_RUNTIME_DATA_DATA_TESTING_H_
#define LOOM_RUNTIME_DATA_DATA_TESTING_H_

#include <string>
#include <vector>

#include "runtime/data/image.h"
#include "runtime/data/shard.h"
#include "runtime/data/tokenizer.h"

namespace loom::data::testing {

// A solid image with a bright square in its top-left quarter.
Image TestImage(int width, int height);
std::string TestPng(int width, int height);
std::string TestJpeg(int width, int height);

// KEY.json with `text` and `images` (extensions), as loom-datagen writes it.
std::string SampleJson(const std::string& text, const std::vector<std::string>& images);

// Members of one sample: KEY.json then KEY.<ext> for each image given.
std::vector<TarMember> SampleMembers(
    const std::string& key, const std::string& text,
    const std::vector<std::pair<std::string, std::string>>& images);

// A PNG whose IHDR claims width x height (valid CRC), with no pixel data
// worth the name: decoding must refuse it before allocating.
std::string PngClaiming(uint32_t width, uint32_t height);
// A JPEG whose SOF0 claims width x height.
std::string JpegClaiming(uint16_t width, uint16_t height);

// The tokenizer built by //runtime/data:tokenizer_model (a data dependency).
const Tokenizer& TestTokenizer();

}  // namespace loom::data::testing

#endif  // LOOM_RUNTIME_DATA_DATA_TESTING_H_
