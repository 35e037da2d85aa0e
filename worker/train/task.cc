// The loss and the test metrics of each task (task.h).
#include "worker/train/task.h"

#include <algorithm>
#include <cmath>

namespace lockstep::worker {
namespace {

namespace F = torch::nn::functional;

}  // namespace

torch::Tensor TaskLoss(const Task& task, const torch::Tensor& outputs,
                       const torch::Tensor& targets) {
  switch (task.type) {
    case TaskType::kClassification:
      if (task.label_smoothing > 0) {
        return F::cross_entropy(
            outputs, targets,
            F::CrossEntropyFuncOptions().label_smoothing(task.label_smoothing));
      }
      return F::cross_entropy(outputs, targets);
    case TaskType::kRegression:
      if (task.regression_loss == "l1") return F::l1_loss(outputs, targets);
      if (task.regression_loss == "huber") {
        return F::huber_loss(outputs, targets);
      }
      return F::mse_loss(outputs, targets);
    case TaskType::kLanguageModel:
      return F::cross_entropy(outputs.reshape({-1, outputs.size(-1)}),
                              targets.reshape({-1}));
    case TaskType::kCustom:
      break;  // the module's own (Network::StepLoss)
  }
  return {};
}

int EvalSumCount(const Task& task) {
  return task.type == TaskType::kLanguageModel ? 2 : 4;
}

void AddEvalSums(const Task& task, const torch::Tensor& outputs,
                 const torch::Tensor& targets, std::vector<double>* sums) {
  std::vector<double>& s = *sums;
  switch (task.type) {
    case TaskType::kClassification: {
      s[0] +=
          F::cross_entropy(outputs, targets,
                           F::CrossEntropyFuncOptions().reduction(torch::kSum))
              .item<double>();
      s[1] += outputs.argmax(1).eq(targets).sum().item<double>();
      const int64_t k = std::min<int64_t>(5, outputs.size(1));
      s[2] += std::get<1>(outputs.topk(k, 1))
                  .eq(targets.unsqueeze(1))
                  .sum()
                  .item<double>();
      s[3] += static_cast<double>(outputs.size(0));
      break;
    }
    case TaskType::kRegression: {
      torch::Tensor loss =
          task.regression_loss == "l1"
              ? F::l1_loss(outputs, targets, F::L1LossFuncOptions(torch::kSum))
          : task.regression_loss == "huber"
              ? F::huber_loss(outputs, targets,
                              F::HuberLossFuncOptions().reduction(torch::kSum))
              : F::mse_loss(outputs, targets,
                            F::MSELossFuncOptions(torch::kSum));
      torch::Tensor error = outputs - targets;
      s[0] += loss.item<double>();
      s[1] += error.square().sum().item<double>();
      s[2] += error.abs().sum().item<double>();
      s[3] += static_cast<double>(error.numel());
      break;
    }
    case TaskType::kLanguageModel:
      s[0] +=
          F::cross_entropy(outputs.reshape({-1, outputs.size(-1)}),
                           targets.reshape({-1}),
                           F::CrossEntropyFuncOptions().reduction(torch::kSum))
              .item<double>();
      s[1] += static_cast<double>(targets.numel());
      break;
    case TaskType::kCustom:
      break;  // TrainingGeneration::AddCustomSums
  }
}

EvalMetrics MetricsFromSums(const Task& task, const std::vector<double>& s) {
  EvalMetrics out;
  switch (task.type) {
    case TaskType::kClassification:
      out.loss = s[0] / s[3];
      out.accuracy = s[1] / s[3];
      out.metrics["test_accuracy"] = out.accuracy;
      out.metrics["test_top5_accuracy"] = s[2] / s[3];
      break;
    case TaskType::kRegression:
      out.loss = s[0] / s[3];
      out.metrics["test_mse"] = s[1] / s[3];
      out.metrics["test_mae"] = s[2] / s[3];
      break;
    case TaskType::kLanguageModel:
      out.loss = s[0] / s[1];
      out.metrics["test_perplexity"] = std::exp(out.loss);
      break;
    case TaskType::kCustom:
      break;  // CustomMetrics
  }
  return out;
}

EvalMetrics CustomMetrics(const std::vector<std::string>& names,
                          const std::vector<double>& sums) {
  EvalMetrics out;
  const double samples = std::max(sums[1], 1.0);
  out.loss = sums[0] / samples;
  double per = samples;
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k] == "count" && sums[k + 2] > 0) per = sums[k + 2];
  }
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k] == "count") continue;
    out.metrics["test_" + names[k]] = sums[k + 2] / per;
  }
  auto accuracy = out.metrics.find("test_accuracy");
  if (accuracy != out.metrics.end()) out.accuracy = accuracy->second;
  return out;
}

}  // namespace lockstep::worker
