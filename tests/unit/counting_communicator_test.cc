// Every collective through a CountingCommunicator is counted once.
#include "worker/collective/counting_communicator.h"

#include <gtest/gtest.h>

namespace lockstep::worker {
namespace {

TEST(CountingCommunicatorTest, CountsEveryCollectiveAndForwardsIt) {
  SingleRankCommunicator inner;
  std::atomic<int64_t> count{0};
  CountingCommunicator comm(&inner, &count);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  float data[2] = {1, 2};
  EXPECT_TRUE(comm.AllReduceSum(data, 2).ok());
  EXPECT_TRUE(comm.Broadcast(data, 2, 0).ok());
  int64_t in = 7, out = 0;
  EXPECT_TRUE(comm.AllGather(&in, sizeof(in), &out).ok());
  EXPECT_EQ(out, 7);
  EXPECT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(count.load(), 4);
  comm.Abort();  // forwarded; not a collective
  EXPECT_EQ(count.load(), 4);
}

}  // namespace
}  // namespace lockstep::worker
