#include "services/common/incarnation.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"
#include "runtime/comm/data_key.h"

namespace loom {

const std::string& ProcessIncarnation() {
  static const std::string* const incarnation = new std::string(NewIncarnation());
  return *incarnation;
}

std::string NewIncarnation() { return RandomBytes(kIncarnationBytes); }

std::string IncarnationInstance(absl::string_view incarnation) {
  unsigned char key[16] = {};
  std::memcpy(key, incarnation.data(), std::min(incarnation.size(), sizeof(key)));
  uint64_t k0 = 0, k1 = 0;
  for (int i = 7; i >= 0; --i) {
    k0 = (k0 << 8) | key[i];
    k1 = (k1 << 8) | key[8 + i];
  }
  static constexpr char kLabel[] = "loom process instance";
  return absl::StrFormat("%016x", SipHash24(k0, k1, kLabel, sizeof(kLabel) - 1));
}

}  // namespace loom
