// What a job learns from its data (README.md, "Tasks"): which columns feed
// the model and the loss, the shapes the model takes and returns, how the
// input is normalized, the training loss, and the test metrics, which are
// computed from sums all-reduced over the ranks so that every world size
// reports the same numbers.
#ifndef LOCKSTEP_WORKER_TRAIN_TASK_H_
#define LOCKSTEP_WORKER_TRAIN_TASK_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lockstep/v1/job.pb.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {

enum class TaskType { kClassification, kRegression, kLanguageModel };

// x -> x * scale - shift, in float: the input's normalization.
struct Normalization {
  float scale = 1;
  float shift = 0;
};

struct Task {
  TaskType type = TaskType::kClassification;
  int input_column = 0;   // in the split's source
  int target_column = 0;  // the same column for a language model
  ColumnInfo input;
  ColumnInfo target;
  // What the model takes per sample: floats of this shape, or (language
  // models) `block` int64 token ids.
  std::vector<int64_t> model_input;
  bool token_input = false;
  int64_t block = 0;
  // Classes, target elements (regression) or the vocabulary.
  int64_t outputs = 0;
  Normalization normalization;
  // The spec's task settings.
  double label_smoothing = 0;
  std::string regression_loss = "mse";
};

// Resolves the job's task against its training split: the columns
// (task.input/target, or the defaults), their dtypes and shapes, the
// output width (num_classes, the target's elements, model.vocab_size or the
// largest token id + 1), and the input's normalization (Fashion-MNIST's
// for idx, data.features' when given, else statistics of the training
// split). Errors name the column, the data and what the task needs.
absl::StatusOr<Task> ResolveTask(const v1::JobSpec& spec,
                                 const SplitSource& train);

// The test split must hold the same columns as the training split.
absl::Status MatchTestColumns(const Task& task, const SplitSource& test);

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

// The task for a log line: "classification of 'image' into 100 classes".
std::string TaskText(const Task& task);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TASK_H_
