// Whether finished runs computed the same function (issue 53: one
// implementation, served by the coordinator's CompareJobs to `lockstep
// compare` and lockstep.compare alike): a verdict for each pair of runs,
// and the warnings that explain diverging curves.
//
// The same function: every setting of the job spec but where and how it
// runs, saves and reports (kNotTheFunction in the .cc), the same global
// batch, scaled LR and schedule length, trained for the same steps. On one
// world size the models are then bit-identical (the same digest); across
// world sizes the gradient is summed in another floating-point order
// (docs/DESIGN.md, "Determinism"), so the digests differ and the verdict
// gives the largest gap between the loss curves.
//
// Pure functions of the statuses (with their loss histories).
#ifndef LOCKSTEP_COMMON_RUN_COMPARISON_H_
#define LOCKSTEP_COMMON_RUN_COMPARISON_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/v1/coordinator.pb.h"

namespace lockstep {

// The job's global batch: its plan's, else what its spec asks for.
int GlobalBatch(const v1::JobStatus& status);

// The step whose loss is the history's `index`th (JobStatus.loss_stride:
// past 2^20 steps the history keeps every second loss, then every fourth...).
int64_t HistoryStep(const v1::JobStatus& status, int index);

// The learning rate the workers reported for the history's `index`th loss
// (JobStatus.step_lrs); none where they reported none (older workers).
std::optional<double> HistoryLr(const v1::JobStatus& status, int index);

// {dotted field: JSON value} of every setting that decides the function a
// run computes: the job spec without the fields that do not, the gradient's
// wire format (the one part of `communication` that rounds it), and the
// global batch, scaled LR and total steps of its plan.
std::map<std::string, std::string> FunctionSettings(const v1::JobStatus& job);

struct RunVerdict {
  bool same_function = false;
  // "a-1 and b-2: same function on 1 and 2 workers: ..." or what differs.
  std::string text;
};
RunVerdict CompareRuns(const v1::JobStatus& a, const v1::JobStatus& b);
// Every pair, in order: (0,1), (0,2), ..., (1,2), ...
std::vector<RunVerdict> CompareAllRuns(const std::vector<v1::JobStatus>& jobs);

// What explains diverging curves: the runs differ in global batch, in
// lr_scaling, or in learning rate at the same global batch.
std::vector<std::string> CompareWarnings(
    const std::vector<v1::JobStatus>& jobs);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_RUN_COMPARISON_H_
