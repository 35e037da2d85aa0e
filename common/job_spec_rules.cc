// The rules of a job's learning-rate schedule, step counts, optimizer and
// checkpoints (job_spec_internal.h).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "common/status_macros.h"

namespace lockstep::internal {

// The learning rate, its decay and the step counts.
absl::Status ValidateSchedule(const v1::JobSpec& spec) {
  if (!(spec.base_lr() > 0)) {
    return Invalid(
        absl::StrCat("base_lr must be positive, got ", spec.base_lr()));
  }
  RETURN_IF_ERROR(
      CheckChoice("lr_decay", spec.lr_decay(), {"constant", "cosine", "step"}));
  if (spec.lr_decay() == "step" && spec.lr_decay_steps() <= 0) {
    return Invalid(
        "lr_decay \"step\" needs lr_decay_steps > 0 (optimizer steps between "
        "decays)");
  }
  if (!(spec.lr_decay_rate() > 0 && spec.lr_decay_rate() <= 1)) {
    return Invalid(absl::StrCat("lr_decay_rate must be in (0, 1], got ",
                                spec.lr_decay_rate()));
  }
  if (spec.min_lr() < 0 || spec.clip_grad_norm() < 0 ||
      spec.lr_decay_steps() < 0) {
    return Invalid("min_lr, lr_decay_steps and clip_grad_norm must be >= 0");
  }
  if (spec.accumulation_steps() < 0) {
    return Invalid(absl::StrCat("accumulation_steps must be >= 0, got ",
                                spec.accumulation_steps()));
  }
  if (spec.reference_batch_size() < 0 || spec.warmup_steps() < 0 ||
      spec.max_steps() < 0 || spec.log_every_steps() < 0) {
    return Invalid(
        "reference_batch_size, warmup_steps, max_steps and log_every_steps "
        "must be >= 0");
  }
  if (spec.eval_every_steps() < 0 || spec.eval_batches() < 0) {
    return Invalid(
        absl::StrCat("eval_every_steps and eval_batches must be >= 0, got ",
                     spec.eval_every_steps(), " and ", spec.eval_batches()));
  }
  if (spec.eval_batches() > 0 && spec.eval_every_steps() == 0) {
    return Invalid(
        "eval_batches sizes the evaluations eval_every_steps schedules; set "
        "eval_every_steps too (the evaluations after each epoch and at the "
        "end read the whole test split)");
  }
  return absl::OkStatus();
}

// The optimizer's hyperparameters, the checkpoints, and what one replica's
// batch would take.
absl::Status ValidateOptimizerAndCheckpoints(const v1::JobSpec& spec) {
  const v1::OptimizerSpec& opt = spec.optimizer();
  if (opt.momentum() < 0 || opt.momentum() >= 1) {
    return Invalid(absl::StrCat("optimizer.momentum must be in [0, 1), got ",
                                opt.momentum()));
  }
  if (opt.weight_decay() < 0) {
    return Invalid(absl::StrCat("optimizer.weight_decay must be >= 0, got ",
                                opt.weight_decay()));
  }
  const v1::CheckpointSpec& ckpt = spec.checkpoint();
  if (ckpt.save_every_steps() < 0 || ckpt.keep() < 1) {
    return Invalid(absl::StrCat(
        "checkpoint.save_every_steps must be >= 0 and checkpoint.keep >= 1, "
        "got ",
        ckpt.save_every_steps(), " and ", ckpt.keep()));
  }
  if (ckpt.backup_dir().empty() &&
      (ckpt.save_every_steps() > 0 || ckpt.save_every_epoch())) {
    return Invalid(
        "checkpoint.save_every_steps/save_every_epoch need "
        "checkpoint.backup_dir: a shared folder every worker can write");
  }
  if (ckpt.backup_dir().empty() && ckpt.upload_last()) {
    return Invalid(
        "checkpoint.upload_last needs checkpoint.backup_dir: the job saves "
        "no checkpoint to upload without one");
  }
  if (spec.has_per_replica_batch_size() &&
      int64_t{spec.per_replica_batch_size()} *
              std::max(1, spec.accumulation_steps()) >
          kMaxGlobalBatch) {
    return Invalid(absl::StrCat(
        "per_replica_batch_size x accumulation_steps is ",
        spec.per_replica_batch_size(), " x ", spec.accumulation_steps(),
        ", more than the largest global batch, ", kMaxGlobalBatch,
        ", on one replica"));
  }
  return absl::OkStatus();
}

}  // namespace lockstep::internal
