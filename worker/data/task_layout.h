// What a job learns from its data (README.md, "Tasks"): which columns feed
// the model and the loss, the shapes the model takes and returns, and how the
// input is normalized, resolved against the training split. No tensors: the
// CLI's `lockstep data check` resolves a job's task as a worker would.
#ifndef LOCKSTEP_WORKER_DATA_TASK_LAYOUT_H_
#define LOCKSTEP_WORKER_DATA_TASK_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lockstep/v1/job.pb.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {

// kCustom: a training-step module (docs/MODELS.md) computes the loss and
// the evaluation's sums from every column of the batch.
enum class TaskType { kClassification, kRegression, kLanguageModel, kCustom };

// x -> x * scale - shift, in float: the input's normalization. With
// per-element values (normalize "per_feature"), element e of each sample
// uses scales[e] and shifts[e] instead.
struct Normalization {
  float scale = 1;
  float shift = 0;
  std::vector<float> scales;
  std::vector<float> shifts;
};

struct Task {
  TaskType type = TaskType::kClassification;
  // kCustom: every column of the split, in order (and their indices); the
  // other tasks use input_column and target_column.
  std::vector<ColumnInfo> all;
  std::vector<int> columns;
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
// `test`, when given, counts for a language model's vocabulary too (a test
// token the model cannot output fails at once, not at the first
// evaluation).
absl::StatusOr<Task> ResolveTask(const v1::JobSpec& spec,
                                 const SplitSource& train,
                                 const SplitSource* test = nullptr);

// The task for the test split: its columns of the training split's names
// (with the same dtypes and shapes), wherever they stand among the test
// split's columns; its labels checked against the classes, or its token ids
// against the vocabulary.
absl::StatusOr<Task> TaskForTest(const Task& task, const SplitSource& test);

// The task for a log line: "classification of 'image' into 100 classes".
std::string TaskText(const Task& task);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_TASK_LAYOUT_H_
