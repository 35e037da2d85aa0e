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

// The CPU kernels of a generation's workers (GPUs are not checked). Every
// job: ATen's unvectorized kernels (capability DEFAULT) round the
// optimizer's elementwise arithmetic otherwise than its AVX2 and AVX-512
// ones (no fused multiply-add), so ranks that mix them take different steps
// from the same averaged gradient and their replicas drift apart; such a
// mix is refused before anything trains. A job that asks for reproducible
// results (JobSpec.reproducible) runs only on workers whose kernels are
// the portable ones (OpenBLAS "Haswell", ATen "AVX2", oneDNN "AVX2").
// Errors: FailedPrecondition naming the first worker at fault, and what to
// set.
absl::Status CheckKernels(const v1::JobSpec& spec,
                          const std::vector<Worker*>& workers);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_BACKEND_CHOICE_H_
