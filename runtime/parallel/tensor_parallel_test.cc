#include "runtime/parallel/tensor_parallel.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation/activation.h"
#include "kernels/matmul/matmul.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"
#include "runtime/comm/comm_testing.h"

namespace loom::parallel {
namespace {

TEST(TensorParallelTest, SlicesRowsAndColumns) {
  const std::vector<float> w = {0, 1, 2, 3, 4, 5, 6, 7};  // (4, 2) or (2, 4)
  EXPECT_EQ(SliceRows(w.data(), 4, 2, 2, 1), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(SliceCols(w.data(), 2, 4, 2, 1), (std::vector<float>{2, 3, 6, 7}));
  EXPECT_EQ(SliceCols(w.data(), 2, 4, 4, 0), (std::vector<float>{0, 4}));
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  const loom::testing::Tolerance t = loom::testing::kTensorParallelF32;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], loom::testing::Allowed(t, want[i])) << what << " [" << i << "]";
  }
}

// An MLP block y = fc2(gelu(fc1(x))) with fc1 column-parallel and fc2
// row-parallel over tp = 1, 2, 4 thread ranks equals the single-device block:
// the output on every rank, each rank's weight-gradient slice, the (whole)
// fc2 bias gradient, and the input gradient after f's all-reduce.
TEST(TensorParallelTest, MlpBlockEqualsTheSingleDeviceBlock) {
  const int M = 5, D = 8, H = 16;
  const std::vector<float> x = loom::testing::RandomVector(M * D, 1);
  const std::vector<float> w1 = loom::testing::RandomVector(H * D, 2, 0.3f);
  const std::vector<float> b1 = loom::testing::RandomVector(H, 3, 0.1f);
  const std::vector<float> w2 = loom::testing::RandomVector(D * H, 4, 0.3f);
  const std::vector<float> b2 = loom::testing::RandomVector(D, 5, 0.1f);
  const std::vector<float> dy = loom::testing::RandomVector(M * D, 6);

  // The single-device block and its gradients.
  std::vector<float> h(M * H), a(M * H), y(M * D);
  kernels::matmul_forward(h.data(), x.data(), w1.data(), b1.data(), M, D, H);
  kernels::gelu_forward(a.data(), h.data(), M * H);
  kernels::matmul_forward(y.data(), a.data(), w2.data(), b2.data(), M, H, D);
  std::vector<float> da(M * H, 0), dw2(D * H, 0), db2(D, 0), dh(M * H, 0), dw1(H * D, 0), db1(H, 0),
      dx(M * D, 0);
  kernels::matmul_backward(da.data(), dw2.data(), db2.data(), dy.data(), a.data(), w2.data(), M, H,
                           D);
  kernels::gelu_backward(dh.data(), h.data(), da.data(), M * H);
  kernels::matmul_backward(dx.data(), dw1.data(), db1.data(), dh.data(), x.data(), w1.data(), M, D,
                           H);

  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp);
    InMemoryStore store;
    loom::testing::OnRanks(tp, "tp", &store, [&](int r, Communicator* c) {
      const int hs = H / tp;
      const std::vector<float> w1r = SliceRows(w1.data(), H, D, tp, r);
      const std::vector<float> b1r = SliceRows(b1.data(), H, 1, tp, r);
      const std::vector<float> w2r = SliceCols(w2.data(), D, H, tp, r);
      std::vector<float> hr(M * hs), ar(M * hs), yr(M * D);
      ColumnParallelForward(CpuOps(), hr.data(), x.data(), w1r.data(), b1r.data(), M, D,
                            hs);  // after f
      kernels::gelu_forward(ar.data(), hr.data(), M * hs);
      ASSERT_TRUE(
          RowParallelForward(CpuOps(), c, yr.data(), ar.data(), w2r.data(), b2.data(), M, hs, D)
              .ok());
      ExpectClose(yr, y, "y");

      std::vector<float> dar(M * hs, 0), dw2r(D * hs, 0), db2r(D, 0), dhr(M * hs, 0),
          dw1r(hs * D, 0), db1r(hs, 0), dxr(M * D, 0);
      RowParallelBackward(CpuOps(), dar.data(), dw2r.data(), db2r.data(), dy.data(), ar.data(),
                          w2r.data(), M, hs, D);
      kernels::gelu_backward(dhr.data(), hr.data(), dar.data(), M * hs);
      ColumnParallelBackward(CpuOps(), dxr.data(), dw1r.data(), db1r.data(), dhr.data(), x.data(),
                             w1r.data(), M, D, hs);
      ASSERT_TRUE(AllReduceTp(c, dxr.data(), M * D).ok());  // f backward
      ExpectClose(dw2r, SliceCols(dw2.data(), D, H, tp, r), "dw2 slice");
      ExpectClose(db2r, db2, "db2");
      ExpectClose(dw1r, SliceRows(dw1.data(), H, D, tp, r), "dw1 slice");
      ExpectClose(db1r, SliceRows(db1.data(), H, 1, tp, r), "db1 slice");
      ExpectClose(dxr, dx, "dx");
    });
  }
}

}  // namespace
}  // namespace loom::parallel
