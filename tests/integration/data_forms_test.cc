// Data in the forms people store it, trained by real coordinator and worker
// processes: token shards train exactly like one file; a worker's own
// memory does not grow with a token file (the global shuffle holds no
// table); ImageNet-style TFRecords of JPEG and PNG images written by
// Pillow decode to Pillow's pixels and train, and a corrupt JPEG is named;
// damaged records are skipped when allowed, alike on 1 and 2 workers; a
// CSV of float64 trains the model float32 .npy arrays of the same values
// train; a language model evaluates on a schedule and `lockstep compare`
// draws the evaluations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"
#include "worker/data/npy.h"
#include "worker/data/split_source.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string DataTool() { return kBin + "/lockstep-example-data"; }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void Spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// `lockstep local --json` over the MLP example with `sets`.
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
    argv.insert(argv.end(), {"--metrics-out", losses_csv});
  }
  argv.push_back(kMlp);
  return RunCommand(argv);
}

std::vector<std::string> With(std::vector<std::string> sets,
                              const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// 3 epochs of the MLP at global batch 64 on write_image_records.py's
// folder `dir`: images 32x32x3 from image/encoded with `augment` (JSON
// members), labels from image/class/label.
std::vector<std::string> ImageRecordsJob(const std::string& dir,
                                         const std::string& augment) {
  return {"data.format=tfrecord",
          "data.dir=" + dir,
          "data.train=train-*",
          "data.test=validation-*",
          absl::StrCat(R"(data.features={"image": {"from": "image/encoded",)",
                       R"( "encoding": "auto", "dtype": "uint8",)",
                       R"( "shape": [32, 32, 3], )", augment,
                       R"(}, "label": {"from": "image/class/label",)",
                       R"( "dtype": "int64", "shape": []}})"),
          "global_batch_size=64",
          "epochs=3"};
}

// Two runs' losses step by step, equal up to the sum order of 1 and 2
// replicas.
void ExpectSameLosses(const std::vector<double>& one,
                      const std::vector<double>& two) {
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(two[i], one[i], 1e-4 * one[i] + 1e-6) << i;
  }
}

// A one-block gpt on windows of 16 tokens.
std::vector<std::string> TinyLm(const std::string& dir) {
  return {"task.type=language_model", "model.name=gpt",
          "model.n_layer=1",          "model.n_head=2",
          "model.n_embd=32",          "data.format=tokens",
          "data.dir=" + dir,          "data.block_size=16",
          "optimizer.type=adamw",     "base_lr=0.003",
          "global_batch_size=64"};
}

// The Markov chain's train.bin cut into 3 shards at window boundaries
// (windows of 17 tokens that do not overlap, window_stride 17) trains the
// model the one file trains, bit for bit.
TEST(DataFormsTest, TokenShardsTrainExactlyLikeOneFile) {
  const std::string dir = TempDir("token-shards");
  Result made = RunCommand({DataTool(), "markov", dir});
  ASSERT_EQ(made.code, 0) << made.err;
  const std::string train = Slurp(dir + "/train.bin");
  const size_t window = 17 * 2;  // bytes of one uint16 window
  const size_t windows = train.size() / window;
  const std::string shards = dir + "/shards";
  ASSERT_EQ(mkdir(shards.c_str(), 0755), 0);
  size_t begin = 0;
  for (int s = 0; s < 3; ++s) {
    const size_t end = s == 2 ? train.size() : (windows * (s + 1) / 3) * window;
    Spill(absl::StrCat(shards, "/train-", s, ".bin"),
          train.substr(begin, end - begin));
    begin = end;
  }
  Spill(shards + "/val-0.bin", Slurp(dir + "/val.bin"));
  Result inspect = RunCommand({kBin + "/lockstep", "data", "inspect", shards});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_THAT(inspect.out,
              AllOf(HasSubstr("train-1.bin: "),
                    HasSubstr("uint16 tokens, vocabulary seen"),
                    HasSubstr("4 token shards"), HasSubstr("in no window"),
                    HasSubstr("concatenated (data.concatenate): ")));
  const std::vector<std::string> lm =
      With(TinyLm(dir), {"data.window_stride=17", "max_steps=25"});
  Result one = Local(1, lm);
  ASSERT_EQ(one.code, 0) << one.err;
  Result sharded =
      Local(1, With(lm, {"data.dir=" + shards, "data.train=train-*.bin",
                         "data.test=val-*.bin"}));
  ASSERT_EQ(sharded.code, 0) << sharded.err;
  EXPECT_EQ(
      LastJsonLine(sharded.out).fields().at("model_digest").string_value(),
      LastJsonLine(one.out).fields().at("model_digest").string_value());
  // Concatenated (issue 54), the shards are train.bin again: the same
  // windows, the same model.
  Result joined =
      Local(1, With(lm, {"data.dir=" + shards, "data.train=train-*.bin",
                         "data.test=val-*.bin", "data.concatenate=true"}));
  ASSERT_EQ(joined.code, 0) << joined.err;
  EXPECT_EQ(LastJsonLine(joined.out).fields().at("model_digest").string_value(),
            LastJsonLine(one.out).fields().at("model_digest").string_value());
  // Random window offsets are a function of (seed, epoch) only: the same
  // losses on 1 and 2 workers.
  std::map<int, std::vector<double>> losses;
  for (int workers : {1, 2}) {
    const std::string csv = absl::StrCat(dir, "/offset-", workers, ".csv");
    Result r = Local(
        workers,
        With(TinyLm(dir), {"data.window_offset=random", "max_steps=20"}), csv);
    ASSERT_EQ(r.code, 0) << r.err;
    losses[workers] = ReadLosses(csv);
  }
  ASSERT_EQ(losses[1].size(), 20u);
  ASSERT_EQ(losses[2].size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_NEAR(losses[2][i], losses[1][i], 1e-4 * losses[1][i]) << i;
  }
}

class TokenMemoryTest : public ClusterTest {};

// Each worker's anonymous memory before its first step and at the end, as
// it logs them (MiB), for a job on a token file of `windows` windows.
std::vector<int64_t> AnonymousMemory(const std::string& logs) {
  std::vector<int64_t> mib;
  static const std::regex kLine("anonymous memory (\\d+) MiB");
  for (std::sregex_iterator it(logs.begin(), logs.end(), kLine), end; it != end;
       ++it) {
    mib.push_back(std::stoll((*it)[1]));
  }
  return mib;
}

// The default shuffle costs no memory per sample: a worker training on a
// token file of 16 M windows holds what it holds on one of 1 M (before
// the first step and at the end, within 10%), where a table of the
// permutation alone would be 128 MiB. docs/BENCHMARKS.md has the 100 M
// windows run in a 1 GiB cgroup.
TEST_F(TokenMemoryTest, AWorkersMemoryDoesNotGrowWithTheTokenFile) {
  std::map<int64_t, std::vector<int64_t>> memory;
  for (int64_t windows : {int64_t{1} << 20, int64_t{16} << 20}) {
    const std::string dir = TempDir(absl::StrCat("token-memory-", windows));
    std::string tokens(static_cast<size_t>(windows + 16) * 2, '\0');
    for (size_t i = 0; i < tokens.size(); i += 2) {
      tokens[i] = static_cast<char>((i / 2 * 7 + i / 14) % 61);
    }
    Spill(dir + "/train.bin", tokens);
    Spill(dir + "/val.bin", tokens.substr(0, 4096));
    StartCluster(2);
    const std::string job =
        Submit(With(TinyLm(dir), {"data.window_stride=1", "model.vocab_size=64",
                                  "max_steps=10", "num_workers=2"}));
    const v1::JobStatus done = WatchUntil(job, Ended);
    ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(job);
    std::string logs;
    for (int n = 1; n <= spawned_; ++n) {
      for (int w = 0; w < 2; ++w) {
        logs += Slurp(absl::StrCat(dir_, "/worker-", w, "-", n, ".log"));
      }
    }
    memory[windows] = AnonymousMemory(logs);
    ASSERT_EQ(memory[windows].size(), 4u) << logs;
    TearDown();
  }
  const std::vector<int64_t>& small = memory[int64_t{1} << 20];
  const std::vector<int64_t>& large = memory[int64_t{16} << 20];
  for (size_t i = 0; i < 4; ++i) {
    std::printf("worker memory (MiB): %lld with 1 M windows, %lld with 16 M\n",
                static_cast<long long>(small[i]),
                static_cast<long long>(large[i]));
    EXPECT_LE(large[i], small[i] * 11 / 10) << i;
  }
}

// The JPEG (and PNG) TFRecords Pillow wrote: `lockstep data inspect` sees
// the images, the first records decode to Pillow's pixels exactly, a
// 10-class MLP learns them with random crops and flips, the same on 1 and
// 2 workers; the CNN and the ResNet train on them (channels first); and a
// truncated JPEG fails the job naming its file and record.
TEST(DataFormsTest, PillowsJpegRecordsDecodeExactlyAndTrain) {
  const std::string dir = TempDir("jpeg-records");
  Result made = RunCommand({"/usr/bin/python3",
                            kSource + "/tests/scripts/write_image_records.py",
                            dir, "--train", "1200", "--test", "300"});
  ASSERT_EQ(made.code, 0) << made.err << " (needs python3-pil and numpy)";

  Result inspect = RunCommand(
      {kBin + "/lockstep", "data", "inspect", dir + "/train-00000-of-00002"});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_THAT(inspect.out,
              AllOf(HasSubstr("600 records"),
                    HasSubstr("JPEG image 36x36 (width x height), 3 channels"),
                    HasSubstr("image/object/bbox/xmin: float_list")));

  // Pillow's decode of the first 16 records against lockstep's.
  v1::DataSpec spec;
  spec.set_format("tfrecord");
  spec.set_dir(dir);
  spec.set_train("train-*");
  spec.set_test("validation-*");
  v1::ColumnSpec& image = (*spec.mutable_features())["image"];
  image.set_from("image/encoded");
  image.set_encoding("auto");
  image.set_dtype("uint8");
  for (int d : {36, 36, 3}) image.add_shape(d);
  v1::ColumnSpec& label = (*spec.mutable_features())["label"];
  label.set_from("image/class/label");
  label.set_dtype("int64");
  v1::ColumnSpec& boxes = (*spec.mutable_features())["boxes"];
  boxes.set_from("image/object/bbox/xmin");
  boxes.set_dtype("float32");
  boxes.set_max_len(8);
  boxes.set_optional(true);
  auto split = worker::OpenSplit(spec, /*train=*/true);
  ASSERT_TRUE(split.ok()) << split.status();
  auto expected = worker::ReadNpy(dir + "/pillow_decoded.npy");
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->shape, (std::vector<int64_t>{16, 36, 36, 3}));
  std::vector<int64_t> first(16);
  for (int i = 0; i < 16; ++i) first[i] = i;
  std::string pixels(16 * 36 * 36 * 3, '\0');
  ASSERT_TRUE(
      (*split)->ReadColumn((*split)->Find("image"), first, pixels.data()).ok());
  for (int i = 0; i < 16; ++i) {
    // Pillow's [H, W, C] against lockstep's channels-first [C, H, W].
    const size_t plane = 36 * 36, size = plane * 3;
    int differ = 0, largest = 0;
    for (size_t p = 0; p < plane; ++p) {
      for (size_t c = 0; c < 3; ++c) {
        const int d = std::abs(
            int{static_cast<uint8_t>(pixels[i * size + c * plane + p])} -
            int{static_cast<uint8_t>(expected->data[i * size + p * 3 + c])});
        differ += d != 0;
        largest = std::max(largest, d);
      }
    }
    EXPECT_EQ(differ, 0) << "record " << i << ": " << differ
                         << " values differ from Pillow's, by up to "
                         << largest;
  }

  const std::vector<std::string> job =
      With(ImageRecordsJob(dir, R"("random_crop": true, "random_flip": true)"),
           {"optimizer.type=adam"});
  std::map<int, std::vector<double>> losses;
  for (int workers : {1, 2}) {
    const std::string csv = absl::StrCat(dir, "/losses-", workers, ".csv");
    Result r = Local(workers, job, csv);
    ASSERT_EQ(r.code, 0) << r.err;
    losses[workers] = ReadLosses(csv);
    if (workers == 2) {
      EXPECT_GT(LastJsonLine(r.out).fields().at("test_accuracy").number_value(),
                0.5);
    }
  }
  ExpectSameLosses(losses[1], losses[2]);

  // The convolutional models take the decoded images as they are (issue
  // 54: they were [H, W, C], which cnn and resnet refused): the cnn with
  // the README's features (resized, cropped, flipped), the resnet with
  // torchvision's ImageNet pipeline (RandomResizedCrop, PIL's resize,
  // Normalize per channel).
  const std::pair<const char*, const char*> convs[] = {
      {"cnn", R"(data.features={"image": {"from": "image/encoded",)"
              R"( "encoding": "auto", "dtype": "uint8",)"
              R"( "shape": [32, 32, 3], "resize": [40, 40],)"
              R"( "random_crop": true, "random_flip": true},)"
              R"( "label": {"from": "image/class/label",)"
              R"( "dtype": "int64", "shape": []}})"},
      {"resnet",
       R"(data.features={"image": {"from": "image/encoded",)"
       R"( "encoding": "auto", "dtype": "uint8",)"
       R"( "shape": [32, 32, 3], "resize": [36, 36],)"
       R"( "resize_filter": "antialias", "random_resized_crop": {},)"
       R"( "random_flip": true, "channel_mean": [0.485, 0.456, 0.406],)"
       R"( "channel_std": [0.229, 0.224, 0.225]},)"
       R"( "label": {"from": "image/class/label",)"
       R"( "dtype": "int64", "shape": []}})"}};
  for (const auto& [model, features] : convs) {
    Result conv = Local(2, With(job, {absl::StrCat("model.name=", model),
                                      "max_steps=10", features}));
    EXPECT_EQ(conv.code, 0) << model << ": " << conv.err;
  }

  Result corrupt = RunCommand(
      {kBin + "/lockstep", "data", "check", kMlp, "--set",
       "data.format=tfrecord", "--set", "data.dir=" + dir, "--set",
       "data.train=corrupt-*", "--set", "data.test=corrupt-*", "--set",
       R"(data.features={"image": {"from": "image/encoded", "encoding": "jpeg",)"
       R"( "dtype": "uint8", "shape": [32, 32, 3]}, "label": {"from":)"
       R"( "image/class/label", "dtype": "int64", "shape": []}})"});
  EXPECT_EQ(corrupt.code, 1);
  EXPECT_THAT(corrupt.err, AllOf(HasSubstr("corrupt-00000-of-00001 record 1"),
                                 HasSubstr("corrupt JPEG")));
}

// The byte offsets of the records of a plain TFRecord file.
std::vector<size_t> RecordOffsets(const std::string& bytes) {
  std::vector<size_t> offsets;
  for (size_t at = 0; at + 12 <= bytes.size();) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);  // little-endian hosts
    offsets.push_back(at);
    at += 16 + length;
  }
  return offsets;
}

// data.skip_corrupt (issue 54): three damaged records of ImageNet-style
// shards (a data CRC, a length CRC, a JPEG cut short) are skipped, counted
// once each, and 1 and 2 workers train the same samples; one fewer
// allowed fails the job naming the limit, and by default the first damage
// fails it.
TEST(DataFormsTest, DamagedRecordsAreSkippedAlikeOnAnyNumberOfWorkers) {
  const std::string made_dir = TempDir("damaged-made");
  Result made = RunCommand({"/usr/bin/python3",
                            kSource + "/tests/scripts/write_image_records.py",
                            made_dir, "--train", "400", "--test", "100"});
  ASSERT_EQ(made.code, 0) << made.err << " (needs python3-pil and numpy)";
  const std::string dir = TempDir("damaged");
  std::string first = Slurp(made_dir + "/train-00000-of-00002");
  std::string second = Slurp(made_dir + "/train-00001-of-00002");
  const std::vector<size_t> in_first = RecordOffsets(first);
  const std::vector<size_t> in_second = RecordOffsets(second);
  ASSERT_EQ(in_first.size(), 200u);
  ASSERT_EQ(in_second.size(), 200u);
  first[in_first[5] + 40] ^= 0x10;    // record 5's data
  second[in_second[10] + 9] ^= 0x10;  // record 10's length CRC
  Spill(dir + "/train-00000-of-00002", first);
  Spill(dir + "/train-00001-of-00002", second);
  // Record 1's JPEG is cut short; both CRCs match.
  Spill(dir + "/train-zz-corrupt", Slurp(made_dir + "/corrupt-00000-of-00001"));
  Spill(dir + "/validation-00000-of-00001",
        Slurp(made_dir + "/validation-00000-of-00001"));

  const std::vector<std::string> job =
      ImageRecordsJob(dir, R"("random_crop": true)");
  // The same samples in every step: the same losses, up to the sum order
  // of 1 and 2 replicas (a rank that skipped by its own lights would train
  // on other samples, far beyond this).
  std::map<int, std::vector<double>> losses;
  for (int workers : {1, 2}) {
    const std::string csv = absl::StrCat(dir, "/losses-", workers, ".csv");
    Result r = Local(workers, With(job, {"data.skip_corrupt=3"}), csv);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(LastJsonLine(r.out).fields().at("records_skipped").number_value(),
              3)
        << workers << " workers";
    losses[workers] = ReadLosses(csv);
  }
  ASSERT_EQ(losses[1].size(), 18u);  // 6 steps an epoch
  ExpectSameLosses(losses[1], losses[2]);

  Result tight = Local(2, With(job, {"data.skip_corrupt=2"}));
  EXPECT_NE(tight.code, 0);
  EXPECT_THAT(tight.out + tight.err, AllOf(HasSubstr("more than 2 records"),
                                           HasSubstr("data.skip_corrupt: 2")));
  Result strict = Local(1, job);
  EXPECT_NE(strict.code, 0);
  EXPECT_THAT(strict.out + strict.err,
              AllOf(HasSubstr("train-00000-of-00002: record 5 at byte "),
                    HasSubstr("CRC-32C")));
}

// The same samples as float64 CSV text and as float32 .npy arrays train the
// same model, bit for bit.
TEST(DataFormsTest, ACsvOfFloat64TrainsLikeFloat32Npy) {
  const std::string dir = TempDir("csv-npy");
  Result made = RunCommand({"/usr/bin/python3", "-c", R"(
import sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(3)
for split, n in (("train", 1024), ("test", 256)):
    y = rng.integers(0, 4, n)
    x = (rng.normal(0, 1, (n, 6)) + y[:, None] * 0.8).astype(np.float32)
    np.save(f"{out}/{split}_x.npy", x)
    np.save(f"{out}/{split}_label.npy", y.astype(np.int64))
    with open(f"{out}/{split}.csv", "w") as f:
        f.write("id," + ",".join(f"f{i}" for i in range(6)) + ",label\n")
        for i in range(n):
            cells = [repr(float(v)) for v in x[i]]
            f.write(f"{i}," + ",".join(cells) + f",{y[i]}\n")
    # The same with the labels as class names, in their sorted order.
    names = ["ant", "bee", "cat", "dog"]
    with open(f"{out}/{split}_named.csv", "w") as f:
        f.write("id," + ",".join(f"f{i}" for i in range(6)) + ",label\n")
        for i in range(n):
            cells = [repr(float(v)) for v in x[i]]
            f.write(f"{i}," + ",".join(cells) + f",{names[y[i]]}\n")
)",
                            dir});
  ASSERT_EQ(made.code, 0) << made.err;
  Result inspect =
      RunCommand({kBin + "/lockstep", "data", "inspect", dir + "/train.csv"});
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, AllOf(HasSubstr("1024 rows, 8 columns"),
                                 HasSubstr("f5                       float64"),
                                 HasSubstr("label                    int64")));
  const std::vector<std::string> common = {"task.num_classes=4",
                                           "data.dir=" + dir,
                                           "global_batch_size=64", "epochs=2"};
  Result npy = Local(1, With(common, {"data.format=npy"}));
  ASSERT_EQ(npy.code, 0) << npy.err;
  Result csv = Local(
      1, With(common,
              {"data.format=csv",
               R"(data.columns={"x": ["f0", "f1", "f2", "f3", "f4", "f5"],)"
               R"( "label": ["label"]})"}));
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(LastJsonLine(csv.out).fields().at("model_digest").string_value(),
            LastJsonLine(npy.out).fields().at("model_digest").string_value());
  EXPECT_GT(LastJsonLine(csv.out).fields().at("test_accuracy").number_value(),
            0.5);
  // Labels as class names (issue 54): numbered ant 0 ... dog 3 by the
  // training split, the same model; `data check` shows the names.
  const std::vector<std::string> named = With(
      common, {"data.format=csv", "data.train=train_named.csv",
               "data.test=test_named.csv",
               R"(data.columns={"x": ["f0", "f1", "f2", "f3", "f4", "f5"],)"
               R"( "label": ["label"]})",
               R"(data.features={"label": {"class_names": true}})"});
  std::vector<std::string> check = {kBin + "/lockstep", "data", "check", kMlp};
  for (const std::string& set : named)
    check.insert(check.end(), {"--set", set});
  Result checked = RunCommand(check);
  EXPECT_EQ(checked.code, 0) << checked.err;
  EXPECT_THAT(checked.out, HasSubstr("(label: ant, bee, cat, dog)"));
  Result names = Local(1, named);
  ASSERT_EQ(names.code, 0) << names.err;
  EXPECT_EQ(LastJsonLine(names.out).fields().at("model_digest").string_value(),
            LastJsonLine(npy.out).fields().at("model_digest").string_value());
  // A cell that is not a number is named.
  Spill(dir + "/bad.csv", "f0,label\n1.5,0\n2.5,x1\n");
  Result bad = Local(1, {"data.format=csv", "data.dir=" + dir,
                         "data.train=bad.csv", "data.test=bad.csv",
                         R"(data.columns={"x": ["f0"], "label": ["label"]})"});
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, AllOf(HasSubstr("bad.csv line 3, column 'label'"),
                             HasSubstr("\"x1\" is not a number")));
}

class EvalScheduleTest : public ClusterTest {};

// eval_every_steps 50 with eval_batches 2: evaluations at steps 50 and 100
// over the same 128 test windows, and the whole split at the end (150);
// `lockstep compare` draws the two jobs' evaluation curves.
TEST_F(EvalScheduleTest, ALanguageModelEvaluatesOnItsSchedule) {
  const std::string dir = TempDir("eval-schedule");
  Result made = RunCommand({DataTool(), "markov", dir});
  ASSERT_EQ(made.code, 0) << made.err;
  StartCluster(2);
  std::vector<std::string> jobs;
  for (const char* lr : {"base_lr=0.003", "base_lr=0.001"}) {
    jobs.push_back(
        Submit(With(TinyLm(dir), {lr, "max_steps=150", "eval_every_steps=50",
                                  "eval_batches=2", "num_workers=2"})));
    const v1::JobStatus done = WatchUntil(jobs.back(), Ended);
    ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(jobs.back());
    std::vector<int64_t> steps, samples;
    for (const v1::EvalPoint& eval : done.evals()) {
      steps.push_back(eval.step());
      samples.push_back(eval.samples());
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{50, 100, 150}));
    ASSERT_EQ(samples.size(), 3u);
    EXPECT_EQ(samples[0], 128);
    EXPECT_EQ(samples[1], 128);
    EXPECT_GT(samples[2], 128);  // the whole validation split
  }
  const std::string svg = dir + "/compare.svg";
  Result compare = RunCommand(
      {kBin + "/lockstep", "compare", jobs[0], jobs[1], "--svg", svg},
      {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(compare.code, 0) << compare.err;
  const std::string drawn = Slurp(svg);
  EXPECT_THAT(drawn, AllOf(HasSubstr("training loss by step"),
                           HasSubstr("test loss at each evaluation")));
}

}  // namespace
}  // namespace lockstep::integration
