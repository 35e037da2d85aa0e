// The splits of the job's data set a worker holds across generations: each
// split is opened once per process (IDX files decoded, npy and token files
// mapped, TFRecord files indexed) and kept, so that the next generation of
// the job, or a spare given a rank, does not open it again.
#ifndef LOCKSTEP_WORKER_TRAIN_DATA_CACHE_H_
#define LOCKSTEP_WORKER_TRAIN_DATA_CACHE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "lockstep/v1/job.pb.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {

// The training or test split of `spec` (OpenSplit), cached by the data
// spec and split. The cache holds one data set at a time: loading another
// drops the other's splits, so a worker that trains job after job holds at
// most one data set besides the one a running generation uses.
// Thread-safe. Errors name the file that is missing or malformed.
absl::StatusOr<std::shared_ptr<const SplitSource>> LoadSplit(
    const v1::DataSpec& spec, bool train);

// Drops the cached splits (a job ended here; its next job may bring other
// data). Splits a running generation holds stay valid. Thread-safe.
void ForgetCachedData();

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_DATA_CACHE_H_
