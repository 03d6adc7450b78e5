// For tests: ranks as threads of one process, each with its own Gloo
// communicator over an in-memory rendezvous store.
#ifndef LOOM_RUNTIME_COMM_COMM_TESTING_H_
#define LOOM_RUNTIME_COMM_COMM_TESTING_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/collective.h"

namespace loom::testing {

// Runs `fn(rank, communicator)` on `size` threads, all in group `prefix` of
// `store`, and waits for them.
template <typename Fn>
void OnRanks(int size, const std::string& prefix, InMemoryStore* store, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.prefix = prefix;
      o.rank = r;
      o.size = size;
      o.host = "127.0.0.1";
      o.timeout = absl::Seconds(20);
      absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectGloo(store, o);
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_EQ((*comm)->rank(), r);
      EXPECT_EQ((*comm)->size(), size);
      fn(r, comm->get());
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace loom::testing

#endif  // LOOM_RUNTIME_COMM_COMM_TESTING_H_
