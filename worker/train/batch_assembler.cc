// Samples to batch tensors (batch_assembler.h).
#include "worker/train/batch_assembler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lockstep::worker {

BatchAssembler::BatchAssembler(std::shared_ptr<const SplitSource> source,
                               const Task& task)
    : source_(std::move(source)), task_(task) {}

torch::Tensor BatchAssembler::NewInputs(
    int64_t n, const torch::TensorOptions& options) const {
  std::vector<int64_t> shape = {n};
  shape.insert(shape.end(), task_.model_input.begin(), task_.model_input.end());
  return torch::empty(
      shape,
      options.dtype(task_.token_input ? torch::kInt64 : torch::kFloat32));
}

torch::Tensor BatchAssembler::NewTargets(
    int64_t n, const torch::TensorOptions& options) const {
  switch (task_.type) {
    case TaskType::kClassification:
      return torch::empty({n}, options.dtype(torch::kInt64));
    case TaskType::kRegression:
      return torch::empty({n, task_.outputs}, options.dtype(torch::kFloat32));
    case TaskType::kLanguageModel:
      return torch::empty({n, task_.block}, options.dtype(torch::kInt64));
    case TaskType::kCustom:
      break;
  }
  return {};
}

Batch BatchAssembler::NewBatch(int64_t n,
                               const torch::TensorOptions& options) const {
  if (task_.type != TaskType::kCustom) {
    return {NewInputs(n, options), NewTargets(n, options)};
  }
  Batch batch;
  for (const ColumnInfo& column : task_.all) {
    std::vector<int64_t> shape = {n};
    shape.insert(shape.end(), column.shape.begin(), column.shape.end());
    batch.push_back(torch::empty(
        shape, options.dtype(IsFloat(column.dtype) ? torch::kFloat32
                                                   : torch::kInt64)));
  }
  return batch;
}

std::vector<std::string> BatchAssembler::names() const {
  std::vector<std::string> names;
  for (const ColumnInfo& column : task_.all) names.push_back(column.name);
  return names;
}

absl::Status BatchAssembler::Fill(absl::Span<const int64_t> indices,
                                  Batch& batch, std::vector<char>& scratch,
                                  uint64_t epoch_key) const {
  if (task_.type != TaskType::kCustom) {
    return Fill(indices, batch[0], batch[1], scratch, epoch_key);
  }
  const int64_t n = static_cast<int64_t>(indices.size());
  for (size_t c = 0; c < task_.all.size(); ++c) {
    const ColumnInfo& column = task_.all[c];
    scratch.resize(static_cast<size_t>(n * column.sample_bytes()));
    char* out = scratch.data();
    RETURN_IF_ERROR(
        source_->ReadInEpoch(epoch_key, {task_.columns[c]}, indices, {out}));
    const int64_t total = n * column.elements();
    if (IsFloat(column.dtype)) {
      float* out = batch[c].data_ptr<float>();
      for (int64_t j = 0; j < total; ++j) {
        out[j] = ElementAsFloat(column.dtype, scratch.data(), j);
      }
    } else {
      int64_t* out = batch[c].data_ptr<int64_t>();
      for (int64_t j = 0; j < total; ++j) {
        out[j] = ElementAsInt(column.dtype, scratch.data(), j);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BatchAssembler::OutOfRange(const char* what, int64_t value,
                                        int64_t index) const {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " ", value, " of sample ", index, " in ", source_->description(),
      " is outside [0, ", task_.outputs, "): ",
      task_.type == TaskType::kLanguageModel
          ? "set model.vocab_size above the largest token id (unset, it "
            "is the largest id of the training and test tokens + 1)"
          : "set task.num_classes to the number of classes"));
}

absl::Status BatchAssembler::Fill(absl::Span<const int64_t> indices,
                                  torch::Tensor& inputs, torch::Tensor& targets,
                                  std::vector<char>& scratch,
                                  uint64_t epoch_key) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  const ColumnInfo& in = task_.input;
  const int64_t in_elements = in.elements();
  if (task_.type == TaskType::kLanguageModel) {
    scratch.resize(static_cast<size_t>(n * in.sample_bytes()));
    char* out = scratch.data();
    RETURN_IF_ERROR(
        source_->ReadInEpoch(epoch_key, {task_.input_column}, indices, {out}));
    int64_t* x = inputs.data_ptr<int64_t>();
    int64_t* y = targets.data_ptr<int64_t>();
    const int64_t block = task_.block;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t <= block; ++t) {
        const int64_t id =
            ElementAsInt(in.dtype, scratch.data(), i * (block + 1) + t);
        if (id < 0 || id >= task_.outputs) {
          return OutOfRange("token id", id, indices[i]);
        }
        if (t < block) x[i * block + t] = id;
        if (t > 0) y[i * block + t - 1] = id;
      }
    }
    return absl::OkStatus();
  }
  const ColumnInfo& out = task_.target;
  const int64_t in_bytes = n * in.sample_bytes();
  scratch.resize(static_cast<size_t>(in_bytes + n * out.sample_bytes()));
  char* raw_in = scratch.data();
  char* raw_out = scratch.data() + in_bytes;
  RETURN_IF_ERROR(
      source_->ReadInEpoch(epoch_key, {task_.input_column, task_.target_column},
                           indices, {raw_in, raw_out}));
  float* x = inputs.data_ptr<float>();
  const float scale = task_.normalization.scale;
  const float shift = task_.normalization.shift;
  const int64_t total = n * in_elements;
  const std::vector<float>& scales = task_.normalization.scales;
  const std::vector<float>& shifts = task_.normalization.shifts;
  if (!scales.empty()) {
    for (int64_t j = 0; j < total; ++j) {
      const int64_t e = j % in_elements;
      x[j] = ElementAsFloat(in.dtype, raw_in, j) * scales[e] - shifts[e];
    }
  } else if (in.dtype == Dtype::kUInt8) {
    const auto* p = reinterpret_cast<const uint8_t*>(raw_in);
    for (int64_t j = 0; j < total; ++j) x[j] = p[j] * scale - shift;
  } else {
    for (int64_t j = 0; j < total; ++j) {
      x[j] = ElementAsFloat(in.dtype, raw_in, j) * scale - shift;
    }
  }
  if (task_.type == TaskType::kClassification) {
    int64_t* y = targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = ElementAsInt(out.dtype, raw_out, i);
      if (label < 0 || label >= task_.outputs) {
        return OutOfRange("label", label, indices[i]);
      }
      y[i] = label;
    }
  } else {
    float* y = targets.data_ptr<float>();
    const int64_t values = n * task_.outputs;
    for (int64_t j = 0; j < values; ++j) {
      y[j] = ElementAsFloat(out.dtype, raw_out, j);
    }
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
