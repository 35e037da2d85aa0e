// The real Coordinator on a simulated pool (tests/sim/coordinator_sim.h):
// 1,000 seeds of 150 events each (200 under the sanitizers), in ten blocks
// that ctest runs side by side. A failure prints the seed, the events that led
// to it and the invariant broken; `coordinator_sim --seed N --trace` replays
// it.
#include "tests/sim/coordinator_sim.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace lockstep::coordinator::sim {
namespace {

// Seeds per block: 100, fewer in the sanitizer build.
#ifndef LOCKSTEP_SIM_SEEDS_PER_BLOCK
#define LOCKSTEP_SIM_SEEDS_PER_BLOCK 100
#endif
constexpr int kSeedsPerBlock = LOCKSTEP_SIM_SEEDS_PER_BLOCK;

// A fresh folder for the job store, on a tmpfs where there is one (the
// store fsyncs every transition).
std::string FreshStateDir() {
  const char* base =
      std::filesystem::is_directory("/dev/shm")
          ? "/dev/shm"
          : (getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp");
  std::string templ = std::string(base) + "/lockstep-sim-XXXXXX";
  char* made = mkdtemp(templ.data());
  return made == nullptr ? "" : templ;
}

class CoordinatorSimTest : public ::testing::TestWithParam<int> {};

TEST_P(CoordinatorSimTest, EveryInvariantHoldsAfterEveryEvent) {
  for (int i = 0; i < kSeedsPerBlock; ++i) {
    SimOptions options;
    // Block b runs seeds 100b+1 ... whatever the count, so a seed named in
    // a failure is the same seed in every build.
    options.seed = static_cast<uint64_t>(GetParam()) * 100 + i + 1;
    options.workers = 3 + static_cast<int>(options.seed % 4);
    options.events = 150;
    options.state_dir = FreshStateDir();
    ASSERT_FALSE(options.state_dir.empty()) << "mkdtemp failed";
    const SimResult result = RunSimulation(options);
    std::filesystem::remove_all(options.state_dir);
    ASSERT_TRUE(result.violations.empty()) << Describe(options, result);
    EXPECT_EQ(result.events, options.events);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, CoordinatorSimTest, ::testing::Range(0, 10));

}  // namespace
}  // namespace lockstep::coordinator::sim
