// `lockstep data inspect` and `lockstep data check`: what a data set holds,
// and whether a job spec fits its files, found with the readers and the
// task resolution the workers use, before anything is submitted.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/commands.h"
#include "common/args.h"
#include "common/job_spec.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"
#include "tensorflow/example.pb.h"
#include "worker/data/csv.h"
#include "worker/data/image_decode.h"
#include "worker/data/mapped_file.h"
#include "worker/data/npy.h"
#include "worker/data/sources.h"
#include "worker/data/task_layout.h"
#include "worker/data/tfrecord.h"

namespace lockstep::client {
namespace {

using worker::ColumnInfo;
using worker::SplitSource;

constexpr char kDataUsage[] = R"(Usage:
  lockstep data inspect PATH... [--format idx|npy|tokens|tfrecord|csv]
                        [--token-dtype uint16|uint32]
  lockstep data check JOB.json [--set field=value ...]

inspect: what the files hold. A folder is read as the format says (or as
its files suggest): each split's columns, dtypes, per-sample shapes and
sample counts. Files are described one by one: a .npy file's dtype and
shape; a token file's count and the vocabulary it uses (largest id + 1),
and a folder of token shards' totals with the tokens windows of 65 leave
unread, each shard apart and concatenated; a TFRecord file's record count and
the features of its first Example (an encoded image's format, size and
channels); a CSV file's rows and each column's type (int64, float64, or
text, which lockstep cannot train on).

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

// What windows of 65 tokens every 64 (the defaults) make of token files,
// each on its own and concatenated (data.concatenate).
std::string TokenCoverageText(const std::vector<std::string>& files,
                              Dtype dtype) {
  std::vector<int64_t> tokens;
  for (const std::string& file : files) {
    std::error_code error;
    const auto bytes = std::filesystem::file_size(file, error);
    tokens.push_back(error ? 0
                           : static_cast<int64_t>(bytes) / DtypeSize(dtype));
  }
  auto apart = worker::CoverTokens(tokens, 64, 64, false);
  worker::TokenStream joined;
  joined.concatenate = true;
  auto together = worker::CoverTokens(tokens, 64, 64, false, joined);
  if (!apart.ok() || !together.ok()) return "";
  return absl::StrCat(
      "  windows of block_size + 1 = 65 every 64 tokens: ", apart->Text(),
      "\n  concatenated (data.concatenate): ", together->Text(), "\n");
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

// ", a JPEG image 36x36 (width x height), 3 channels" for bytes that are an
// encoded image; empty otherwise.
std::string ImageText(const std::string& bytes) {
  auto info = worker::ReadImageInfo(bytes);
  if (!info.ok()) return "";
  return absl::StrCat(
      ", a ", info->format == worker::ImageEncoding::kJpeg ? "JPEG" : "PNG",
      " image ", info->width, "x", info->height, " (width x height), ",
      info->channels, " channel", info->channels == 1 ? "" : "s");
}

// A CSV file: its rows and each column's type over the first kCsvRows rows.
std::string InspectCsv(const std::string& path) {
  constexpr int64_t kCsvRows = 100000;
  auto file = worker::MappedFile::Open(path);
  if (!file.ok()) return std::string(file.status().message());
  absl::string_view rest = (*file)->bytes();
  auto next = [&rest](absl::string_view* line) {
    if (rest.empty()) return false;
    const size_t end = rest.find('\n');
    *line = rest.substr(0, end);
    rest.remove_prefix(end == absl::string_view::npos ? rest.size() : end + 1);
    if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
    return true;
  };
  absl::string_view line;
  std::vector<absl::string_view> fields;
  std::string storage;
  if (!next(&line)) return absl::StrCat(path, ": no header row");
  absl::ConsumePrefix(&line, "\xEF\xBB\xBF");  // Excel's byte order mark
  if (!worker::SplitCsvRecord(line, &fields, &storage).ok()) {
    return absl::StrCat(path, ": no header row");
  }
  std::vector<std::string> names(fields.begin(), fields.end());
  // 0: int64, 1: float64, 2: whole numbers beyond int64, 3: text.
  std::vector<int> kind(names.size(), 0);
  // A text column's distinct values (at most 11 kept): class names?
  std::vector<std::set<std::string>> texts(names.size());
  int64_t rows = 0, line_number = 1;
  std::string problem;
  while (rows < kCsvRows && next(&line)) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (!worker::SplitCsvRecord(line, &fields, &storage).ok() ||
        fields.size() != names.size()) {
      problem = absl::StrCat("; line ", line_number, " has ", fields.size(),
                             " fields, the header ", names.size());
      break;
    }
    for (size_t c = 0; c < fields.size(); ++c) {
      double value;
      bool integer;
      int64_t whole;
      if (!worker::ParseCsvNumber(fields[c], &value, &integer, &whole).ok()) {
        const bool rounded =
            worker::ParseCsvNumber(fields[c], &value, &integer, &whole, true)
                .ok();
        kind[c] = std::max(kind[c], rounded ? 2 : 3);
        if (!rounded && texts[c].size() <= 10) {
          texts[c].emplace(absl::StripAsciiWhitespace(fields[c]).substr(0, 40));
        }
      } else if (!integer) {
        kind[c] = std::max(kind[c], 1);
      }
    }
    ++rows;
  }
  std::string out = absl::StrCat(path, ": ", rows, rows == kCsvRows ? "+" : "",
                                 " rows, ", names.size(), " columns", problem);
  const char* kKinds[] = {
      "int64", "float64",
      "whole numbers beyond int64 (declare dtype float64 to read them)",
      "text (not a number)"};
  for (size_t c = 0; c < names.size() && c < 256; ++c) {
    absl::StrAppendFormat(&out, "\n    %-24s %s",
                          std::string(names[c].substr(0, 64)), kKinds[kind[c]]);
    if (kind[c] == 3) {
      const bool more = texts[c].size() > 10;
      std::vector<std::string> shown(texts[c].begin(), texts[c].end());
      if (more) shown.pop_back();
      absl::StrAppend(
          &out, ": ", more ? "more than 10" : absl::StrCat(shown.size()),
          " distinct values (", absl::StrJoin(shown, ", "), more ? ", ..." : "",
          "); as a label, declare data.features[...].class_names");
    }
  }
  if (names.size() > 256) {
    absl::StrAppend(&out, "\n    ... and ", names.size() - 256, " more");
  }
  return out;
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
                                     " bytes",
                                     ImageText(f.bytes_list().value(0)), ")")
                      : "")
            : "empty";
    absl::StrAppend(&out, "\n    ", name, ": ", kind);
  }
  return out;
}

// The format a folder's files suggest.
std::string GuessFormat(const std::string& dir) {
  std::error_code error;
  bool npy = false, tfrecord = false, idx = false, csv = false, bin = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "train.bin") return "tokens";
    if (absl::StrContains(name, ".lockstep-csv-")) continue;  // a store
    npy = npy || absl::EndsWith(name, ".npy");
    tfrecord = tfrecord || absl::StrContains(name, ".tfrecord");
    idx = idx || absl::StrContains(name, "-idx");
    csv = csv || absl::EndsWith(name, ".csv");
    bin = bin || absl::EndsWith(name, ".bin");
  }
  return npy        ? "npy"
         : tfrecord ? "tfrecord"
         : idx      ? "idx"
         : csv      ? "csv"
         : bin      ? "token shards"
                    : "";
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
      if (kind.empty() || kind == "tfrecord" || kind == "csv" ||
          kind == "token shards") {
        // TFRecord and CSV folders need the features or columns a job
        // declares, token shards its globs: the files are described one by
        // one, in order.
        if (kind.empty()) {
          std::cout << TerminalSafe(path)
                    << ": no idx, npy, tokens, TFRecord or CSV files\n";
          ok = false;
          continue;
        }
        std::vector<std::string> files;
        for (const auto& entry :
             std::filesystem::directory_iterator(path, error)) {
          const std::string file = entry.path().string();
          if (absl::EndsWith(file, ".lockstep-index") ||
              absl::StrContains(file, ".lockstep-csv-")) {
            continue;
          }
          files.push_back(file);
        }
        std::sort(files.begin(), files.end());
        int64_t shards = 0;
        std::vector<std::string> bins;
        for (const std::string& file : files) {
          if (kind == "csv") {
            if (!absl::EndsWith(file, ".csv")) continue;
            std::cout << TerminalSafe(InspectCsv(file)) << "\n";
          } else if (kind == "token shards") {
            if (!absl::EndsWith(file, ".bin")) continue;
            std::cout << TerminalSafe(InspectTokens(file, tokens)) << "\n";
            bins.push_back(file);
            ++shards;
          } else {
            std::cout << TerminalSafe(InspectTfRecord(file)) << "\n";
          }
        }
        if (kind == "token shards") {
          std::cout << TerminalSafe(path) << ": " << shards
                    << " token shards (data.format \"tokens\" with "
                       "data.train/data.test globs of them)\n"
                    << TokenCoverageText(bins, tokens);
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
    } else if (absl::EndsWith(path, ".csv") || format == "csv") {
      std::cout << TerminalSafe(InspectCsv(path)) << "\n";
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
