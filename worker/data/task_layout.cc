// Resolving a job's task against its training split (task_layout.h).
#include "worker/data/task_layout.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"

namespace lockstep::worker {
namespace {

// Fashion-MNIST's pixel mean and standard deviation over the training set
// (of [0, 1] values): idx data is normalized by these.
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;

// Statistics and label checks read at most this many samples, evenly
// spaced (all of them in a smaller split).
constexpr int64_t kStatisticsSamples = 65536;
constexpr int64_t kReadChunk = 1024;

std::string ColumnNames(const SplitSource& source) {
  std::vector<std::string> names;
  for (const ColumnInfo& column : source.columns()) {
    names.push_back(absl::StrCat(column.name, " (", DtypeName(column.dtype),
                                 " ", column.ShapeText(), ")"));
  }
  return absl::StrJoin(names, ", ");
}

// The column `wanted`, or the first of `fallbacks` the split has.
absl::StatusOr<int> FindColumn(const SplitSource& source,
                               const std::string& wanted,
                               std::vector<std::string> fallbacks,
                               const char* field) {
  if (!wanted.empty()) fallbacks = {wanted};
  for (const std::string& name : fallbacks) {
    const int index = source.Find(name);
    if (index >= 0) return index;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the training data (", source.description(),
                   ") has no column ", absl::StrJoin(fallbacks, " or "),
                   " for ", field, "; its columns are ", ColumnNames(source),
                   wanted.empty() ? absl::StrCat("; set ", field) : ""));
}

// The samples statistics and checks read: every one, or evenly spaced.
std::vector<int64_t> SampledIndices(int64_t size) {
  const int64_t n = std::min(size, kStatisticsSamples);
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[i] = i * size / n;
  return indices;
}

// Calls `visit(data, count)` with the column's raw elements, chunk by chunk.
template <typename Visit>
absl::Status VisitColumn(const SplitSource& source, int column,
                         const std::vector<int64_t>& indices, Visit visit) {
  const int64_t bytes = source.columns()[column].sample_bytes();
  std::vector<char> buffer;
  for (size_t begin = 0; begin < indices.size(); begin += kReadChunk) {
    const size_t n = std::min<size_t>(kReadChunk, indices.size() - begin);
    buffer.resize(n * static_cast<size_t>(bytes));
    RETURN_IF_ERROR(source.ReadColumn(
        column, absl::MakeConstSpan(indices).subspan(begin, n), buffer.data()));
    visit(buffer.data(), static_cast<int64_t>(n), begin);
  }
  return absl::OkStatus();
}

// Each element's mean and std over the sampled training samples, in
// double: (x - mean_e) / std_e in the column's own units.
absl::Status SetPerFeatureNormalization(const SplitSource& source, Task* task) {
  const ColumnInfo& input = task->input;
  const int64_t elements = input.elements();
  std::vector<double> sum(static_cast<size_t>(elements), 0.0);
  std::vector<double> squares(static_cast<size_t>(elements), 0.0);
  double n = 0;
  RETURN_IF_ERROR(
      VisitColumn(source, task->input_column, SampledIndices(source.size()),
                  [&](const char* data, int64_t count, size_t) {
                    for (int64_t s = 0; s < count; ++s) {
                      for (int64_t e = 0; e < elements; ++e) {
                        const double x =
                            ElementAsFloat(input.dtype, data, s * elements + e);
                        sum[e] += x;
                        squares[e] += x * x;
                      }
                    }
                    n += static_cast<double>(count);
                  }));
  Normalization& out = task->normalization;
  out.scales.resize(static_cast<size_t>(elements));
  out.shifts.resize(static_cast<size_t>(elements));
  for (int64_t e = 0; e < elements; ++e) {
    const double mean = sum[e] / n;
    const double var = squares[e] / n - mean * mean;
    if (!std::isfinite(mean) || !std::isfinite(var)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "element ", e, " of column ", input.name, " of ",
          source.description(),
          " holds values that are not finite (NaN or infinity); clean the "
          "data"));
    }
    // A constant feature is only shifted: a std of 0 would divide by 0.
    const double std = var > 1e-12 ? std::sqrt(var) : 1.0;
    out.scales[e] = static_cast<float>(1.0 / std);
    out.shifts[e] = static_cast<float>(mean / std);
  }
  return absl::OkStatus();
}

absl::Status SetNormalization(const v1::JobSpec& spec,
                              const SplitSource& source, Task* task) {
  const ColumnInfo& input = task->input;
  if (task->token_input) return absl::OkStatus();
  auto declared = spec.data().features().find(input.name);
  if (declared != spec.data().features().end() &&
      declared->second.channel_std_size() > 0) {
    // torchvision's Normalize: channel c of [C, ...] as (x - mean_c) /
    // std_c, pixels in [0, 1] units.
    const v1::ColumnSpec& column = declared->second;
    const int64_t channels = column.channel_std_size();
    if (input.shape.empty() || input.shape[0] != channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.features[\"", input.name, "\"] gives ", channels,
          " channel means and stds, but the input is ", input.ShapeText(),
          " (channels first, [C, ...]): give one per channel"));
    }
    const double unit = input.dtype == Dtype::kUInt8 ? 255.0 : 1.0;
    const int64_t plane = input.elements() / channels;
    Normalization& out = task->normalization;
    out.scales.resize(static_cast<size_t>(input.elements()));
    out.shifts.resize(static_cast<size_t>(input.elements()));
    for (int64_t e = 0; e < input.elements(); ++e) {
      const int64_t c = e / plane;
      out.scales[e] = static_cast<float>(1.0 / (unit * column.channel_std(c)));
      out.shifts[e] =
          static_cast<float>(column.channel_mean(c) / column.channel_std(c));
    }
    return absl::OkStatus();
  }
  if (declared != spec.data().features().end() && declared->second.has_std()) {
    const float mean = static_cast<float>(declared->second.mean());
    const float std = static_cast<float>(declared->second.std());
    task->normalization = {1.0f / std, mean / std};
    return absl::OkStatus();
  }
  if (declared != spec.data().features().end() &&
      declared->second.normalize() == "per_feature") {
    return SetPerFeatureNormalization(source, task);
  }
  const bool pixels = input.dtype == Dtype::kUInt8;
  float mean = kFashionMnistMean;
  float std = kFashionMnistStd;
  if (spec.data().format() != "idx") {
    // One pass in the order of the samples, in double: the same sums as
    // reading the split's pixels front to back.
    double sum = 0, sum_squares = 0, n = 0;
    const Dtype dtype = input.dtype;
    const int64_t elements = input.elements();
    RETURN_IF_ERROR(
        VisitColumn(source, task->input_column, SampledIndices(source.size()),
                    [&](const char* data, int64_t count, size_t) {
                      const int64_t total = count * elements;
                      if (pixels) {
                        const auto* p = reinterpret_cast<const uint8_t*>(data);
                        for (int64_t i = 0; i < total; ++i) {
                          sum += p[i];
                          sum_squares += static_cast<double>(p[i]) * p[i];
                        }
                      } else {
                        for (int64_t i = 0; i < total; ++i) {
                          const double x = ElementAsFloat(dtype, data, i);
                          sum += x;
                          sum_squares += x * x;
                        }
                      }
                      n += static_cast<double>(total);
                    }));
    const double unit = pixels ? 255.0 : 1.0;
    const double m = sum / n / unit;
    const double var = sum_squares / n / (unit * unit) - m * m;
    if (!std::isfinite(m) || !std::isfinite(var)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column ", input.name, " of ", source.description(),
          " holds values that are not finite (NaN or infinity); clean the "
          "data, or give data.features[\"",
          input.name, "\"].mean and .std"));
    }
    mean = static_cast<float>(m);
    std = static_cast<float>(std::sqrt(std::max(var, 1e-12)));
  }
  if (pixels) {
    // Pixels in [0, 1] units: the normalization lockstep always used.
    task->normalization = {1.0f / (255.0f * std), mean / std};
  } else {
    task->normalization = {1.0f / std, mean / std};
  }
  return absl::OkStatus();
}

// Classification: the labels read for the statistics are checked now, so
// a wrong num_classes fails at once (every batch is checked as well).
absl::Status CheckLabels(const SplitSource& source, const Task& task) {
  absl::Status status;
  const std::vector<int64_t> indices = SampledIndices(source.size());
  RETURN_IF_ERROR(VisitColumn(
      source, task.target_column, indices,
      [&](const char* data, int64_t count, size_t begin) {
        for (int64_t i = 0; i < count && status.ok(); ++i) {
          const int64_t label = ElementAsInt(task.target.dtype, data, i);
          if (label < 0 || label >= task.outputs) {
            status = absl::InvalidArgumentError(absl::StrCat(
                "label ", label, " of sample ", indices[begin + i], " in ",
                source.description(), " is outside [0, ", task.outputs,
                "): set task.num_classes to the number of classes"));
          }
        }
      }));
  return status;
}

absl::StatusOr<Task> ResolveLanguageModel(const v1::JobSpec& spec,
                                          const SplitSource& source,
                                          const SplitSource* test, Task task) {
  ASSIGN_OR_RETURN(task.input_column, FindColumn(source, spec.task().input(),
                                                 {"tokens"}, "task.input"));
  task.target_column = task.input_column;
  task.input = task.target = source.columns()[task.input_column];
  if (!IsInteger(task.input.dtype) || task.input.shape.size() != 1 ||
      task.input.shape[0] < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a language model trains on windows of token ids: column ",
                     task.input.name, " of ", source.description(), " is ",
                     DtypeName(task.input.dtype), " ", task.input.ShapeText(),
                     ", not integers of shape [block_size + 1]"));
  }
  task.token_input = true;
  task.block = task.input.shape[0] - 1;
  task.model_input = {task.block};
  if (spec.model().vocab_size() > 0) {
    task.outputs = spec.model().vocab_size();
  } else {
    // The vocabulary the data uses: the largest id of both splits + 1.
    ASSIGN_OR_RETURN(int64_t largest, source.LargestValue(task.input_column));
    const int test_column = test != nullptr ? test->Find(task.input.name) : -1;
    if (test_column >= 0) {
      ASSIGN_OR_RETURN(int64_t in_test, test->LargestValue(test_column));
      largest = std::max(largest, in_test);
    }
    if (largest >= kMaxClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the largest token id in ", source.description(),
          test_column >= 0 ? absl::StrCat(" or ", test->description()) : "",
          " is ", largest, ": a vocabulary of more than ", kMaxClasses,
          " ids; the data is not token ids of this dtype, or set "
          "model.vocab_size"));
    }
    task.outputs = largest + 1;
  }
  return task;
}

}  // namespace

absl::StatusOr<Task> ResolveTask(const v1::JobSpec& spec,
                                 const SplitSource& source,
                                 const SplitSource* test) {
  Task task;
  const std::string& type = spec.task().type();
  task.type = type == "regression"       ? TaskType::kRegression
              : type == "language_model" ? TaskType::kLanguageModel
              : type == "custom"         ? TaskType::kCustom
                                         : TaskType::kClassification;
  if (task.type == TaskType::kCustom) {
    // The module takes every column as it is: no normalization.
    task.all = source.columns();
    for (size_t c = 0; c < source.columns().size(); ++c) {
      task.columns.push_back(static_cast<int>(c));
    }
    return task;
  }
  task.label_smoothing = spec.task().label_smoothing();
  if (!spec.task().loss().empty()) task.regression_loss = spec.task().loss();
  if (task.type == TaskType::kLanguageModel) {
    return ResolveLanguageModel(spec, source, test, std::move(task));
  }
  ASSIGN_OR_RETURN(task.input_column,
                   FindColumn(source, spec.task().input(),
                              {"image", "images", "x"}, "task.input"));
  ASSIGN_OR_RETURN(task.target_column,
                   FindColumn(source, spec.task().target(),
                              {"label", "labels", "y"}, "task.target"));
  task.input = source.columns()[task.input_column];
  task.target = source.columns()[task.target_column];
  task.model_input = task.input.shape;
  if (task.model_input.empty()) task.model_input = {1};
  // Images [H, W] have one channel.
  if (task.model_input.size() == 2) {
    task.model_input.insert(task.model_input.begin(), 1);
  }
  if (task.type == TaskType::kClassification) {
    if (!IsInteger(task.target.dtype) || task.target.elements() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "classification needs one integer label per sample: column ",
          task.target.name, " of ", source.description(), " is ",
          DtypeName(task.target.dtype), " ", task.target.ShapeText(),
          "; for real-valued targets set task.type \"regression\""));
    }
    task.outputs = spec.task().num_classes();
    if (static_cast<int64_t>(task.target.classes.size()) > task.outputs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column ", task.target.name, " of ", source.description(), " names ",
          task.target.classes.size(), " classes, more than task.num_classes (",
          task.outputs, "); set task.num_classes to ",
          task.target.classes.size()));
    }
    RETURN_IF_ERROR(CheckLabels(source, task));
  } else {
    task.outputs = task.target.elements();
  }
  RETURN_IF_ERROR(SetNormalization(spec, source, &task));
  return task;
}

absl::StatusOr<Task> TaskForTest(const Task& task, const SplitSource& test) {
  Task out = task;
  // The test split's own column of `column`'s name: the same dtype and
  // shape, wherever it stands among the test split's columns.
  auto find = [&](const ColumnInfo& column) -> absl::StatusOr<int> {
    const int index = test.Find(column.name);
    if (index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the test data (", test.description(), ") has no column ",
          column.name, "; its columns are ", ColumnNames(test)));
    }
    const ColumnInfo& found = test.columns()[index];
    if (found.dtype != column.dtype || found.shape != column.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column ", column.name, " is ", DtypeName(found.dtype), " ",
          found.ShapeText(), " in the test data (", test.description(),
          ") but ", DtypeName(column.dtype), " ", column.ShapeText(),
          " in the training data; both splits must agree"));
    }
    return index;
  };
  if (task.type == TaskType::kCustom) {
    if (test.columns().size() != task.all.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the test data (", test.description(), ") has columns ",
          ColumnNames(test), " but the training data has ", task.all.size(),
          "; both splits must have the same columns"));
    }
    for (size_t c = 0; c < task.all.size(); ++c) {
      ASSIGN_OR_RETURN(out.columns[c], find(task.all[c]));
    }
    return out;
  }
  ASSIGN_OR_RETURN(out.input_column, find(task.input));
  ASSIGN_OR_RETURN(out.target_column, find(task.target));
  // Checked now rather than at the first evaluation, hours in, on the one
  // rank whose share holds a bad value.
  if (task.type == TaskType::kClassification) {
    RETURN_IF_ERROR(CheckLabels(test, out));
  } else if (task.type == TaskType::kLanguageModel) {
    ASSIGN_OR_RETURN(const int64_t largest,
                     test.LargestValue(out.input_column));
    if (largest >= task.outputs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", largest, " in the test data (", test.description(),
          ") is outside the vocabulary of ", task.outputs,
          ": set model.vocab_size above the largest token id (unset, it is "
          "the largest id of the training and test tokens + 1)"));
    }
  }
  return out;
}

std::string TaskText(const Task& task) {
  switch (task.type) {
    case TaskType::kClassification: {
      std::string names;
      if (!task.target.classes.empty()) {
        const size_t shown = std::min<size_t>(task.target.classes.size(), 10);
        names = absl::StrCat(
            ": ",
            absl::StrJoin(task.target.classes.begin(),
                          task.target.classes.begin() + shown, ", ",
                          [](std::string* out, const std::string& name) {
                            out->append(TerminalSafe(name.substr(0, 40)));
                          }),
            task.target.classes.size() > shown ? ", ..." : "");
      }
      return absl::StrCat("classification of ", task.input.name, " ",
                          task.input.ShapeText(), " into ", task.outputs,
                          " classes (", task.target.name, names, ")");
    }
    case TaskType::kRegression:
      return absl::StrCat(
          "regression of ", task.target.name, " (", task.outputs, " value",
          task.outputs == 1 ? "" : "s", ") from ", task.input.name, " ",
          task.input.ShapeText(), ", ", task.regression_loss, " loss");
    case TaskType::kLanguageModel:
      return absl::StrCat("language model over ", task.outputs,
                          " token ids, windows of ", task.block);
    case TaskType::kCustom:
      return absl::StrCat("a training-step module's loss over ",
                          task.all.size(), " columns");
  }
  return "";
}

}  // namespace lockstep::worker
