// For tests: ranks as threads of one process, each with its own Gloo
// communicator over an in-memory rendezvous store.
#ifndef LOOM_RUNTIME_COMM_COMM_TESTING_H_
#define LOOM_RUNTIME_COMM_COMM_TESTING_H_

#include <string>

#include "gtest/gtest.h"
#include "runtime/comm/collective.h"

namespace loom::testing {

// Runs `fn(rank, communicator)` on `size` threads, all in group `prefix` of
// `store`, and waits for them.
template <typename Fn>
void OnRanks(int size, const std::string& prefix, InMemoryStore* store, Fn fn) {
  const absl::Status s =
      OnGlooThreads(store, prefix, size, absl::Seconds(20), [&](int r, Communicator* comm) {
        EXPECT_EQ(comm->rank(), r);
        EXPECT_EQ(comm->size(), size);
        fn(r, comm);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace loom::testing

#endif  // LOOM_RUNTIME_COMM_COMM_TESTING_H_
