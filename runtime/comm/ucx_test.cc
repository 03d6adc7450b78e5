#include "runtime/comm/ucx.h"

#include <atomic>
#include <numeric>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(UcxTest, TaggedMessagesArriveWhateverTheOrderAndSize) {
  auto a = UcxWorker::Create();
  auto b = UcxWorker::Create();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  // A small message (eager) and a large one (rendezvous), sent before the
  // receiver posts its receives.
  auto small = std::make_shared<std::vector<int32_t>>(100);
  auto large = std::make_shared<std::vector<float>>(3 << 20);
  std::iota(small->begin(), small->end(), 7);
  std::iota(large->begin(), large->end(), 0.5f);
  std::atomic<int> done{0};
  ASSERT_TRUE((*a)->Send((*b)->address(), 42, large->data(), large->size() * 4, large,
                         [&](absl::Status s) {
                           EXPECT_TRUE(s.ok()) << s;
                           ++done;
                         })
                  .ok());
  ASSERT_TRUE((*a)->Send((*b)->address(), 41, small->data(), small->size() * 4, small).ok());
  std::vector<int32_t> got_small(100);
  std::vector<float> got_large(3 << 20);
  absl::Status s = (*b)->RecvAll(
      {{41, got_small.data(), got_small.size() * 4}, {42, got_large.data(), got_large.size() * 4}},
      absl::Seconds(30));
  EXPECT_TRUE((*a)->Flush(absl::Seconds(10)));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got_small, *small);
  EXPECT_EQ(got_large, *large);
  EXPECT_EQ(done.load(), 1);
  EXPECT_EQ((*a)->stats().bytes_sent, static_cast<int64_t>(400 + large->size() * 4));
  EXPECT_EQ((*b)->stats().bytes_received, static_cast<int64_t>(400 + large->size() * 4));
}

TEST(UcxTest, MissingMessageTimesOutAndWrongSizeIsDataLoss) {
  auto a = *UcxWorker::Create();
  auto b = *UcxWorker::Create();
  std::vector<char> buf(64);
  absl::Status s = b->RecvAll({{7, buf.data(), buf.size()}}, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  auto bytes = std::make_shared<std::string>(32, 'x');
  ASSERT_TRUE(a->Send(b->address(), 8, bytes->data(), bytes->size(), bytes).ok());
  a->Flush(absl::Seconds(5));
  s = b->RecvAll({{8, buf.data(), buf.size()}}, absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // Bytes that are not a worker address are refused before UCX parses them
  // (UCX itself aborts the process on a malformed address).
  for (std::string bad : {std::string(), std::string("not an address"), b->address()}) {
    if (!bad.empty() && bad == b->address()) bad[bad.size() / 2] ^= 1;
    EXPECT_EQ(a->Send(bad, 1, bytes->data(), 1, bytes).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace loom
