// A generation's evaluation (training_generation.h): every test sample once
// (or a scheduled evaluation's fixed subset), the task's sums (or a
// training-step module's) all-reduced into metrics.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/sampler.h"
#include "worker/train/training_generation.h"

namespace lockstep::worker {
namespace {

// Samples per evaluation chunk. A chunk of 1000 CNN images made every
// convolution's buffers 8x a training batch's, out of cache and mapped
// afresh: evaluating Fashion-MNIST's 10,000 test images took 11 s on 2
// cores, 1 s in chunks of 256 (docs/BENCHMARKS.md).
constexpr int64_t kEvalBatch = 256;
// An evaluation chunk's outputs are kept near this many values.
constexpr int64_t kEvalOutputs = int64_t{1} << 24;

}  // namespace

absl::StatusOr<int64_t> TrainingGeneration::Evaluate(bool subset) {
  RETURN_IF_ERROR(AverageRunningStatistics(*counted_, *statistics_));
  torch::NoGradGuard no_grad;
  Network& model = *replica_.model;
  model.eval();
  // Every test sample once, whatever the world size: rank r takes its
  // contiguous share, no padding. A scheduled evaluation reads the first
  // eval_batches x global positions of a permutation of the split that
  // depends on the seed only: the same samples every time, on any world
  // size.
  const int64_t split = test_->size();
  int64_t n = split;
  std::optional<FeistelPermutation> order;
  if (subset && spec_.eval_batches() > 0) {
    n = std::min<int64_t>(split, int64_t{spec_.eval_batches()} * plan_.global);
    order.emplace(GlobalSampler::EpochOrder(~spec_.seed(), 0, split));
  }
  const int64_t begin = n * rank_ / world_;
  const int64_t end = n * (rank_ + 1) / world_;
  // Chunks whose outputs stay near kEvalOutputs values (a language model's
  // logits are windows x positions x vocabulary).
  const int64_t per_sample = std::max<int64_t>(
      1, learning_.outputs * std::max<int64_t>(1, learning_.block));
  int64_t chunk = std::clamp<int64_t>(kEvalOutputs / per_sample, 1, kEvalBatch);
  if (learning_.block > 0) {
    // A language model's activations (attention over every position) far
    // outweigh its logits: chunks of a few training batches, so that an
    // evaluation needs no more memory than training does.
    chunk =
        std::min(chunk, std::max<int64_t>(4 * int64_t{plan_.per_replica}, 1));
  }
  Batch batch = test_assembler_->NewBatch(chunk, {});
  std::vector<char> scratch;
  std::vector<int64_t> indices;
  const bool custom = learning_.type == TaskType::kCustom;
  const std::vector<std::string> custom_sums = model.EvalSums();
  std::vector<double> sums(
      custom ? custom_sums.size() + 2 : EvalSumCount(learning_), 0.0);
  for (int64_t i = begin; i < end; i += chunk) {
    const int64_t count = std::min(end, i + chunk) - i;
    indices.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
      indices[k] = order.has_value() ? (*order)(i + k) : i + k;
    }
    RETURN_IF_ERROR(test_assembler_->Fill(indices, batch, scratch));
    Batch part;
    for (const torch::Tensor& t : batch) {
      part.push_back(t.narrow(0, 0, count).to(device_));
    }
    if (custom) {
      RETURN_IF_ERROR(AddCustomSums(part, count, &sums));
      continue;
    }
    AddEvalSums(learning_,
                PrecisionLogits(model, part[0], spec_.precision(), device_),
                part[1], &sums);
  }
  model.train();
  // Each sum travels as two floats, its float value and what that leaves,
  // so a rank's sum keeps about 48 bits. The ranks' high parts are added in
  // float: a total past 2^24 (a language model's tokens) may be off by a
  // few units, about 1e-7 of it, not the whole remainder as before.
  const size_t n_sums = sums.size();
  std::vector<float> totals(2 * n_sums);
  for (size_t k = 0; k < n_sums; ++k) {
    totals[k] = static_cast<float>(sums[k]);
    totals[n_sums + k] = static_cast<float>(sums[k] - totals[k]);
  }
  RETURN_IF_ERROR(
      counted_->AllReduceSum(totals.data(), static_cast<int>(totals.size())));
  std::vector<double> reduced(n_sums);
  for (size_t k = 0; k < n_sums; ++k) {
    reduced[k] = static_cast<double>(totals[k]) + totals[n_sums + k];
  }
  const EvalMetrics metrics = custom ? CustomMetrics(custom_sums, reduced)
                                     : MetricsFromSums(learning_, reduced);
  replica_.last_accuracy = metrics.accuracy;
  replica_.last_test_loss = metrics.loss;
  replica_.last_metrics = metrics.metrics;
  return n;
}

absl::Status TrainingGeneration::AddCustomSums(const Batch& batch,
                                               int64_t count,
                                               std::vector<double>* sums) {
  NamedBatch named;
  for (size_t c = 0; c < batch.size(); ++c) {
    named.emplace_back(column_names_[c], batch[c]);
  }
  std::map<std::string, torch::Tensor> outputs;
  {
    Autocast autocast(spec_.precision(), device_);
    outputs = replica_.model->EvalStep(named);
  }
  const std::vector<std::string> names = replica_.model->EvalSums();
  auto loss = outputs.find("loss");
  if (loss == outputs.end() || loss->second.numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.torchscript ", spec_.model().torchscript(),
        " returned no scalar \"loss\" from its evaluation on rank ", rank_));
  }
  // The loss is the batch's mean: weighted by its samples.
  (*sums)[0] += loss->second.item<double>() * static_cast<double>(count);
  (*sums)[1] += static_cast<double>(count);
  for (size_t k = 0; k < names.size(); ++k) {
    auto it = outputs.find(names[k]);
    if (it == outputs.end() || it->second.numel() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.torchscript ", spec_.model().torchscript(),
                       "'s evaluation returned no scalar \"", names[k],
                       "\" for a batch on rank ", rank_,
                       "; it must return the same outputs for every batch"));
    }
    (*sums)[k + 2] += it->second.item<double>();
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
