// A thread started with a small stack size (civetweb's 100 KB) can use that
// much stack in a process whose libraries hold tens of KB of static TLS
// (OpenBLAS's 60 KB here): services/common/thread_stack.cc. Without it the
// thread has ~35 KB and this test dies of SIGSEGV.
#include <cblas.h>
#include <pthread.h>

#include <cstring>

#include "gtest/gtest.h"

namespace {

// Uses `bytes` of stack in 4 KB frames, each written through.
size_t UseStack(size_t bytes) {
  volatile char frame[4096];
  std::memset(const_cast<char*>(frame), 1, sizeof(frame));
  size_t sum = frame[bytes % sizeof(frame)];
  if (bytes > sizeof(frame)) sum += UseStack(bytes - sizeof(frame));
  return sum;
}

void* Deep(void* out) {
  *static_cast<size_t*>(out) = UseStack(88 * 1024);
  return nullptr;
}

TEST(ThreadStackTest, ASmallStackSizeIsUsableWhateverTheStaticTls) {
  // OpenBLAS loaded, as in every service (its TLS is the largest).
  ASSERT_GT(openblas_get_num_threads(), 0);
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 * 1024), 0);
  size_t sum = 0;
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, &attr, Deep, &sum), 0);
  ASSERT_EQ(pthread_join(t, nullptr), 0);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(sum, 22u);  // 22 frames of 4 KB, each read back as 1
}

}  // namespace
