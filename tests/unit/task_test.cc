// A job's task resolved against its data: columns, shapes, output widths,
// normalization and the checks a wrong spec gets; the loss and metrics of
// each task from known inputs.
#include "worker/train/task.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/files.h"
#include "tests/unit/npy_bytes.h"
#include "worker/train/batch_assembler.h"

namespace lockstep::worker {
namespace {

using ::testing::HasSubstr;

class TaskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "task_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    spec_.mutable_data()->set_format("npy");
    spec_.mutable_data()->set_dir(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/" + name, bytes).ok());
  }
  absl::StatusOr<Task> Resolve() {
    auto split = OpenSplit(spec_.data(), true);
    if (!split.ok()) return split.status();
    split_ = *split;
    return ResolveTask(spec_, *split_);
  }

  std::string dir_;
  v1::JobSpec spec_;
  std::shared_ptr<const SplitSource> split_;
};

TEST_F(TaskTest, ClassificationTakesAnyNumberOfClassesAndChecksTheLabels) {
  Write("train_image.npy", Npy("|u1", "(4, 2, 2)", std::string(16, '\x10')));
  Write("train_label.npy", Npy("<i8", "(4,)", Int64s({0, 99, 42, 7})));
  spec_.mutable_task()->set_type("classification");
  spec_.mutable_task()->set_num_classes(100);
  auto task = Resolve();
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->outputs, 100);
  // [H, W] images have one channel.
  EXPECT_EQ(task->model_input, (std::vector<int64_t>{1, 2, 2}));
  spec_.mutable_task()->set_num_classes(10);
  task = Resolve();
  EXPECT_TRUE(absl::IsInvalidArgument(task.status()));
  EXPECT_THAT(task.status().message(), HasSubstr("label 99 of sample 1"));
  EXPECT_THAT(task.status().message(), HasSubstr("task.num_classes"));
}

TEST_F(TaskTest, FloatFeaturesAreNormalizedByTheirOwnStatistics) {
  Write("train_x.npy", Npy("<f4", "(2, 2)", Floats({1, 3, 5, 7})));
  Write("train_y.npy", Npy("<f4", "(2, 3)", Floats({1, 2, 3, 4, 5, 6})));
  spec_.mutable_task()->set_type("regression");
  auto task = Resolve();
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->outputs, 3);
  // mean 4, std sqrt(5): x -> (x - 4) / sqrt(5).
  EXPECT_NEAR(task->normalization.scale, 1 / std::sqrt(5.0f), 1e-6);
  EXPECT_NEAR(task->normalization.shift, 4 / std::sqrt(5.0f), 1e-6);
  const BatchAssembler assembler(split_, *task);
  torch::Tensor x = assembler.NewInputs(2, {});
  torch::Tensor y = assembler.NewTargets(2, {});
  std::vector<char> scratch;
  ASSERT_TRUE(assembler.Fill({1, 0}, x, y, scratch).ok());
  EXPECT_NEAR(x[0][1].item<float>(), 3 / std::sqrt(5.0f), 1e-6);
  EXPECT_EQ(y[0][2].item<float>(), 6);
  // Statistics given in the spec win.
  v1::ColumnSpec given;
  given.set_mean(1);
  given.set_std(2);
  (*spec_.mutable_data()->mutable_features())["x"] = given;
  task = Resolve();
  ASSERT_TRUE(task.ok());
  EXPECT_EQ(task->normalization.scale, 0.5f);
  EXPECT_EQ(task->normalization.shift, 0.5f);
}

// Issue 54: torchvision's Normalize after ToTensor, per channel of
// channels-first pixels: (x / 255 - mean_c) / std_c.
TEST_F(TaskTest, PixelsAreNormalizedPerChannelAsTorchvisionDoes) {
  // Two samples of [3, 1, 2] pixels; channel c holds 51 * (c + 1).
  std::string pixels;
  for (int sample = 0; sample < 2; ++sample) {
    for (int c = 0; c < 3; ++c)
      pixels.append(2, static_cast<char>(51 * (c + 1)));
  }
  Write("train_image.npy", Npy("|u1", "(2, 3, 1, 2)", pixels));
  Write("train_label.npy", Npy("<i8", "(2,)", Int64s({0, 1})));
  spec_.mutable_task()->set_type("classification");
  spec_.mutable_task()->set_num_classes(2);
  v1::ColumnSpec given;
  for (double mean : {0.485, 0.456, 0.406}) given.add_channel_mean(mean);
  for (double std : {0.229, 0.224, 0.225}) given.add_channel_std(std);
  (*spec_.mutable_data()->mutable_features())["image"] = given;
  auto task = Resolve();
  ASSERT_TRUE(task.ok()) << task.status();
  const BatchAssembler assembler(split_, *task);
  torch::Tensor x = assembler.NewInputs(1, {});
  torch::Tensor y = assembler.NewTargets(1, {});
  std::vector<char> scratch;
  ASSERT_TRUE(assembler.Fill({1}, x, y, scratch).ok());
  const double means[] = {0.485, 0.456, 0.406}, stds[] = {0.229, 0.224, 0.225};
  for (int c = 0; c < 3; ++c) {
    const double expected = (51.0 * (c + 1) / 255.0 - means[c]) / stds[c];
    EXPECT_NEAR(x[0][c][0][1].item<float>(), expected, 1e-5) << c;
  }
  // One mean and std per channel, or the job is refused naming the shape.
  given.add_channel_mean(0.5);
  given.add_channel_std(0.5);
  (*spec_.mutable_data()->mutable_features())["image"] = given;
  EXPECT_THAT(Resolve().status().message(),
              HasSubstr("gives 4 channel means and stds, but the input is "
                        "[3, 1, 2]"));
}

TEST_F(TaskTest, AMissingColumnNamesTheColumnsThereAre) {
  Write("train_features.npy", Npy("<f4", "(1,)", Floats({1})));
  auto task = Resolve();
  EXPECT_TRUE(absl::IsInvalidArgument(task.status()));
  EXPECT_THAT(task.status().message(), HasSubstr("features (float32 [])"));
  EXPECT_THAT(task.status().message(), HasSubstr("set task.input"));
}

TEST_F(TaskTest, LanguageModelsTakeTheVocabularyFromTheTokens) {
  const std::vector<uint16_t> tokens = {1, 2, 3, 4, 5, 41, 6};
  Write("train.bin",
        std::string(reinterpret_cast<const char*>(tokens.data()), 14));
  spec_.mutable_data()->set_format("tokens");
  spec_.mutable_data()->set_token_dtype("uint16");
  spec_.mutable_data()->set_block_size(2);
  spec_.mutable_data()->set_window_stride(2);
  spec_.mutable_task()->set_type("language_model");
  auto task = Resolve();
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->outputs, 42);
  EXPECT_EQ(task->block, 2);
  EXPECT_TRUE(task->token_input);
  const BatchAssembler assembler(split_, *task);
  torch::Tensor x = assembler.NewInputs(1, {});
  torch::Tensor y = assembler.NewTargets(1, {});
  std::vector<char> scratch;
  ASSERT_TRUE(assembler.Fill({2}, x, y, scratch).ok());  // tokens 5, 41, 6
  EXPECT_EQ(x[0][1].item<int64_t>(), 41);
  EXPECT_EQ(y[0][1].item<int64_t>(), 6);
  // A vocabulary given too small: the batch holding 41 fails, naming it.
  task->outputs = 41;
  const BatchAssembler small(split_, *task);
  absl::Status filled = small.Fill({2}, x, y, scratch);
  EXPECT_THAT(filled.message(), HasSubstr("token id 41 of sample 2"));
}

// The test split's columns are found by name: an extra column that comes
// first in its order does not shift them; a bad label there fails now.
TEST_F(TaskTest, TheTestSplitsColumnsAreItsOwnByName) {
  Write("train_x.npy", Npy("<f4", "(2, 2)", Floats({1, 3, 5, 7})));
  Write("train_y.npy", Npy("<i8", "(2,)", Int64s({0, 1})));
  Write("test_a.npy", Npy("<f4", "(2, 8)", Floats(std::vector<float>(16, 9))));
  Write("test_x.npy", Npy("<f4", "(2, 2)", Floats({2, 4, 6, 8})));
  Write("test_y.npy", Npy("<i8", "(2,)", Int64s({1, 0})));
  spec_.mutable_task()->set_num_classes(2);
  auto task = Resolve();
  ASSERT_TRUE(task.ok()) << task.status();
  auto test = OpenSplit(spec_.data(), false);
  ASSERT_TRUE(test.ok()) << test.status();
  auto for_test = TaskForTest(*task, **test);
  ASSERT_TRUE(for_test.ok()) << for_test.status();
  EXPECT_EQ((*test)->columns()[for_test->input_column].name, "x");
  const BatchAssembler assembler(*test, *for_test);
  torch::Tensor x = assembler.NewInputs(2, {});
  torch::Tensor y = assembler.NewTargets(2, {});
  std::vector<char> scratch;
  ASSERT_TRUE(assembler.Fill({1}, x, y, scratch).ok());
  EXPECT_EQ(y[0].item<int64_t>(), 0);
  Write("test_y.npy", Npy("<i8", "(2,)", Int64s({1, 5})));
  test = OpenSplit(spec_.data(), false);
  ASSERT_TRUE(test.ok());
  EXPECT_THAT(TaskForTest(*task, **test).status().message(),
              HasSubstr("label 5 of sample 1"));
}

TEST_F(TaskTest, AVocabularyFromTheDataIsBounded) {
  const std::vector<uint32_t> tokens = {1, 2, 0xFFFFFFFFu, 4, 5};
  Write("train.bin",
        std::string(reinterpret_cast<const char*>(tokens.data()), 20));
  spec_.mutable_data()->set_format("tokens");
  spec_.mutable_data()->set_token_dtype("uint32");
  spec_.mutable_data()->set_block_size(2);
  spec_.mutable_data()->set_window_stride(2);
  spec_.mutable_task()->set_type("language_model");
  auto task = Resolve();
  EXPECT_TRUE(absl::IsInvalidArgument(task.status()));
  EXPECT_THAT(task.status().message(), HasSubstr("set model.vocab_size"));
}

TEST(TaskMetricsTest, SumsBecomeTheSameMetricsHoweverTheyAreSplit) {
  Task task;
  task.type = TaskType::kClassification;
  task.outputs = 6;
  torch::Tensor logits = torch::tensor(std::vector<float>{5, 4, 3, 2, 1, 0,  //
                                                          0, 1, 2, 3, 4, 5,  //
                                                          0, 0, 9, 0, 0, 0})
                             .view({3, 6});
  torch::Tensor labels = torch::tensor(std::vector<int64_t>{0, 0, 2});
  std::vector<double> whole(EvalSumCount(task), 0.0);
  AddEvalSums(task, logits, labels, &whole);
  std::vector<double> parts(EvalSumCount(task), 0.0);
  AddEvalSums(task, logits.narrow(0, 0, 1), labels.narrow(0, 0, 1), &parts);
  AddEvalSums(task, logits.narrow(0, 1, 2), labels.narrow(0, 1, 2), &parts);
  const EvalMetrics a = MetricsFromSums(task, whole);
  const EvalMetrics b = MetricsFromSums(task, parts);
  EXPECT_NEAR(a.accuracy, 2.0 / 3, 1e-12);
  // Sample 1's label is its 6th choice: outside the top 5.
  EXPECT_NEAR(a.metrics.at("test_top5_accuracy"), 2.0 / 3, 1e-12);
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
  EXPECT_NEAR(a.loss, TaskLoss(task, logits, labels).item<double>(), 1e-6);

  task.type = TaskType::kRegression;
  task.regression_loss = "mse";
  std::vector<double> sums(EvalSumCount(task), 0.0);
  AddEvalSums(task, torch::tensor(std::vector<float>{1, 2}).view({1, 2}),
              torch::tensor(std::vector<float>{0, 4}).view({1, 2}), &sums);
  const EvalMetrics r = MetricsFromSums(task, sums);
  EXPECT_NEAR(r.metrics.at("test_mse"), 2.5, 1e-9);
  EXPECT_NEAR(r.metrics.at("test_mae"), 1.5, 1e-9);
  EXPECT_NEAR(r.loss, 2.5, 1e-9);

  task.type = TaskType::kLanguageModel;
  std::vector<double> lm(EvalSumCount(task), 0.0);
  // Uniform logits over 4 ids: loss ln 4, perplexity 4.
  AddEvalSums(task, torch::zeros({2, 3, 4}),
              torch::zeros({2, 3}, torch::kInt64), &lm);
  const EvalMetrics l = MetricsFromSums(task, lm);
  EXPECT_NEAR(l.loss, std::log(4.0), 1e-6);
  EXPECT_NEAR(l.metrics.at("test_perplexity"), 4, 1e-5);
}

}  // namespace
}  // namespace lockstep::worker
