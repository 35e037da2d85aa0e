// Writes the synthetic data sets of examples/ and of the workload tests, as
// a user's own pipeline would: NumPy arrays (one file or shards), TFRecord
// files of tf.train.Example records, and token files. Every set is a pure
// function of its arguments (a fixed generator), so the same samples can be
// written in several formats and the runs on them compared.
//
//   lockstep-example-data markov DIR
//       train.bin/val.bin: uint16 tokens of a Markov chain over 16 symbols
//       (the next token is 1, 2 or 3 ahead, with probabilities 0.6, 0.3,
//       0.1); its entropy rate is printed.
//   lockstep-example-data classes DIR [--classes K] [--shards S] [--tfrecord]
//       K (100) classes of 32 float features around one prototype each:
//       train_x / train_label (6,400 samples) and test_x / test_label
//       (1,000) as .npy, in S (1) shards, or as TFRecord files
//       train-0000s.tfrecord with features x (float32 [32]) and label (int64).
//   lockstep-example-data regression DIR
//       y = x W + noise, x 16 features, y 4 targets: train_x / train_y
//       (6,400) and test_x / test_y (1,000), float32 .npy.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "tensorflow/example.pb.h"
#include "worker/data/tfrecord.h"

namespace {

using lockstep::WriteFileAtomically;

class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Normal() {
    const double u = std::max(Uniform(), 1e-300), v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2 * M_PI * v);
  }

 private:
  uint64_t state_;
};

// numpy.save's bytes for a C-ordered little-endian array.
std::string Npy(const char* descr, const std::vector<int64_t>& shape,
                const void* data, size_t bytes) {
  std::string dims;
  for (int64_t d : shape) absl::StrAppend(&dims, d, ", ");
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.append(reinterpret_cast<const char*>(&length), 2);
  out += header;
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

bool Write(const std::string& path, const std::string& bytes) {
  auto written = WriteFileAtomically(path, bytes);
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", std::string(written.message()).c_str());
    return false;
  }
  return true;
}

int Markov(const std::string& dir) {
  constexpr int kSymbols = 16;
  const double probabilities[3] = {0.6, 0.3, 0.1};
  auto chain = [&](uint64_t seed, int64_t count) {
    Random random(seed);
    std::vector<uint16_t> tokens(static_cast<size_t>(count));
    int state = 0;
    for (int64_t i = 0; i < count; ++i) {
      const double u = random.Uniform();
      const int step = u < probabilities[0]                      ? 1
                       : u < probabilities[0] + probabilities[1] ? 2
                                                                 : 3;
      state = (state + step) % kSymbols;
      tokens[i] = static_cast<uint16_t>(state);
    }
    return std::string(reinterpret_cast<const char*>(tokens.data()),
                       tokens.size() * 2);
  };
  if (!Write(dir + "/train.bin", chain(1, 200000)) ||
      !Write(dir + "/val.bin", chain(2, 20000))) {
    return 1;
  }
  double entropy = 0;
  for (double p : probabilities) entropy -= p * std::log(p);
  // Each row of the transition matrix is a shifted copy of the same
  // distribution, so every state is equally likely and the entropy rate is
  // that distribution's entropy.
  std::printf("entropy_rate_nats %.6f\n", entropy);
  return 0;
}

struct Split {
  std::vector<float> x;
  std::vector<int64_t> labels;
  std::vector<float> y;
};

// `count` samples of K classes: prototype + noise.
Split Classes(const std::vector<float>& prototypes, int classes, int dim,
              int64_t count, uint64_t seed) {
  Random random(seed);
  Split split;
  for (int64_t i = 0; i < count; ++i) {
    const int label = static_cast<int>(random.Next() % classes);
    split.labels.push_back(label);
    for (int d = 0; d < dim; ++d) {
      split.x.push_back(prototypes[label * dim + d] +
                        0.7f * static_cast<float>(random.Normal()));
    }
  }
  return split;
}

bool WriteTfRecords(const std::string& path, const Split& split, int dim,
                    int64_t begin, int64_t end) {
  std::vector<std::string> records;
  for (int64_t i = begin; i < end; ++i) {
    lockstep::tfexample::Example example;
    auto& features = *example.mutable_features()->mutable_feature();
    auto* x = features["x"].mutable_float_list();
    for (int d = 0; d < dim; ++d) x->add_value(split.x[i * dim + d]);
    features["label"].mutable_int64_list()->add_value(split.labels[i]);
    records.push_back(example.SerializeAsString());
  }
  absl::Status written = lockstep::worker::WriteTfRecordFile(
      path, records, lockstep::worker::TfRecordCompression::kNone);
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", std::string(written.message()).c_str());
  }
  return written.ok();
}

int ClassesData(const std::string& dir, int classes, int shards,
                bool tfrecord) {
  constexpr int kDim = 32;
  Random random(7);
  std::vector<float> prototypes;
  for (int i = 0; i < classes * kDim; ++i) {
    prototypes.push_back(static_cast<float>(random.Normal()));
  }
  for (const bool train : {true, false}) {
    const int64_t count = train ? 6400 : 1000;
    const Split split =
        Classes(prototypes, classes, kDim, count, train ? 11 : 12);
    const char* name = train ? "train" : "test";
    for (int s = 0; s < shards; ++s) {
      const int64_t begin = count * s / shards, end = count * (s + 1) / shards;
      const std::string suffix = shards == 1 ? "" : absl::StrFormat("-%05d", s);
      bool ok;
      if (tfrecord) {
        ok =
            WriteTfRecords(absl::StrFormat("%s/%s-%05d.tfrecord", dir, name, s),
                           split, kDim, begin, end);
      } else {
        ok = Write(absl::StrCat(dir, "/", name, "_x", suffix, ".npy"),
                   Npy("<f4", {end - begin, kDim}, &split.x[begin * kDim],
                       (end - begin) * kDim * sizeof(float))) &&
             Write(absl::StrCat(dir, "/", name, "_label", suffix, ".npy"),
                   Npy("<i8", {end - begin}, &split.labels[begin],
                       (end - begin) * sizeof(int64_t)));
      }
      if (!ok) return 1;
    }
  }
  return 0;
}

int Regression(const std::string& dir) {
  constexpr int kIn = 16, kOut = 4;
  Random random(21);
  std::vector<double> w(kIn * kOut);
  for (double& v : w) v = random.Normal() / std::sqrt(double{kIn});
  for (const bool train : {true, false}) {
    const int64_t count = train ? 6400 : 1000;
    std::vector<float> x, y;
    for (int64_t i = 0; i < count; ++i) {
      double in[kIn];
      for (double& v : in) {
        v = random.Normal();
        x.push_back(static_cast<float>(v));
      }
      for (int o = 0; o < kOut; ++o) {
        double sum = 0.1 * random.Normal();
        for (int d = 0; d < kIn; ++d) sum += in[d] * w[d * kOut + o];
        y.push_back(static_cast<float>(sum));
      }
    }
    const char* name = train ? "train" : "test";
    if (!Write(absl::StrCat(dir, "/", name, "_x.npy"),
               Npy("<f4", {count, kIn}, x.data(), x.size() * 4)) ||
        !Write(absl::StrCat(dir, "/", name, "_y.npy"),
               Npy("<f4", {count, kOut}, y.data(), y.size() * 4))) {
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: lockstep-example-data markov|classes|regression DIR "
                 "[--classes K] [--shards S] [--tfrecord]\n");
    return 2;
  }
  const std::string kind = argv[1], dir = argv[2];
  int classes = 100, shards = 1;
  bool tfrecord = false;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--classes" && i + 1 < argc) {
      classes = std::atoi(argv[++i]);
    } else if (arg == "--shards" && i + 1 < argc) {
      shards = std::atoi(argv[++i]);
    } else if (arg == "--tfrecord") {
      tfrecord = true;
    } else {
      std::fprintf(stderr, "lockstep-example-data: unknown argument %s\n",
                   arg.c_str());
      return 2;
    }
  }
  if (classes < 2 || classes > 100000 || shards < 1 || shards > 1000) {
    std::fprintf(stderr,
                 "lockstep-example-data: --classes in [2, 100000], "
                 "--shards in [1, 1000]\n");
    return 2;
  }
  if (!lockstep::MakeDirectories(dir).ok()) {
    std::fprintf(stderr, "lockstep-example-data: cannot create %s\n",
                 dir.c_str());
    return 1;
  }
  if (kind == "markov") return Markov(dir);
  if (kind == "classes") return ClassesData(dir, classes, shards, tfrecord);
  if (kind == "regression") return Regression(dir);
  std::fprintf(stderr, "lockstep-example-data: unknown kind %s\n",
               kind.c_str());
  return 2;
}
