// The golden dump's writer (dump_format.md): records of float32 and int32
// tensors, written at once. golden_dump and generator_dump share it.
#ifndef LOOM_TESTS_GOLDEN_DUMP_WRITER_H_
#define LOOM_TESTS_GOLDEN_DUMP_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/testing/tolerances.h"
#include "runtime/model/params.h"

namespace loom::golden {

class DumpWriter {
 public:
  void F32(const std::string& name, const std::vector<int64_t>& dims, const float* data) {
    Record(name, 0, dims, data, 4);
  }
  void I32(const std::string& name, const std::vector<int64_t>& dims, const int32_t* data) {
    Record(name, 2, dims, data, 4);
  }
  bool Write(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const uint32_t version = 1, n = count_;
    std::fwrite("LOOMGOLD", 1, 8, f);
    std::fwrite(&version, 4, 1, f);
    std::fwrite(&n, 4, 1, f);
    std::fwrite(body_.data(), 1, body_.size(), f);
    return std::fclose(f) == 0;
  }

 private:
  void Put(const void* p, size_t n) { body_.append(static_cast<const char*>(p), n); }
  void Record(const std::string& name, uint8_t dtype, const std::vector<int64_t>& dims,
              const void* data, size_t elem) {
    const uint32_t len = name.size(), ndim = dims.size();
    Put(&len, 4);
    Put(name.data(), len);
    Put(&dtype, 1);
    Put(&ndim, 4);
    int64_t n = 1;
    for (int64_t d : dims) {
      Put(&d, 8);
      n *= d;
    }
    Put(data, static_cast<size_t>(n) * elem);
    ++count_;
  }
  std::string body_;
  uint32_t count_ = 0;
};

inline void DumpParams(DumpWriter& w, const std::string& prefix, loom::ParamSet& ps, bool grads) {
  for (int i = 0; i < static_cast<int>(ps.specs().size()); ++i) {
    const loom::ParamSpec& s = ps.spec(i);
    w.F32(prefix + s.name, s.shape, grads ? ps.grad(i) : ps.param(i));
  }
}

inline void DumpTolerance(DumpWriter& w, const std::string& name,
                          const loom::testing::Tolerance& t) {
  const float v[2] = {static_cast<float>(t.atol), static_cast<float>(t.rtol)};
  w.F32("tolerance/" + name, {2}, v);
}

}  // namespace loom::golden

#endif  // LOOM_TESTS_GOLDEN_DUMP_WRITER_H_
