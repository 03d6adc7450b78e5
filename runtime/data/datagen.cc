#include "runtime/data/datagen.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "loom/data/v1/sample.pb.h"
#include "runtime/base/file.h"
#include "runtime/base/rng.h"
#include "runtime/data/image.h"

namespace loom::data {
namespace {

constexpr const char* kCountWords[] = {"one", "two", "three"};
constexpr const char* kColors[] = {"red", "green", "blue", "yellow", "white", "purple"};
constexpr uint8_t kRgb[][3] = {{230, 40, 40},  {40, 200, 60},   {50, 80, 230},
                               {230, 220, 40}, {240, 240, 240}, {160, 60, 200}};
constexpr const char* kShapes[] = {"square", "circle", "triangle"};
constexpr const char* kRegions[] = {"top left", "top right", "bottom left", "bottom right",
                                    "center"};
constexpr const char* kDirections[] = {"left to right", "right to left", "top to bottom",
                                       "bottom to top"};
constexpr const char* kFiller[] = {
    "the picture was drawn by a program.",
    "the background is a dark gradient.",
    "there is nothing else in the picture.",
    "the shapes have sharp edges.",
    "each shape is filled with one flat colour.",
    "the shapes are all the same size.",
    "the light is even across the whole scene.",
    "no text is written on the image.",
    "the colours are bright against the dark.",
    "we can count the shapes one by one.",
    "the scene is simple and clean.",
    "it looks like a page from a picture book.",
    "the shapes do not touch each other.",
    "a careful look tells us where they are.",
    "this kind of drawing is used to teach counting.",
    "the corners of the frame are empty.",
};

struct Scene {
  int count;  // 1..3
  int color, shape, region;
  uint8_t bg0[3], bg1[3];
  bool tint = false;  // the region shaded with the shapes' colour (output pictures)
};

Scene DrawScene(Rng& rng) {
  Scene s;
  s.count = static_cast<int>(rng.UniformInt(1, 3));
  s.color = static_cast<int>(rng.UniformInt(0, 5));
  s.shape = static_cast<int>(rng.UniformInt(0, 2));
  s.region = static_cast<int>(rng.UniformInt(0, 4));
  for (int c = 0; c < 3; ++c) {
    s.bg0[c] = static_cast<uint8_t>(rng.UniformInt(5, 50));
    s.bg1[c] = static_cast<uint8_t>(rng.UniformInt(5, 50));
  }
  return s;
}

std::string Describe(const Scene& s) {
  return absl::StrCat(kCountWords[s.count - 1], " ", kColors[s.color], " ", kShapes[s.shape],
                      s.count > 1 ? "s" : "", " in the ", kRegions[s.region]);
}

// Renders `s` at width x height; `shift` in [0, 1] moves the shapes along
// `direction` (video frames), -1 for a still. A shape's side is `size` of
// the shorter side.
Image Render(const Scene& s, int width, int height, double shift, int direction, double size) {
  Image img;
  img.width = width;
  img.height = height;
  img.rgb.resize(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    const float t = height > 1 ? static_cast<float>(y) / (height - 1) : 0.0f;
    uint8_t row[3];
    for (int c = 0; c < 3; ++c) row[c] = static_cast<uint8_t>(s.bg0[c] + t * (s.bg1[c] - s.bg0[c]));
    uint8_t* p = &img.rgb[static_cast<size_t>(y) * width * 3];
    for (int x = 0; x < width; ++x, p += 3) std::copy(row, row + 3, p);
  }
  // The region is a quarter (or the central quarter) of the image.
  double cx = s.region == 4 ? 0.5 : (s.region % 2 == 0 ? 0.25 : 0.75);
  double cy = s.region == 4 ? 0.5 : (s.region < 2 ? 0.25 : 0.75);
  if (s.tint) {
    const int x0 = static_cast<int>((cx - 0.25) * width),
              x1 = static_cast<int>((cx + 0.25) * width);
    const int y0 = static_cast<int>((cy - 0.25) * height),
              y1 = static_cast<int>((cy + 0.25) * height);
    for (int y = y0; y < y1; ++y) {
      for (int x = x0; x < x1; ++x) {
        for (int c = 0; c < 3; ++c) {
          img.rgb[(static_cast<size_t>(y) * width + x) * 3 + c] =
              static_cast<uint8_t>(kRgb[s.color][c] * 0.35);
        }
      }
    }
  }
  if (shift >= 0) {
    const double d = (shift - 0.5) * 0.4;
    switch (direction) {
      case 0:
        cx += d;
        break;
      case 1:
        cx -= d;
        break;
      case 2:
        cy += d;
        break;
      default:
        cy -= d;
        break;
    }
  }
  const int side = std::max(3, static_cast<int>(std::min(width, height) * size));
  for (int k = 0; k < s.count; ++k) {
    const double off = (k - (s.count - 1) / 2.0) * 1.3 * side;
    const int x0 = static_cast<int>(cx * width + off) - side / 2;
    const int y0 = static_cast<int>(cy * height) - side / 2;
    for (int dy = 0; dy < side; ++dy) {
      for (int dx = 0; dx < side; ++dx) {
        const int x = x0 + dx, y = y0 + dy;
        if (x < 0 || y < 0 || x >= width || y >= height) continue;
        const double u = (dx + 0.5) / side - 0.5, v = (dy + 0.5) / side - 0.5;
        bool inside = true;
        if (s.shape == 1) inside = u * u + v * v <= 0.25;
        if (s.shape == 2) inside = std::abs(u) <= (v + 0.5) / 2;  // apex at the top
        if (!inside) continue;
        std::copy(kRgb[s.color], kRgb[s.color] + 3,
                  &img.rgb[(static_cast<size_t>(y) * width + x) * 3]);
      }
    }
  }
  return img;
}

std::string Filler(Rng& rng, int words) {
  std::string out;
  int n = 0;
  while (n < words) {
    const char* f = kFiller[rng.UniformInt(0, std::size(kFiller) - 1)];
    absl::StrAppend(&out, out.empty() ? "" : " ", f);
    n += static_cast<int>(std::count(f, f + std::strlen(f), ' ')) + 1;
  }
  return out;
}

// One image: its pixels' size, drawn from a lognormal long side and an
// aspect ratio.
struct ImageSpec {
  int width, height;
  bool png;
};

ImageSpec SizeFor(Rng& rng, double median, double sigma, double lo, double hi, double max_ratio,
                  double png_fraction) {
  const double longer = rng.LogNormal(median, sigma, lo, hi);
  const double ratio = std::exp(rng.Uniform(-std::log(max_ratio), std::log(max_ratio)));
  ImageSpec spec;
  if (ratio >= 1) {
    spec.width = static_cast<int>(longer);
    spec.height = std::max(16, static_cast<int>(longer / ratio));
  } else {
    spec.height = static_cast<int>(longer);
    spec.width = std::max(16, static_cast<int>(longer * ratio));
  }
  spec.png = rng.Bernoulli(png_fraction);
  return spec;
}

struct Draft {
  std::string text;
  std::string kind;
  std::vector<std::pair<std::string, std::string>> messages;  // role, content (the chat preset)
  struct Picture {
    Scene scene;
    ImageSpec spec;
    double shift = -1;
    int direction = 0;
    double size = 0.12;  // a shape's side, of the shorter side
  };
  std::vector<Picture> pictures;
  std::vector<Picture> outputs;  // output images (the generation preset)
};

std::string Caption(Rng& rng, const Scene& s) {
  static constexpr const char* kTemplates[] = {"a picture of %s.", "this image shows %s.",
                                               "here we see %s.", "%s."};
  return absl::StrFormat(kTemplates[rng.UniformInt(0, 3)], Describe(s));
}

Draft DraftCaption(Rng& rng) {
  Draft d;
  d.kind = "single";
  Draft::Picture p{DrawScene(rng), SizeFor(rng, 512, 0.45, 96, 2048, 2.5, 0.15)};
  std::string caption = Caption(rng, p.scene);
  const int words = static_cast<int>(rng.LogNormal(14, 0.6, 4, 120));
  const int have = static_cast<int>(std::count(caption.begin(), caption.end(), ' ')) + 1;
  d.text = absl::StrCat("<image>\n", caption);
  if (words > have) absl::StrAppend(&d.text, " ", Filler(rng, words - have));
  d.pictures.push_back(p);
  return d;
}

Draft DraftInterleaved(Rng& rng) {
  Draft d;
  d.kind = "interleaved";
  const int images = static_cast<int>(rng.UniformInt(0, 8));
  d.text = Filler(rng, static_cast<int>(rng.LogNormal(30, 0.6, 5, 200)));
  for (int i = 0; i < images; ++i) {
    Draft::Picture p{DrawScene(rng), SizeFor(rng, 384, 0.35, 96, 1024, 2.0, 0.1)};
    absl::StrAppend(&d.text, "\n<image>\n", Caption(rng, p.scene), " ",
                    Filler(rng, static_cast<int>(rng.LogNormal(30, 0.6, 5, 200))));
    d.pictures.push_back(p);
  }
  return d;
}

Draft DraftOneVision(Rng& rng) {
  Draft d;
  const double kind = rng.Uniform();
  if (kind < 0.35) {
    d.kind = "single_highres";
    Draft::Picture p{DrawScene(rng), SizeFor(rng, 1280, 0.3, 512, 2048, 2.0, 0.1)};
    d.text = absl::StrCat("<image>\n", Caption(rng, p.scene), " question: what is in the ",
                          kRegions[p.scene.region], "? answer: ", kCountWords[p.scene.count - 1],
                          " ", kColors[p.scene.color], " ", kShapes[p.scene.shape],
                          p.scene.count > 1 ? "s." : ".");
    d.pictures.push_back(p);
  } else if (kind < 0.60) {
    d.kind = "multi_image";
    const int images = static_cast<int>(rng.UniformInt(2, 12));
    for (int i = 0; i < images; ++i) {
      Draft::Picture p{DrawScene(rng), SizeFor(rng, 448, 0.3, 128, 1024, 2.0, 0.1)};
      absl::StrAppend(&d.text, i == 0 ? "" : " ", "image ", i + 1, ": <image> ");
      d.pictures.push_back(p);
    }
    for (int i = 0; i < images; ++i) {
      absl::StrAppend(&d.text, " image ", i + 1, " shows ", Describe(d.pictures[i].scene), ".");
    }
  } else if (kind < 0.80) {
    d.kind = "video";
    const int frames = static_cast<int>(rng.UniformInt(8, 32));
    const Scene scene = DrawScene(rng);
    const int direction = static_cast<int>(rng.UniformInt(0, 3));
    for (int f = 0; f < frames; ++f) {
      d.pictures.push_back({scene, {384, 216, false}, f / (frames - 1.0), direction});
      absl::StrAppend(&d.text, "<image>");
    }
    absl::StrAppend(&d.text, "\na video of ", Describe(scene), " moving ", kDirections[direction],
                    ".");
  } else {
    d.kind = "text";
    d.text = Filler(rng, static_cast<int>(rng.LogNormal(80, 0.7, 10, 300)));
  }
  return d;
}

// LLaVA-665K-like: a conversation of 1-4 different questions about one
// image (answers the image decides), or 15% text-only turns of filler.
Draft DraftChat(Rng& rng) {
  Draft d;
  const bool text_only = rng.Bernoulli(0.15);
  d.kind = text_only ? "text" : "single";
  const int turns = static_cast<int>(rng.UniformInt(1, 4));
  Scene s{};
  if (!text_only) {
    Draft::Picture p{DrawScene(rng), SizeFor(rng, 512, 0.45, 96, 2048, 2.5, 0.15)};
    s = p.scene;
    d.pictures.push_back(p);
  }
  d.text =
      "A chat between a curious human and an artificial intelligence assistant. The assistant "
      "gives helpful, detailed, and polite answers to the human's questions.";
  int order[5] = {0, 1, 2, 3, 4};
  for (int i = 4; i > 0; --i) std::swap(order[i], order[rng.UniformInt(0, i)]);
  for (int t = 0; t < turns; ++t) {
    std::string q, a;
    if (text_only) {
      q = Filler(rng, static_cast<int>(rng.LogNormal(12, 0.5, 3, 60))) + "?";
      a = Filler(rng, static_cast<int>(rng.LogNormal(25, 0.6, 3, 150))) + ".";
    } else {
      switch (order[t]) {
        case 0:
          q = "what is in the image?";
          a = Caption(rng, s);
          break;
        case 1:
          q = "how many shapes are there?";
          a = absl::StrCat(kCountWords[s.count - 1], ".");
          break;
        case 2:
          q = "what color are they?";
          a = absl::StrCat(kColors[s.color], ".");
          break;
        case 3:
          q = "where are they?";
          a = absl::StrCat("in the ", kRegions[s.region], ".");
          break;
        default:
          q = "what shape are they?";
          a = absl::StrCat(kShapes[s.shape], s.count > 1 ? "s." : ".");
      }
      if (t == 0) q = "<image>\n" + q;
    }
    d.messages.push_back({"user", q});
    d.messages.push_back({"assistant", a});
    absl::StrAppend(&d.text, " USER: ", q, " ASSISTANT: ", a);
  }
  return d;
}

// Text → image mixed with understanding (MetaQuery- and BLIP3-o-like):
// 50% a caption, then the picture it describes as an output image; 15% an
// image and its caption, then the same shapes drawn in another region as an
// output image (generation that needs the input image); 35% a caption
// sample as `caption` draws it. Output images are small (long side
// lognormal, median 256, 64-1024, aspect ratio within 1.5, half PNG), on a
// plain background, their shapes larger (0.3 of the shorter side) and
// their region shaded with their colour, so a small generator's picture
// shows what the text says.
Draft DraftGeneration(Rng& rng) {
  const double kind = rng.Uniform();
  if (kind < 0.35) return DraftCaption(rng);
  Draft d;
  Draft::Picture out{DrawScene(rng), SizeFor(rng, 256, 0.4, 64, 1024, 1.5, 0.5)};
  // What the text does not say is not drawn at random: a plain dark
  // background; larger shapes, their region shaded with their colour.
  for (int c = 0; c < 3; ++c) out.scene.bg0[c] = out.scene.bg1[c] = 24;
  out.size = 0.3;
  if (kind < 0.85) {
    d.kind = "text_to_image";
    d.text = absl::StrCat(Caption(rng, out.scene), " <output_image>");
  } else {
    d.kind = "image_edit";
    Draft::Picture in{out.scene, SizeFor(rng, 384, 0.35, 96, 1024, 2.0, 0.1)};
    in.scene.region = static_cast<int>((out.scene.region + rng.UniformInt(1, 4)) % 5);
    d.text = absl::StrCat("<image>\n", Caption(rng, in.scene), " the same in the ",
                          kRegions[out.scene.region], ": <output_image>");
    d.pictures.push_back(in);
  }
  out.scene.tint = true;
  d.outputs.push_back(out);
  return d;
}

absl::Status CheckPreset(const std::string& preset) {
  const std::vector<std::string>& known = DatagenPresets();
  if (std::find(known.begin(), known.end(), preset) != known.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown preset \"", preset, "\"; known: ", absl::StrJoin(known, ", ")));
}

std::string SampleKey(const std::string& preset, int64_t index) {
  return absl::StrFormat("%s-%08d", preset, index);
}

absl::StatusOr<Draft> DraftSample(const std::string& preset, Rng& rng) {
  if (preset == "caption") return DraftCaption(rng);
  if (preset == "interleaved") return DraftInterleaved(rng);
  if (preset == "onevision") return DraftOneVision(rng);
  if (preset == "chat") return DraftChat(rng);
  if (preset == "generation") return DraftGeneration(rng);
  return CheckPreset(preset);
}

}  // namespace

const std::vector<std::string>& DatagenPresets() {
  static const auto* v =
      new std::vector<std::string>{"caption", "interleaved", "onevision", "chat", "generation"};
  return *v;
}

absl::StatusOr<GeneratedSample> GenerateSample(const std::string& preset, uint64_t seed,
                                               int64_t index) {
  Rng rng(MixSeed(seed, index, 0xda7a));
  absl::StatusOr<Draft> draft = DraftSample(preset, rng);
  if (!draft.ok()) return draft.status();
  GeneratedSample out;
  out.key = SampleKey(preset, index);
  out.text = draft->text;
  data::v1::SampleRecord record;
  if (draft->messages.empty()) {
    record.set_text(draft->text);
  } else {
    for (const auto& [role, content] : draft->messages) {
      data::v1::Message* m = record.add_messages();
      m->set_role(role);
      m->set_content(content);
    }
  }
  record.mutable_meta()->set_preset(preset);
  record.mutable_meta()->set_kind(draft->kind);
  std::vector<TarMember> images;
  for (const bool output : {false, true}) {
    const std::vector<Draft::Picture>& pictures = output ? draft->outputs : draft->pictures;
    for (size_t i = 0; i < pictures.size(); ++i) {
      const Draft::Picture& p = pictures[i];
      Image img = Render(p.scene, p.spec.width, p.spec.height, p.shift, p.direction, p.size);
      absl::StatusOr<std::string> bytes = p.spec.png ? EncodePng(img) : EncodeJpeg(img, 90);
      if (!bytes.ok()) return bytes.status();
      std::string ext = absl::StrCat(output ? "out" : "", i, p.spec.png ? ".png" : ".jpg");
      if (output) {
        record.add_output_images(ext);
      } else {
        record.add_images(ext);
      }
      images.push_back({absl::StrCat(out.key, ".", ext), std::move(*bytes)});
    }
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(record, &json, options); !s.ok()) {
    return absl::InternalError(absl::StrCat("sample json: ", s.ToString()));
  }
  out.members.push_back({out.key + ".json", std::move(json)});
  for (TarMember& m : images) out.members.push_back(std::move(m));
  return out;
}

absl::StatusOr<SampleOutline> OutlineSample(const std::string& preset, uint64_t seed,
                                            int64_t index) {
  Rng rng(MixSeed(seed, index, 0xda7a));
  absl::StatusOr<Draft> draft = DraftSample(preset, rng);
  if (!draft.ok()) return draft.status();
  SampleOutline out;
  out.key = SampleKey(preset, index);
  out.text = draft->text;
  for (const Draft::Picture& p : draft->pictures) {
    out.image_sizes.emplace_back(p.spec.width, p.spec.height);
  }
  for (const Draft::Picture& p : draft->outputs) {
    out.output_image_sizes.emplace_back(p.spec.width, p.spec.height);
  }
  return out;
}

std::vector<std::string> GenerateTexts(uint64_t seed, int count) {
  std::vector<std::string> out;
  // The first four presets: generation's words are theirs, and the built
  // tokenizer (and so every tokenized test) stays what it was.
  const std::vector<std::string> presets(DatagenPresets().begin(), DatagenPresets().begin() + 4);
  for (int i = 0; i < count; ++i) {
    Rng rng(MixSeed(seed, i, 0xda7a));
    absl::StatusOr<Draft> d = DraftSample(presets[i % presets.size()], rng);
    out.push_back(d->text);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> WriteDataset(const DatagenOptions& options) {
  if (options.samples <= 0 || options.samples_per_shard <= 0) {
    return absl::InvalidArgumentError("--samples and --samples_per_shard must be positive");
  }
  if (absl::Status s = CheckPreset(options.preset); !s.ok()) return s;
  if (absl::Status s = MakeDirectories(options.out_dir); !s.ok()) return s;
  const int64_t shards =
      (options.samples + options.samples_per_shard - 1) / options.samples_per_shard;
  std::vector<std::string> paths(shards);
  std::vector<absl::Status> errors(shards);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t shard; (shard = next.fetch_add(1)) < shards;) {
      std::vector<TarMember> members;
      const int64_t begin = shard * options.samples_per_shard;
      const int64_t end = std::min(options.samples, begin + options.samples_per_shard);
      for (int64_t i = begin; i < end && errors[shard].ok(); ++i) {
        absl::StatusOr<GeneratedSample> s = GenerateSample(options.preset, options.seed, i);
        if (!s.ok()) {
          errors[shard] = s.status();
          break;
        }
        for (TarMember& m : s->members) members.push_back(std::move(m));
      }
      paths[shard] = absl::StrFormat("%s/%s-%05d.tar", options.out_dir, options.preset, shard);
      if (errors[shard].ok()) errors[shard] = WriteTar(paths[shard], members);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, options.threads); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return paths;
}

}  // namespace loom::data
