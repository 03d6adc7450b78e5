#include "runtime/comm/data_key.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom {

namespace {

inline uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline uint64_t Load64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void Store64(uint64_t v, unsigned char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

struct SipState {
  uint64_t v0, v1, v2, v3;
  void Round() {
    v0 += v1;
    v1 = Rotl(v1, 13);
    v1 ^= v0;
    v0 = Rotl(v0, 32);
    v2 += v3;
    v3 = Rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = Rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = Rotl(v1, 17);
    v1 ^= v2;
    v2 = Rotl(v2, 32);
  }
  void Absorb(uint64_t m) {
    v3 ^= m;
    Round();
    Round();
    v0 ^= m;
  }
};

}  // namespace

uint64_t SipHash24(uint64_t k0, uint64_t k1, const void* data, size_t n) {
  SipState s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
             k1 ^ 0x7465646279746573ULL};
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) s.Absorb(Load64(p + i));
  unsigned char last[8] = {};
  std::memcpy(last, p + i, n - i);
  last[7] = static_cast<unsigned char>(n);
  s.Absorb(Load64(last));
  s.v2 ^= 0xff;
  for (int r = 0; r < 4; ++r) s.Round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      std::fprintf(stderr, "getrandom: %s\n", std::strerror(errno));
      std::abort();
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

DataKey DataKey::Random() { return *FromBytes(RandomBytes(kBytes)); }

absl::StatusOr<DataKey> DataKey::FromBytes(absl::string_view bytes) {
  if (bytes.size() != kBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data key: want ", kBytes, " bytes, got ", bytes.size()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  DataKey key;
  key.k0_ = Load64(p);
  key.k1_ = Load64(p + 8);
  return key;
}

std::string DataKey::bytes() const {
  unsigned char out[kBytes];
  Store64(k0_, out);
  Store64(k1_, out + 8);
  return std::string(reinterpret_cast<const char*>(out), kBytes);
}

uint64_t DataKey::Tag(uint64_t logical) const {
  unsigned char m[8];
  Store64(logical, m);
  return SipHash24(k0_, k1_, m, sizeof(m)) | (uint64_t{1} << 63);
}

}  // namespace loom
