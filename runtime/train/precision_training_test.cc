// bf16 mixed precision over whole runs of loom-train-local: tiny-deep
// trained 200 steps in bf16 reaches the loss fp32 reaches; a checkpoint
// (fp32 masters) resumes in its own precision exactly and in the other one
// from its weights; a bad --precision is refused by name.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/train/train_local_testing.h"

namespace loom {
namespace {

using testing::PrintedStep;
using testing::PrintedSteps;
using testing::TrainLocal;

std::vector<PrintedStep> Train(const std::string& args) {
  int rc = 0;
  const std::string out = TrainLocal(args, &rc);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  return PrintedSteps(out);
}

double MeanLoss(const std::vector<PrintedStep>& steps, size_t last) {
  double sum = 0;
  for (size_t i = steps.size() - last; i < steps.size(); ++i) sum += steps[i].loss;
  return sum / static_cast<double>(last);
}

TEST(PrecisionTrainingTest, ABadPrecisionIsRefusedByName) {
  int rc = 0;
  const std::string out = TrainLocal("--precision fp16 --steps 0", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--precision: want fp32 or bf16, got \"fp16\""), std::string::npos) << out;
}

// The bar: tiny-deep, 200 steps, cosine decay, in both precisions
// from the same seed and data, on one BLAS thread and OpenBLAS's Haswell
// kernels (its summation order is then the same on every x86-64 machine
// with AVX2: Debian's OpenBLAS otherwise picks its kernels by CPU, and 200
// steps carry the difference far; on an AVX-512 machine's own kernels the
// two means came out 0.698 and 0.758, on the Haswell kernels 0.7337 and
// 0.7201). The last 20 steps' mean loss agrees
// within kBf16VsFp32Training (which says why a mean, and why 4%); bf16
// has no loss spike fp32 lacks (its largest gradient norm is fp32's); and
// the runs are not the same run.
TEST(PrecisionTrainingTest, Bf16TrainsTinyDeepAsFp32Does) {
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  }
  const std::string job =
      "--config tiny-deep --steps 200 --seed 1 --lr_schedule cosine --min_lr 1e-5";
  const std::vector<PrintedStep> fp32 = Train(job + " --precision fp32"),
                                 bf16 = Train(job + " --precision bf16");
  ASSERT_EQ(fp32.size(), 200u);
  ASSERT_EQ(bf16.size(), 200u);
  const testing::Tolerance t = testing::kBf16VsFp32Training;
  const double a = MeanLoss(fp32, 20), b = MeanLoss(bf16, 20);
  EXPECT_NEAR(b, a, testing::Allowed(t, a)) << t.reason;
  EXPECT_LT(a, 0.5 * fp32.front().loss) << "fp32 did not train";
  double most32 = 0, most16 = 0;
  bool differ = false;
  for (size_t i = 0; i < fp32.size(); ++i) {
    differ |= fp32[i].loss != bf16[i].loss;
    most32 = std::max(most32, fp32[i].grad_norm);
    most16 = std::max(most16, bf16[i].grad_norm);
  }
  EXPECT_LT(most16, 1.5 * most32) << "a gradient spike in bf16 alone";
  EXPECT_TRUE(differ) << "bf16 printed fp32's losses";
  std::printf(
      "tiny-deep, 200 steps: mean loss of the last 20 steps fp32 %.4f, bf16 %.4f (%+.2f%%); "
      "largest grad_norm %.2f / %.2f\n",
      a, b, 100 * (b - a) / a, most32, most16);
}

// Two steps, a checkpoint, two more: in the same precision exactly the
// uninterrupted run; in the other precision the other run's steps to bf16's
// precision, so the weights came from the checkpoint (the loss has fallen
// by then: a fresh start would be far off).
TEST(PrecisionTrainingTest, CheckpointsResumeInEitherPrecision) {
  const std::string job = "--config tiny --batch_size 4 --lr 3e-3 --warmup_steps 0 --seed 3";
  const std::string tmp = std::getenv("TEST_TMPDIR");
  for (const std::string from : {"fp32", "bf16"}) {
    for (const std::string to : {"fp32", "bf16"}) {
      const std::vector<PrintedStep> whole = Train(job + " --steps 4 --precision " + to);
      ASSERT_EQ(whole.size(), 4u);
      ASSERT_LT(whole[2].loss, 0.9 * whole[0].loss) << "too little training to tell";
      const std::string dir = tmp + "/" + from + "-" + to;
      const std::string ckpt = " --checkpoint_dir " + dir + " --checkpoint_every 2";
      ASSERT_EQ(Train(job + " --steps 2 --precision " + from + ckpt).size(), 2u);
      const std::vector<PrintedStep> resumed =
          Train(job + " --steps 4 --resume --precision " + to + ckpt);
      ASSERT_EQ(resumed.size(), 2u) << from << " -> " << to;
      for (int i = 0; i < 2; ++i) {
        const PrintedStep& got = resumed[i];
        const PrintedStep& want = whole[i + 2];
        EXPECT_EQ(got.step, want.step);
        if (from == to) {
          EXPECT_EQ(got.loss, want.loss) << from << " step " << want.step;
          EXPECT_EQ(got.grad_norm, want.grad_norm) << from << " step " << want.step;
        } else {
          const testing::Tolerance t = testing::kBf16VsFp32Model;
          EXPECT_NEAR(got.loss, want.loss, testing::Allowed(t, want.loss))
              << from << " -> " << to << " step " << want.step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom
