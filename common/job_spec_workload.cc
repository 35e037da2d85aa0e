// The defaults and rules of a job's workload: data.*, task.* and the model
// sizes (job_spec_internal.h).
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "common/status_macros.h"

namespace lockstep::internal {
namespace {

// A glob relative to data.dir that cannot name a file outside it: no
// absolute path, no "..", no empty or "." segment tricks.
absl::Status CheckGlob(absl::string_view field, const std::string& glob) {
  if (glob.empty()) return absl::OkStatus();
  if (glob[0] == '/') {
    return Invalid(
        absl::StrCat(field, " \"", glob,
                     "\" is absolute; give a glob relative to data.dir (e.g. "
                     "\"train-*.tfrecord\")"));
  }
  for (absl::string_view part : absl::StrSplit(glob, '/')) {
    if (part == "..") {
      return Invalid(absl::StrCat(field, " \"", glob,
                                  "\" steps out of data.dir with \"..\"; "
                                  "name files inside data.dir"));
    }
  }
  return absl::OkStatus();
}

bool IsColumnName(const std::string& name) {
  return !name.empty() &&
         static_cast<int64_t>(name.size()) <= kMaxColumnNameBytes &&
         name.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyz"
             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-") == std::string::npos;
}

absl::Status CheckColumnName(absl::string_view field, const std::string& name) {
  if (name.empty() || IsColumnName(name)) return absl::OkStatus();
  return Invalid(absl::StrCat(
      field, " \"", name, "\" is not a column name (1 to ", kMaxColumnNameBytes,
      " letters, digits, '_', '.', '/' or '-')"));
}

// A TFRecord feature's reading rules: another key, an encoded image and its
// augmentations, optional and variable-length features.
absl::Status ValidateRecordFeature(const v1::DataSpec& data,
                                   const std::string& field,
                                   const v1::ColumnSpec& column) {
  const bool image_rules = column.resize_size() > 0 || column.random_crop() ||
                           column.random_flip() ||
                           !column.resize_filter().empty() ||
                           column.has_random_resized_crop();
  const bool record_rules =
      !column.from().empty() || !column.encoding().empty() || image_rules ||
      column.optional() || column.max_len() != 0 || column.offset() != 0;
  if (!record_rules) return absl::OkStatus();
  if (data.format() != "tfrecord") {
    return Invalid(absl::StrCat(
        field,
        ": from, encoding, resize, resize_filter, random_crop, "
        "random_resized_crop, random_flip, optional, max_len and offset are "
        "for data.format \"tfrecord\""));
  }
  if (column.offset() != 0) {
    const std::optional<Dtype> dtype = DtypeFromName(column.dtype());
    if (!column.encoding().empty() || !dtype.has_value() ||
        !IsInteger(*dtype) || column.offset() < -(int64_t{1} << 32) ||
        column.offset() > (int64_t{1} << 32)) {
      return Invalid(absl::StrCat(
          field,
          ".offset is added to an integer feature's values (e.g. -1 for "
          "labels from 1): give an integer dtype and an offset within "
          "+-2^32"));
    }
  }
  if (!column.from().empty() && !IsColumnName(column.from())) {
    return Invalid(absl::StrCat(field, ".from is not a feature name (1 to ",
                                kMaxColumnNameBytes,
                                " letters, digits, '_', '.', '/' or '-')"));
  }
  const bool image = !column.encoding().empty();
  if (image) {
    if (!OneOf(column.encoding(), {"jpeg", "png", "auto"})) {
      return Invalid(
          absl::StrCat(field, ".encoding must be jpeg, png or auto"));
    }
    if (column.dtype() != "uint8" || column.shape_size() != 3 ||
        (column.shape(2) != 1 && column.shape(2) != 3 &&
         column.shape(2) != 4)) {
      return Invalid(absl::StrCat(
          field,
          ": an encoded image decodes into dtype uint8 and shape [H, W, C] "
          "with C 1 (grey), 3 (RGB) or 4 (RGBA)"));
    }
    if (column.resize_size() != 0 &&
        (column.resize_size() != 2 || column.resize(0) < column.shape(0) ||
         column.resize(1) < column.shape(1) || column.resize(0) > 16384 ||
         column.resize(1) > 16384)) {
      return Invalid(absl::StrCat(
          field,
          ".resize is [height, width], at least the shape's [H, W] (the "
          "crop is taken from it) and at most 16384 each"));
    }
    if (!column.resize_filter().empty() &&
        !OneOf(column.resize_filter(), {"bilinear", "antialias"})) {
      return Invalid(
          absl::StrCat(field, ".resize_filter must be bilinear or antialias"));
    }
    if (column.has_random_resized_crop()) {
      const v1::ResizedCrop& crop = column.random_resized_crop();
      const bool scale_ok =
          crop.scale_size() == 0 ||
          (crop.scale_size() == 2 && crop.scale(0) > 0 &&
           crop.scale(0) <= crop.scale(1) && crop.scale(1) <= 1);
      const bool ratio_ok =
          crop.ratio_size() == 0 ||
          (crop.ratio_size() == 2 && crop.ratio(0) > 0 &&
           crop.ratio(0) <= crop.ratio(1) && crop.ratio(1) <= 100);
      if (!scale_ok || !ratio_ok || column.random_crop()) {
        return Invalid(absl::StrCat(
            field,
            ".random_resized_crop takes scale [low, high] in (0, 1] and "
            "ratio [low, high] in (0, 100] (torchvision's; default [0.08, "
            "1] and [3/4, 4/3]), in place of random_crop"));
      }
    }
  } else if (image_rules) {
    return Invalid(absl::StrCat(
        field,
        ": resize, resize_filter, random_crop, random_resized_crop and "
        "random_flip are for encoded images (set .encoding)"));
  }
  if (column.max_len() != 0) {
    if (image || column.max_len() < 1 ||
        column.max_len() > kMaxSampleElements || column.shape_size() != 0) {
      return Invalid(absl::StrCat(
          field, ".max_len must be in [1, ", kMaxSampleElements,
          "], for a list of numbers declared without a shape (the column "
          "is [max_len], zero-padded)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateFeatures(const v1::DataSpec& data) {
  if (data.features_size() > kMaxColumns) {
    return Invalid(absl::StrCat("data.features has ", data.features_size(),
                                " entries; at most ", kMaxColumns));
  }
  for (const auto& [name, column] : data.features()) {
    const std::string field = absl::StrCat("data.features[\"", name, "\"]");
    // Checked before `field` (which holds the name) is echoed anywhere.
    if (!IsColumnName(name)) {
      return Invalid(absl::StrCat(
          "data.features holds a key that is not a column name (1 to ",
          kMaxColumnNameBytes, " letters, digits, '_', '.', '/' or '-')"));
    }
    if (!column.dtype().empty() && !DtypeFromName(column.dtype())) {
      // Not echoed: it may hold anything.
      return Invalid(absl::StrCat(field,
                                  ".dtype is not a dtype lockstep reads; "
                                  "choose one of ",
                                  DtypeNames()));
    }
    if (column.shape_size() > kMaxColumnRank) {
      return Invalid(absl::StrCat(field, ".shape has ", column.shape_size(),
                                  " dimensions; at most ", kMaxColumnRank));
    }
    // Not echoed: a map's strings may hold anything.
    if (!column.normalize().empty() &&
        !OneOf(column.normalize(), {"scalar", "per_feature"})) {
      return Invalid(
          absl::StrCat(field, ".normalize must be scalar or per_feature"));
    }
    if (column.channel_mean_size() > 0 || column.channel_std_size() > 0) {
      bool positive = true;
      for (double std : column.channel_std()) {
        positive = positive && std::isfinite(std) && std > 0;
      }
      bool finite = true;
      for (double mean : column.channel_mean()) {
        finite = finite && std::isfinite(mean);
      }
      if (column.channel_mean_size() != column.channel_std_size() ||
          column.channel_mean_size() > 4096 || !positive || !finite ||
          column.has_mean() || column.has_std() ||
          !column.normalize().empty()) {
        return Invalid(absl::StrCat(
            field,
            ".channel_mean and .channel_std are one finite mean and one "
            "positive std per channel (as many of each, at most 4096), in "
            "place of .mean, .std and .normalize"));
      }
    }
    if (column.class_names() || column.classes_size() > 0 ||
        column.has_fill_missing()) {
      if (data.format() != "csv") {
        return Invalid(absl::StrCat(
            field,
            ": class_names, classes and fill_missing are for data.format "
            "\"csv\""));
      }
      if (column.classes_size() > 0 && !column.class_names()) {
        return Invalid(absl::StrCat(
            field, ".classes lists class names: set .class_names too"));
      }
      if (column.class_names() &&
          (column.has_fill_missing() || !column.dtype().empty())) {
        return Invalid(absl::StrCat(
            field,
            ": a column of class names is stored as their indices (int64); "
            "drop .dtype and .fill_missing (a missing class is an error)"));
      }
      if (column.classes_size() > kMaxClasses) {
        return Invalid(absl::StrCat(field, ".classes lists more than ",
                                    kMaxClasses, " names"));
      }
      std::set<std::string> seen;
      for (const std::string& name : column.classes()) {
        // Not echoed: it may hold anything.
        if (name.empty() || name.size() > 256 || !seen.insert(name).second) {
          return Invalid(absl::StrCat(
              field, ".classes must be distinct names of 1 to 256 bytes"));
        }
      }
      if (column.has_fill_missing() && (!std::isfinite(column.fill_missing()) ||
                                        column.dtype() == "int64")) {
        return Invalid(absl::StrCat(
            field,
            ".fill_missing must be a finite number, for a column stored as a "
            "float (a filled column is one, as pandas' fillna leaves it): "
            "drop dtype int64"));
      }
    }
    if (column.normalize() == "per_feature" &&
        (column.has_mean() || column.has_std())) {
      return Invalid(absl::StrCat(
          field,
          ".normalize \"per_feature\" computes each element's mean and std "
          "from the training split; drop .mean and .std, or normalize "
          "\"scalar\" with them"));
    }
    int64_t elements = 1;
    for (int64_t dim : column.shape()) {
      if (dim < 1 || dim > kMaxSampleElements ||
          elements > kMaxSampleElements / dim) {
        return Invalid(
            absl::StrCat(field, ".shape [", absl::StrJoin(column.shape(), ", "),
                         "] is not a shape of positive sizes with at most ",
                         kMaxSampleElements, " elements"));
      }
      elements *= dim;
    }
    if (column.has_std() && !(column.std() > 0 && column.std() < 1e30)) {
      return Invalid(absl::StrCat(field, ".std must be positive and finite"));
    }
    if (column.has_mean() && !(column.mean() > -1e30 && column.mean() < 1e30)) {
      return Invalid(absl::StrCat(field, ".mean must be finite"));
    }
    if (data.format() == "tfrecord" && column.dtype().empty()) {
      return Invalid(absl::StrCat(
          field,
          " needs a dtype (and a shape, [] for a scalar): a TFRecord file "
          "does not say what its features hold"));
    }
    RETURN_IF_ERROR(ValidateRecordFeature(data, field, column));
  }
  return absl::OkStatus();
}

// data.columns: the CSV's column names grouped into the split's columns.
absl::Status ValidateCsvColumns(const v1::DataSpec& data) {
  if (data.format() != "csv") {
    if (data.columns_size() > 0) {
      return Invalid("data.columns groups the columns of data.format \"csv\"");
    }
    return absl::OkStatus();
  }
  if (data.columns_size() == 0) {
    return Invalid(
        "data.format \"csv\" needs data.columns: the split's columns, each a "
        "list of the CSV's column names, e.g. {\"x\": [\"x0\", \"x1\"], "
        "\"y\": [\"label\"]}");
  }
  if (data.columns_size() > kMaxColumns) {
    return Invalid(absl::StrCat("data.columns has ", data.columns_size(),
                                " entries; at most ", kMaxColumns));
  }
  int64_t names = 0;
  for (const auto& [name, list] : data.columns()) {
    if (!IsColumnName(name)) {
      return Invalid(absl::StrCat(
          "data.columns has a key that is not a column name (1 to ",
          kMaxColumnNameBytes, " letters, digits, '_', '.', '/' or '-')"));
    }
    const std::string field = absl::StrCat("data.columns[\"", name, "\"]");
    if (list.values_size() == 0) {
      return Invalid(absl::StrCat(field, " lists no CSV column"));
    }
    names += list.values_size();
    if (names > kMaxCsvColumnNames) {
      return Invalid(absl::StrCat("data.columns lists more than ",
                                  kMaxCsvColumnNames, " CSV columns"));
    }
    for (const google::protobuf::Value& value : list.values()) {
      if (value.kind_case() != google::protobuf::Value::kStringValue ||
          value.string_value().empty() ||
          value.string_value().size() > kMaxCsvColumnNameBytes) {
        return Invalid(
            absl::StrCat(field, " must list CSV column names: strings of 1 to ",
                         kMaxCsvColumnNameBytes, " bytes"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataSpec& data) {
  RETURN_IF_ERROR(CheckChoice("data.format", data.format(),
                              {"idx", "npy", "tokens", "tfrecord", "csv"}));
  RETURN_IF_ERROR(CheckGlob("data.train", data.train()));
  RETURN_IF_ERROR(CheckGlob("data.test", data.test()));
  if ((!data.train().empty() || !data.test().empty()) &&
      !OneOf(data.format(), {"npy", "tfrecord", "tokens", "csv"})) {
    return Invalid(absl::StrCat(
        "data.train and data.test are globs of npy, tfrecord, token or CSV "
        "files; data format \"",
        data.format(), "\" has fixed file names"));
  }
  if (data.format() == "tfrecord" &&
      (data.train().empty() || data.test().empty() ||
       data.features_size() == 0)) {
    return Invalid(
        "data.format \"tfrecord\" needs data.train and data.test (globs of "
        "files under data.dir) and data.features (each feature's dtype and "
        "shape)");
  }
  RETURN_IF_ERROR(ValidateFeatures(data));
  RETURN_IF_ERROR(ValidateCsvColumns(data));
  RETURN_IF_ERROR(
      CheckChoice("data.shuffle", data.shuffle(), {"global", "blocks"}));
  if (data.shuffle_block() < 1) {
    return Invalid(absl::StrCat("data.shuffle_block must be >= 1, got ",
                                data.shuffle_block()));
  }
  if (data.format() == "tokens") {
    RETURN_IF_ERROR(CheckChoice("data.token_dtype", data.token_dtype(),
                                {"uint16", "uint32"}));
    if (data.block_size() < 1 || data.window_stride() < 1) {
      return Invalid(absl::StrCat(
          "data.block_size and data.window_stride must be >= 1, got ",
          data.block_size(), " and ", data.window_stride()));
    }
    // Empty in a spec stored before the field existed: "fixed".
    if (!data.window_offset().empty()) {
      RETURN_IF_ERROR(CheckChoice("data.window_offset", data.window_offset(),
                                  {"fixed", "random"}));
    }
    if (data.train().empty() != data.test().empty()) {
      return Invalid(
          "data.format \"tokens\" takes both data.train and data.test (globs "
          "of token files) or neither (train.bin and val.bin in data.dir)");
    }
    if (data.has_separator_token()) {
      const int64_t top = data.token_dtype() == "uint32" ? int64_t{0xFFFFFFFF}
                                                         : int64_t{0xFFFF};
      if (!data.concatenate()) {
        return Invalid(
            "data.separator_token goes between concatenated files: set "
            "data.concatenate too");
      }
      if (data.separator_token() < 0 || data.separator_token() > top) {
        return Invalid(absl::StrCat("data.separator_token must be in [0, ", top,
                                    "] for ", data.token_dtype(),
                                    " tokens, got ", data.separator_token()));
      }
    }
  } else if (!data.window_offset().empty() || data.concatenate() ||
             data.has_separator_token()) {
    return Invalid(
        "data.window_offset, data.concatenate and data.separator_token are "
        "for data.format \"tokens\"");
  }
  if (data.skip_corrupt() != 0) {
    if (data.format() != "tfrecord") {
      return Invalid(
          "data.skip_corrupt skips unreadable TFRecord records; it is for "
          "data.format \"tfrecord\" (the other formats are checked whole "
          "when they are opened)");
    }
    if (data.skip_corrupt() < 0 || data.skip_corrupt() > kMaxSkipCorrupt) {
      return Invalid(absl::StrCat(
          "data.skip_corrupt must be in [0, ", kMaxSkipCorrupt,
          "] (records a job may skip), got ", data.skip_corrupt()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTask(const v1::JobSpec& spec) {
  const v1::TaskSpec& task = spec.task();
  RETURN_IF_ERROR(CheckChoice(
      "task.type", task.type(),
      {"classification", "regression", "language_model", "custom"}));
  if (task.type() == "custom" && spec.model().torchscript().empty()) {
    return Invalid(
        "task.type \"custom\" trains a training-step module: set "
        "model.torchscript to a TorchScript module whose forward takes the "
        "batch's columns (Dict[str, Tensor]) and returns its \"loss\" "
        "(docs/MODELS.md)");
  }
  RETURN_IF_ERROR(CheckColumnName("task.input", task.input()));
  RETURN_IF_ERROR(CheckColumnName("task.target", task.target()));
  if (task.type() == "classification" && task.num_classes() < 2) {
    return Invalid(absl::StrCat("task.num_classes must be >= 2, got ",
                                task.num_classes()));
  }
  if (!(task.label_smoothing() >= 0 && task.label_smoothing() < 1)) {
    return Invalid(absl::StrCat("task.label_smoothing must be in [0, 1), got ",
                                task.label_smoothing()));
  }
  if (task.type() == "regression") {
    RETURN_IF_ERROR(
        CheckChoice("task.loss", task.loss(), {"mse", "l1", "huber"}));
  } else if (!task.loss().empty()) {
    return Invalid(absl::StrCat("task.loss is for task.type \"regression\"; ",
                                task.type(), " uses cross-entropy"));
  }
  const v1::ModelSpec& model = spec.model();
  const bool lm = task.type() == "language_model";
  if (model.name() == "gpt" && !lm) {
    return Invalid(
        absl::StrCat("model \"gpt\" is a language model; set task.type "
                     "\"language_model\" (the job's task is \"",
                     task.type(), "\")"));
  }
  if (lm && !model.name().empty() && model.name() != "gpt") {
    return Invalid(
        absl::StrCat("task.type \"language_model\" trains model "
                     "\"gpt\" or a TorchScript module, not \"",
                     model.name(), "\""));
  }
  if (lm && spec.data().format() != "tokens" && spec.data().format() != "npy" &&
      spec.data().format() != "tfrecord") {
    return Invalid(absl::StrCat(
        "task.type \"language_model\" reads token ids: use data.format "
        "\"tokens\" (or npy/tfrecord windows of ids), not \"",
        spec.data().format(), "\""));
  }
  if (model.name() == "gpt") {
    if (model.n_layer() < 1 || model.n_head() < 1 || model.n_embd() < 1 ||
        model.n_embd() % model.n_head() != 0) {
      return Invalid(absl::StrCat(
          "model.n_layer, n_head and n_embd must be >= 1 with n_embd a "
          "multiple of n_head, got ",
          model.n_layer(), ", ", model.n_head(), " and ", model.n_embd()));
    }
    if (model.vocab_size() < 0) {
      return Invalid("model.vocab_size must be >= 0 (0: from the data)");
    }
  } else if (model.has_fused()) {
    return Invalid(absl::StrCat(
        "model.fused chooses the gpt's attention kernels; model \"",
        model.name(), "\" has none: remove the field"));
  }
  return absl::OkStatus();
}

}  // namespace

void ApplyWorkloadDefaults(v1::JobSpec* spec) {
  v1::DataSpec* data = spec->mutable_data();
  if (data->format().empty()) data->set_format("idx");
  if (data->dir().empty()) data->set_dir(kDefaultDataDir);
  if (data->shuffle().empty()) data->set_shuffle("global");
  if (data->shuffle_block() == 0) data->set_shuffle_block(4096);
  if (data->format() == "tokens") {
    if (data->token_dtype().empty()) data->set_token_dtype("uint16");
    if (data->window_offset().empty()) data->set_window_offset("fixed");
    if (data->block_size() == 0) data->set_block_size(64);
    if (data->window_stride() == 0) {
      data->set_window_stride(data->block_size());
    }
  }
  v1::TaskSpec* task = spec->mutable_task();
  if (task->type().empty()) task->set_type("classification");
  if (task->type() == "classification" && task->num_classes() == 0) {
    task->set_num_classes(10);
  }
  if (task->type() == "regression" && task->loss().empty()) {
    task->set_loss("mse");
  }
  v1::ModelSpec* model = spec->mutable_model();
  if (model->name() == "gpt") {
    if (model->n_layer() == 0) model->set_n_layer(4);
    if (model->n_head() == 0) model->set_n_head(4);
    if (model->n_embd() == 0) model->set_n_embd(128);
    if (!model->has_fused()) model->set_fused(true);
  }
  v1::OptimizerSpec* optimizer = spec->mutable_optimizer();
  if (!optimizer->has_beta1()) optimizer->set_beta1(0.9);
  if (!optimizer->has_beta2()) optimizer->set_beta2(0.999);
}

absl::Status ValidateWorkload(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(ValidateData(spec.data()));
  RETURN_IF_ERROR(ValidateTask(spec));
  const v1::OptimizerSpec& optimizer = spec.optimizer();
  if (!(optimizer.beta1() >= 0 && optimizer.beta1() < 1 &&
        optimizer.beta2() >= 0 && optimizer.beta2() < 1)) {
    return Invalid(
        absl::StrCat("optimizer.beta1 and beta2 must be in [0, 1), got ",
                     optimizer.beta1(), " and ", optimizer.beta2()));
  }
  return absl::OkStatus();
}

}  // namespace lockstep::internal
