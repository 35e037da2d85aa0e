// What job_spec.cc shares with job_spec_workload.cc: the error every rule
// returns, the check of a field that names a choice, and the rules and
// defaults of the workload's fields (data, task, model sizes).
#ifndef LOCKSTEP_COMMON_JOB_SPEC_INTERNAL_H_
#define LOCKSTEP_COMMON_JOB_SPEC_INTERNAL_H_

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "lockstep/v1/job.pb.h"

namespace lockstep::internal {

// InvalidArgument "job spec: <message>".
absl::Status Invalid(absl::string_view message);

bool OneOf(const std::string& value, std::initializer_list<const char*> set);

// InvalidArgument naming `field`, its value and the choices, unless `value`
// is one of `set`.
absl::Status CheckChoice(absl::string_view field, const std::string& value,
                         std::initializer_list<const char*> set);

// The learning rate, its decay and the step counts.
absl::Status ValidateSchedule(const v1::JobSpec& spec);

// The optimizer's hyperparameters, the checkpoints, and what one replica's
// batch would take.
absl::Status ValidateOptimizerAndCheckpoints(const v1::JobSpec& spec);

// The defaults of data.*, task.* and the gpt model's sizes.
void ApplyWorkloadDefaults(v1::JobSpec* spec);

// The rules of data.*, task.* and the model's fit to the task: the choices,
// the declared columns (data.features, bounded: its entries are not reached
// by the generic bounds check), globs that stay inside data.dir, and which
// model trains which task.
absl::Status ValidateWorkload(const v1::JobSpec& spec);

}  // namespace lockstep::internal

#endif  // LOCKSTEP_COMMON_JOB_SPEC_INTERNAL_H_
