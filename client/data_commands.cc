// `lockstep data inspect` and `lockstep data check`: what a data set holds,
// and whether a job spec fits its files, found with the readers and the
// task resolution the workers use, before anything is submitted.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "common/args.h"
#include "common/job_spec.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"
#include "tensorflow/example.pb.h"
#include "worker/data/mapped_file.h"
#include "worker/data/npy.h"
#include "worker/data/task_layout.h"
#include "worker/data/tfrecord.h"

namespace lockstep::client {
namespace {

using worker::ColumnInfo;
using worker::SplitSource;

constexpr char kDataUsage[] = R"(Usage:
  lockstep data inspect PATH... [--format idx|npy|tokens|tfrecord]
                        [--token-dtype uint16|uint32]
  lockstep data check JOB.json [--set field=value ...]

inspect: what the files hold. A folder is read as the format says (or as
its files suggest): each split's columns, dtypes, per-sample shapes and
sample counts. Files are described one by one: a .npy file's dtype and
shape; a token file's count and the vocabulary it uses (largest id + 1); a
TFRecord file's record count and the features of its first Example.

check: opens the job's data exactly as a worker would (data.format,
data.dir, data.train/test, data.features, the token settings), resolves its
task (task.type, input and target columns, classes or vocabulary, model
shape), and prints what would be trained, or the error a worker would fail
the job with. Exit 0 when the job fits its data, 1 when it does not.
)";

std::string Describe(const SplitSource& split) {
  std::string out =
      absl::StrCat("  ", split.size(), " samples: ", split.description(), "\n");
  for (const ColumnInfo& column : split.columns()) {
    absl::StrAppendFormat(&out, "    %-16s %-9s %s\n", column.name,
                          DtypeName(column.dtype), column.ShapeText());
  }
  return out;
}

// One .npy file's header.
std::string InspectNpy(const std::string& path) {
  auto file = worker::MappedFile::Open(path);
  if (!file.ok()) return std::string(file.status().message());
  auto header = worker::ParseNpyHeader((*file)->bytes(), path);
  if (!header.ok()) return std::string(header.status().message());
  auto data = worker::NpyDataBytes(*header,
                                   (*file)->size() - header->data_offset, path);
  if (!data.ok()) return std::string(data.status().message());
  return absl::StrCat(path, ": ", header->descr, " ", header->shape_text);
}

// A token file: its tokens and the largest id.
std::string InspectTokens(const std::string& path, Dtype dtype) {
  auto file = worker::MappedFile::Open(path);
  if (!file.ok()) return std::string(file.status().message());
  const int size = DtypeSize(dtype);
  if ((*file)->size() % size != 0) {
    return absl::StrCat(path, ": ", (*file)->size(),
                        " bytes, not a whole number of ", DtypeName(dtype),
                        " tokens");
  }
  const int64_t tokens = (*file)->size() / size;
  int64_t largest = -1;
  for (int64_t i = 0; i < tokens; ++i) {
    largest = std::max(largest, ElementAsInt(dtype, (*file)->data(), i));
  }
  return absl::StrCat(path, ": ", tokens, " ", DtypeName(dtype),
                      " tokens, vocabulary seen ", largest + 1,
                      " (largest id + 1)");
}

// A TFRecord file: its records (every CRC checked) and the first Example's
// features.
std::string InspectTfRecord(const std::string& path) {
  auto index = worker::BuildTfRecordIndex(path);
  if (!index.ok()) return std::string(index.status().message());
  std::string out = absl::StrCat(
      path, ": ", index->size(), " records",
      index->compression == worker::TfRecordCompression::kGzip ? " (GZIP)"
                                                               : "");
  if (index->size() == 0) return out;
  auto record = worker::ReadRecord(*index, 0);
  tfexample::Example example;
  if (!record.ok() || !example.ParseFromString(*record)) {
    return absl::StrCat(out, "; the first record is not a tf.train.Example");
  }
  std::vector<std::string> names;
  for (const auto& [name, feature] : example.features().feature()) {
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const tfexample::Feature& f = example.features().feature().at(name);
    std::string kind =
        f.has_float_list()
            ? absl::StrCat("float_list of ", f.float_list().value_size())
        : f.has_int64_list()
            ? absl::StrCat("int64_list of ", f.int64_list().value_size())
        : f.has_bytes_list()
            ? absl::StrCat(
                  "bytes_list of ", f.bytes_list().value_size(),
                  f.bytes_list().value_size() == 1
                      ? absl::StrCat(" (", f.bytes_list().value(0).size(),
                                     " bytes)")
                      : "")
            : "empty";
    absl::StrAppend(&out, "\n    ", name, ": ", kind);
  }
  return out;
}

// The format a folder's files suggest.
std::string GuessFormat(const std::string& dir) {
  std::error_code error;
  bool npy = false, tfrecord = false, idx = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "train.bin") return "tokens";
    npy = npy || absl::EndsWith(name, ".npy");
    tfrecord = tfrecord || absl::StrContains(name, ".tfrecord");
    idx = idx || absl::StrContains(name, "-idx");
  }
  return npy ? "npy" : tfrecord ? "tfrecord" : idx ? "idx" : "";
}

int Inspect(const Args& args) {
  const std::string format = args.Get("format");
  const std::string token_dtype = args.Get("token-dtype", "uint16");
  if (token_dtype != "uint16" && token_dtype != "uint32") {
    return Fail(
        absl::InvalidArgumentError("--token-dtype is uint16 or uint32"));
  }
  const Dtype tokens =
      token_dtype == "uint32" ? Dtype::kUInt32 : Dtype::kUInt16;
  bool ok = true;
  for (const std::string& path : args.positional()) {
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      const std::string kind = format.empty() ? GuessFormat(path) : format;
      if (kind.empty() || kind == "tfrecord") {
        // TFRecord folders need the features a job declares: the files are
        // described one by one.
        if (kind.empty()) {
          std::cout << path << ": no idx, npy, tokens or TFRecord files\n";
          ok = false;
          continue;
        }
        for (const auto& entry :
             std::filesystem::directory_iterator(path, error)) {
          const std::string file = entry.path().string();
          if (absl::EndsWith(file, ".lockstep-index")) continue;
          std::cout << TerminalSafe(InspectTfRecord(file)) << "\n";
        }
        continue;
      }
      v1::DataSpec spec;
      spec.set_format(kind);
      spec.set_dir(path);
      spec.set_token_dtype(token_dtype);
      spec.set_block_size(64);
      spec.set_window_stride(64);
      std::cout << TerminalSafe(path) << " (" << kind << ")\n";
      for (bool train : {true, false}) {
        auto split = worker::OpenSplit(spec, train);
        std::cout << (train ? "train" : "test") << ":\n";
        if (!split.ok()) {
          std::cout << "  " << TerminalSafe(split.status().message()) << "\n";
          ok = false;
          continue;
        }
        std::cout << TerminalSafe(Describe(**split));
        if (kind == "tokens") {
          const std::string file =
              absl::StrCat(path, train ? "/train.bin" : "/val.bin");
          std::cout << "  " << TerminalSafe(InspectTokens(file, tokens))
                    << " (windows of block_size + 1 = 65 shown)\n";
        }
      }
      continue;
    }
    if (absl::EndsWith(path, ".npy")) {
      std::cout << TerminalSafe(InspectNpy(path)) << "\n";
    } else if (absl::EndsWith(path, ".bin") || format == "tokens") {
      std::cout << TerminalSafe(InspectTokens(path, tokens)) << "\n";
    } else {
      std::cout << TerminalSafe(InspectTfRecord(path)) << "\n";
    }
  }
  return ok ? kExitOk : kExitJobFailed;
}

// The job does not fit its data: the worker's error, exit 1.
int Misfit(const absl::Status& status) {
  std::cerr << "lockstep: " << TerminalSafe(status.message()) << std::endl;
  return kExitJobFailed;
}

int Check(const Args& args) {
  if (args.positional().size() != 1) {
    std::cerr << kDataUsage;
    return kExitUsage;
  }
  auto spec = LoadSpec(args.positional()[0], args.GetAll("set"));
  if (!spec.ok()) return Fail(spec.status());  // a usage error
  if (absl::Status valid = ValidateJobSpec(*spec); !valid.ok()) {
    return Misfit(valid);
  }
  auto train = worker::OpenSplit(spec->data(), true);
  if (!train.ok()) return Misfit(train.status());
  auto test = worker::OpenSplit(spec->data(), false);
  if (!test.ok()) return Misfit(test.status());
  auto task = worker::ResolveTask(*spec, **train, test->get());
  if (!task.ok()) return Misfit(task.status());
  if (auto for_test = worker::TaskForTest(*task, **test); !for_test.ok()) {
    return Misfit(for_test.status());
  }
  std::cout << "train:\n" << TerminalSafe(Describe(**train));
  std::cout << "test:\n" << TerminalSafe(Describe(**test));
  std::cout << "task: " << TerminalSafe(worker::TaskText(*task)) << "\n";
  std::cout << "model "
            << TerminalSafe(spec->model().name().empty()
                                ? spec->model().torchscript()
                                : spec->model().name())
            << " takes " << (task->token_input ? "token ids [" : "floats [")
            << absl::StrJoin(task->model_input, ", ") << "] and returns "
            << task->outputs << " values per "
            << (task->token_input ? "position" : "sample") << "\n";
  if (spec->has_global_batch_size()) {
    const int64_t steps = (*train)->size() / spec->global_batch_size();
    std::cout << steps << " steps per epoch at global batch "
              << spec->global_batch_size() << "\n";
    if (steps == 0) {
      return Misfit(absl::InvalidArgumentError(
          absl::StrCat("the training data has ", (*train)->size(),
                       " samples, fewer than one global batch of ",
                       spec->global_batch_size())));
    }
  }
  std::cout << "ok: the job fits its data\n";
  return kExitOk;
}

}  // namespace

int RunData(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    (argv.empty() ? std::cerr : std::cout) << kDataUsage;
    return argv.empty() ? kExitUsage : kExitOk;
  }
  const std::string sub = argv[0];
  auto args = Args::Parse({argv.begin() + 1, argv.end()},
                          {"format", "token-dtype", "set"}, {"help"});
  if (!args.ok()) {
    std::cerr << "lockstep data: " << args.status().message() << "\n"
              << kDataUsage;
    return kExitUsage;
  }
  if (args->Has("help")) {
    std::cout << kDataUsage;
    return kExitOk;
  }
  if (sub == "inspect" && !args->positional().empty()) return Inspect(*args);
  if (sub == "check") return Check(*args);
  std::cerr << kDataUsage;
  return kExitUsage;
}

}  // namespace lockstep::client
