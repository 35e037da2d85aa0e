// Fuzz target: TF_CONFIG as a coordinator and a worker read it from the
// environment. A document that parses must describe a cluster that
// validates, whose task (if any) has a rank or is a spare or a non-training
// task, and that compares equal to itself; two halves of the input are also
// compared with each other, as the coordinator compares a worker's view.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/tf_config.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "tf_config_fuzz: %s\n", what);
  std::abort();
}

void Exercise(const lockstep::TfConfig& config) {
  Check(lockstep::ValidateCluster(config.cluster).ok(),
        "a parsed cluster does not validate");
  Check(lockstep::SameCluster(config.cluster, config.cluster),
        "a cluster differs from itself");
  (void)lockstep::DescribeCluster(config.cluster);
  int rank = 0;
  for (const lockstep::v1::TaskId& task :
       lockstep::TrainingTasks(config.cluster)) {
    auto got = lockstep::RankOf(config.cluster, task);
    Check(got.ok() && *got == rank++, "a training task's rank is wrong");
    Check(!lockstep::TaskAddress(config.cluster, task).empty(),
          "a training task has no address");
    (void)lockstep::TaskName(task);
  }
  if (config.task.has_value()) {
    (void)lockstep::RankOf(config.cluster, *config.task);
    (void)lockstep::IsSpareTask(config.cluster, *config.task);
    Check(!lockstep::TaskAddress(config.cluster, *config.task).empty(),
          "the task of a parsed TF_CONFIG has no address");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  auto whole = lockstep::ParseTfConfig(input);
  if (whole.ok()) Exercise(*whole);
  // "A\nB": a coordinator's cluster A against a worker's view B.
  size_t cut = input.find('\n');
  if (cut == absl::string_view::npos) return 0;
  auto a = lockstep::ParseTfConfig(input.substr(0, cut));
  auto b = lockstep::ParseTfConfig(input.substr(cut + 1));
  if (a.ok() && b.ok()) {
    Exercise(*a);
    Exercise(*b);
    Check(lockstep::SameCluster(a->cluster, b->cluster) ==
              lockstep::SameCluster(b->cluster, a->cluster),
          "SameCluster is not symmetric");
  }
  return 0;
}
