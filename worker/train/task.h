// The training loss of a job's task (worker/data/task_layout.h) and its test
// metrics, which are computed from sums all-reduced over the ranks so that
// every world size reports the same numbers.
#ifndef LOCKSTEP_WORKER_TRAIN_TASK_H_
#define LOCKSTEP_WORKER_TRAIN_TASK_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/data/task_layout.h"

namespace lockstep::worker {

// The mean training loss of `outputs` (the model's) against `targets`.
torch::Tensor TaskLoss(const Task& task, const torch::Tensor& outputs,
                       const torch::Tensor& targets);

// What an evaluation adds up on each rank; all-reduced, then turned into
// metrics. Fixed size per task.
int EvalSumCount(const Task& task);
void AddEvalSums(const Task& task, const torch::Tensor& outputs,
                 const torch::Tensor& targets, std::vector<double>* sums);

// The test metrics by their fixed names (test_accuracy, test_top5_accuracy,
// test_mse, test_mae, test_perplexity), and the test loss, from the
// all-reduced sums.
struct EvalMetrics {
  double loss = 0;
  std::map<std::string, double> metrics;
  // Classification's accuracy (0 for other tasks): the legacy field.
  double accuracy = 0;
};
EvalMetrics MetricsFromSums(const Task& task, const std::vector<double>& sums);

// A training-step module's metrics from the all-reduced sums: [0] the
// loss times the samples, [1] the samples, then the module's `names`.
// test_<name> is each sum per "count" when the module returns one, else
// per sample; "count" itself is not reported.
EvalMetrics CustomMetrics(const std::vector<std::string>& names,
                          const std::vector<double>& sums);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TASK_H_
