// Which collective backend a generation uses: the coordinator's choice,
// from the job's communication.backend and the devices its ranks' workers
// registered with, made once per generation so every rank uses the same.
#ifndef LOCKSTEP_COORDINATOR_BACKEND_CHOICE_H_
#define LOCKSTEP_COORDINATOR_BACKEND_CHOICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/worker_registry.h"

namespace lockstep::coordinator {

struct Backend {
  std::string name;  // "gloo" or "nccl"
  std::string why;   // why "auto" chose Gloo; empty otherwise
};

// The backend of a generation on `workers` (rank order) for the job's
// `spec`: "auto" is NCCL when every rank has a GPU of its own (NCCL refuses
// two ranks on one GPU) and the job asks for no gradient compression (a
// Gloo wire format), Gloo otherwise. Errors: FailedPrecondition when the
// job asks for "nccl" and a rank has no GPU, or two ranks share one; the
// message names them.
absl::StatusOr<Backend> ResolveBackend(const v1::CommunicationSpec& spec,
                                       const std::vector<Worker*>& workers);

// A job that asks for reproducible results (JobSpec.reproducible) runs only
// on workers whose CPU kernels are the portable ones (OpenBLAS "Haswell",
// ATen "AVX2"; GPUs are not checked). Errors: FailedPrecondition naming the
// first worker that runs others, and what to set.
absl::Status CheckReproducible(const v1::JobSpec& spec,
                               const std::vector<Worker*>& workers);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_BACKEND_CHOICE_H_
