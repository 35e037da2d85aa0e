// Workloads other than Fashion-MNIST's classifiers, trained by real
// coordinator and worker processes (`lockstep local`): a gpt language model
// on a Markov chain whose entropy rate is known, the same on 1, 2 and 4
// workers, and resumed from a checkpoint; the same data as TFRecord files,
// one .npy file and 7 shards; a 100-class classification and a regression.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The data tool (not a global: kBin is another file's).
std::string DataTool() { return kBin + "/lockstep-example-data"; }

// Writes a synthetic data set (examples/synthetic_data.cc) into a fresh
// folder; returns the folder and what the tool printed.
std::string MakeData(const std::string& name, std::vector<std::string> args,
                     std::string* printed = nullptr) {
  const std::string dir = TempDir(name);
  std::vector<std::string> argv = {DataTool(), args[0], dir};
  argv.insert(argv.end(), args.begin() + 1, args.end());
  Result made = RunCommand(argv);
  EXPECT_EQ(made.code, 0) << made.err;
  if (printed != nullptr) *printed = made.out;
  return dir;
}

// `lockstep local --json` with `sets` (field=value) over a base spec that
// trains nothing in particular; the JSON summary.
Result Local(int workers, const std::vector<std::string>& sets,
             const std::string& losses_csv = "") {
  std::vector<std::string> argv = {
      kBin + "/lockstep", "local", "--workers", absl::StrCat(workers),
      "--threads",        "1",     "--json"};
  for (const std::string& set : sets) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  if (!losses_csv.empty()) {
    argv.push_back("--metrics-out");
    argv.push_back(losses_csv);
  }
  argv.push_back(kMlp);
  return RunCommand(argv);
}

// A small gpt on the Markov chain's tokens (blocks of 16, global batch 64).
std::vector<std::string> MarkovLm(const std::string& dir) {
  return {"task.type=language_model",
          "model.name=gpt",
          "model.n_layer=1",
          "model.n_head=2",
          "model.n_embd=32",
          "data.format=tokens",
          "data.dir=" + dir,
          "data.block_size=16",
          "optimizer.type=adamw",
          "optimizer.weight_decay=0.01",
          "base_lr=0.003",
          "global_batch_size=64",
          "epochs=2"};
}

std::vector<std::string> With(std::vector<std::string> sets,
                              const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// The chain's next token is 1, 2 or 3 symbols ahead with probabilities 0.6,
// 0.3 and 0.1 whatever came before, so no model can do better than the
// entropy of that choice, 0.898 nats per token, and a model that learned the
// transitions reaches it. 300 steps of 64 x 16 tokens are enough for a
// one-block gpt; 0.05 nats is 20 times the sampling error of the 20,000
// validation tokens' mean loss (about 0.7 / sqrt(20,000) = 0.005).
TEST(WorkloadTest, LanguageModelOnAMarkovChainReachesItsEntropyRate) {
  std::string printed;
  const std::string dir = MakeData("markov", {"markov"}, &printed);
  double entropy = 0;
  ASSERT_TRUE(absl::SimpleAtod(printed.substr(printed.find(' ') + 1), &entropy))
      << printed;
  Result r = Local(2, With(MarkovLm(dir), {"max_steps=300", "lr_decay=cosine",
                                           "warmup_steps=20"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto f = LastJsonLine(r.out).fields();
  EXPECT_EQ(f.at("state").string_value(), "succeeded");
  const double loss = f.at("test_loss").number_value();
  EXPECT_NEAR(loss, entropy, 0.05)
      << "validation loss against the entropy rate";
  EXPECT_NEAR(f.at("test_perplexity").number_value(), std::exp(loss), 1e-6);
  EXPECT_GT(f.at("tokens_per_second").number_value(), 0);
  EXPECT_EQ(f.count("test_accuracy"), 0u);
  EXPECT_THAT(r.out + r.err, HasSubstr("tokens/s"));
}

// docs/DESIGN.md §4 for a transformer: 1x64, 2x32 and 4x16 follow one loss
// curve, like the image models.
TEST(WorkloadTest, GptGivesTheSameLossesOnOneTwoAndFourWorkers) {
  const std::string dir = MakeData("markov-equal", {"markov"});
  std::map<int, std::vector<double>> losses;
  for (int workers : {1, 2, 4}) {
    const std::string csv = absl::StrCat(dir, "/losses-", workers, ".csv");
    Result r = Local(workers, With(MarkovLm(dir), {"max_steps=30"}), csv);
    ASSERT_EQ(r.code, 0) << workers << " workers: " << r.err;
    losses[workers] = ReadLosses(csv);
    ASSERT_EQ(losses[workers].size(), 30u);
  }
  for (int workers : {2, 4}) {
    for (size_t i = 0; i < 30; ++i) {
      EXPECT_NEAR(losses[workers][i], losses[1][i], 1e-4 * losses[1][i])
          << workers << " workers, step " << i + 1;
    }
  }
  EXPECT_LT(losses[1].back(), losses[1].front());
}

// lockstep's fused attention (model.fused, the default) and LibTorch's
// unfused ops compute one function in two summation orders: 30 steps on 2
// workers follow one loss curve, and each repeats bit for bit.
TEST(WorkloadTest, GptFusedAndUnfusedAttentionFollowOneCurve) {
  const std::string dir = MakeData("markov-fused", {"markov"});
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, std::string> digests;
  for (const std::string fused : {"true", "false", "true"}) {
    const std::string csv = absl::StrCat(dir, "/losses-", fused, ".csv");
    Result r = Local(
        2, With(MarkovLm(dir), {"max_steps=30", "model.fused=" + fused}), csv);
    ASSERT_EQ(r.code, 0) << "model.fused " << fused << ": " << r.err;
    const std::string digest =
        LastJsonLine(r.out).fields().at("model_digest").string_value();
    if (digests.count(fused) > 0) {
      EXPECT_EQ(digest, digests[fused]) << "a repeat of model.fused " << fused;
    }
    digests[fused] = digest;
    losses[fused] = ReadLosses(csv);
    ASSERT_EQ(losses[fused].size(), 30u);
  }
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_NEAR(losses["true"][i], losses["false"][i],
                1e-4 * losses["false"][i])
        << "step " << i + 1;
  }
}

// A language-model job that ended at step 40 of an epoch of 195 steps,
// saving a checkpoint at step 20, then run again to step 60: it restores
// ckpt-000000020, mid-epoch, and ends with the model of a run that trained
// 60 steps without stopping (the sampler continues at the exact sample).
TEST(WorkloadTest, LanguageModelResumedFromACheckpointEndsWithTheSameModel) {
  const std::string dir = MakeData("markov-resume", {"markov"});
  const std::vector<std::string> lm = MarkovLm(dir);
  Result whole = Local(2, With(lm, {"max_steps=60"}));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const std::vector<std::string> checkpoints = {
      "checkpoint.backup_dir=" + dir + "/backups",
      "checkpoint.save_every_steps=20", "checkpoint.keep_backups=true"};
  Result part = Local(2, With(With(lm, checkpoints), {"max_steps=40"}));
  ASSERT_EQ(part.code, 0) << part.err;
  Result resumed = Local(2, With(With(lm, checkpoints), {"max_steps=60"}));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_THAT(resumed.out + resumed.err, HasSubstr("ckpt-000000020"));
  EXPECT_EQ(
      LastJsonLine(resumed.out).fields().at("model_digest").string_value(),
      LastJsonLine(whole.out).fields().at("model_digest").string_value());
}

// The same 100-class samples as TFRecord files, one .npy file per column
// and 7 shards per column train the same model bit for bit; and it learns
// the classes far beyond chance (1%): each class is a point in 32
// dimensions with noise of 0.7 per dimension, about 11 standard deviations
// between two classes' points, so an MLP separates them almost perfectly
// within 4 epochs; 0.5 leaves a wide margin.
TEST(WorkloadTest, TfRecordNpyAndShardsTrainTheSameHundredClassModel) {
  const std::map<std::string, std::string> dirs = {
      {"npy", MakeData("classes-npy", {"classes"})},
      {"shards", MakeData("classes-shards", {"classes", "--shards", "7"})},
      {"tfrecord", MakeData("classes-tfrecord", {"classes", "--tfrecord"})}};
  std::map<std::string, std::string> digests;
  for (const auto& [kind, dir] : dirs) {
    std::vector<std::string> sets = {"task.num_classes=100", "data.dir=" + dir,
                                     "optimizer.type=adam",
                                     "global_batch_size=64", "epochs=4"};
    if (kind == "tfrecord") {
      sets.insert(sets.end(),
                  {"data.format=tfrecord", "data.train=train-*.tfrecord",
                   "data.test=test-*.tfrecord",
                   R"(data.features={"x": {"dtype": "float32", "shape": [32]},)"
                   R"( "label": {"dtype": "int64", "shape": []}})"});
    } else {
      sets.push_back("data.format=npy");
    }
    Result r = Local(1, sets);
    ASSERT_EQ(r.code, 0) << kind << ": " << r.err;
    const auto f = LastJsonLine(r.out).fields();
    EXPECT_EQ(f.at("steps").number_value(), 400) << kind;
    EXPECT_GT(f.at("test_accuracy").number_value(), 0.5) << kind;
    EXPECT_GE(f.at("test_top5_accuracy").number_value(),
              f.at("test_accuracy").number_value())
        << kind;
    digests[kind] = f.at("model_digest").string_value();
  }
  EXPECT_EQ(digests["shards"], digests["npy"]);
  EXPECT_EQ(digests["tfrecord"], digests["npy"]);
}

// y = x W + noise (16 inputs, 4 targets, noise 0.1): predicting the mean
// scores an MSE near the targets' variance, about 1; a model that learned W
// scores near the noise's, 0.01. 0.1 is 10 times better than any constant.
TEST(WorkloadTest, RegressionLearnsALinearRule) {
  const std::string dir = MakeData("regression", {"regression"});
  Result r =
      Local(2, {"task.type=regression", "data.format=npy", "data.dir=" + dir,
                "optimizer.type=adam", "global_batch_size=64", "epochs=4"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto f = LastJsonLine(r.out).fields();
  EXPECT_EQ(f.at("state").string_value(), "succeeded");
  EXPECT_LT(f.at("test_mse").number_value(), 0.1);
  EXPECT_GT(f.at("test_mae").number_value(), 0);
  EXPECT_NEAR(f.at("test_loss").number_value(), f.at("test_mse").number_value(),
              1e-6);
  EXPECT_EQ(f.count("test_accuracy"), 0u);
}

// `lockstep data inspect` shows the columns; `lockstep data check` gives the
// error a worker would fail the job with, before anything is submitted.
TEST(WorkloadTest, DataInspectAndCheckSeeWhatAWorkerWouldSee) {
  const std::string dir = MakeData("classes-check", {"classes"});
  Result inspect = RunCommand({kBin + "/lockstep", "data", "inspect", dir});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_THAT(inspect.out,
              AllOf(HasSubstr("6400 samples"), HasSubstr("float32   [32]"),
                    HasSubstr("int64     []")));
  auto check = [&](const std::string& classes) {
    return RunCommand({kBin + "/lockstep", "data", "check", kMlp, "--set",
                       "data.format=npy", "--set", "data.dir=" + dir, "--set",
                       "task.num_classes=" + classes});
  };
  Result fits = check("100");
  EXPECT_EQ(fits.code, 0) << fits.err;
  EXPECT_THAT(fits.out, HasSubstr("into 100 classes"));
  Result misfit = check("10");
  EXPECT_EQ(misfit.code, 1);
  EXPECT_THAT(misfit.err, AllOf(HasSubstr("is outside [0, 10)"),
                                HasSubstr("task.num_classes")));
}

// A training-step module (task.type "custom") computes its own loss from the
// batch's columns and its own evaluation sums, which lockstep all-reduces:
// the example's margin loss learns the 100 classes far beyond chance (1%)
// in 4 epochs; 0.3 leaves a wide margin below what it reaches. The same
// module under another task type is refused, naming what to set.
TEST(WorkloadTest, ATrainingStepModuleTrainsWithItsOwnLossAndMetrics) {
  const std::string dir = MakeData("classes-step", {"classes"});
  const std::string module = dir + "/step.pt";
  Result made =
      RunCommand({kBin + "/lockstep-example-torchscript", "--step", module});
  ASSERT_EQ(made.code, 0) << made.err;
  const std::vector<std::string> sets = {
      "model.torchscript=" + module, "data.format=npy",      "data.dir=" + dir,
      "optimizer.type=adam",         "global_batch_size=64", "epochs=4"};
  Result r = Local(2, With(sets, {"task.type=custom"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto f = LastJsonLine(r.out).fields();
  EXPECT_EQ(f.at("state").string_value(), "succeeded");
  EXPECT_GT(f.at("test_accuracy").number_value(), 0.3);
  EXPECT_GT(f.at("test_loss").number_value(), 0);
  EXPECT_EQ(f.count("test_count"), 0u);  // the divisor, not a metric
  const auto& digests = f.at("rank_digests").list_value().values();
  ASSERT_EQ(digests.size(), 2);
  EXPECT_EQ(digests[0].string_value(), digests[1].string_value());

  Result refused = Local(
      1, With(sets, {"task.type=classification", "task.num_classes=100"}));
  EXPECT_NE(refused.code, 0);
  EXPECT_THAT(refused.out + refused.err,
              AllOf(HasSubstr("training-step module"),
                    HasSubstr("task.type \"custom\"")));
}

}  // namespace
}  // namespace lockstep::integration
