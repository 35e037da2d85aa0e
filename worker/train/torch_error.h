// LibTorch's exception messages as one sentence for a Status: what() of a
// c10::Error carries the message, then "Exception raised from ..." and a
// multi-line C++ backtrace that no user should read as a job's error.
#ifndef LOCKSTEP_WORKER_TRAIN_TORCH_ERROR_H_
#define LOCKSTEP_WORKER_TRAIN_TORCH_ERROR_H_

#include <string>

#include "absl/strings/string_view.h"

namespace lockstep::worker {

// The first non-empty line of `what` without surrounding whitespace, or
// "an error without a message" when there is none. Torch-free, so callers
// pass e.what() of any std::exception.
std::string TorchErrorSentence(absl::string_view what);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TORCH_ERROR_H_
