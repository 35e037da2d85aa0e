// Ranks as threads of one test process, each with its own Gloo communicator
// over 127.0.0.1, meeting through an in-memory key-value store.
#ifndef LOCKSTEP_TESTS_UNIT_GLOO_RANKS_H_
#define LOCKSTEP_TESTS_UNIT_GLOO_RANKS_H_

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "worker/collective/communicator.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/in_memory_kv.h"

namespace lockstep::worker {

// Runs `body` on `world` ranks and waits for all of them.
inline void OnRanks(int world,
                    const std::function<void(int, Communicator&)>& body) {
  InMemoryKeyValue kv;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.timeout = absl::Seconds(30);
      auto comm = GlooCommunicator::Connect(&kv, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(rank, **comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace lockstep::worker

#endif  // LOCKSTEP_TESTS_UNIT_GLOO_RANKS_H_
