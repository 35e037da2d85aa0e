// Prepares the batches of the next steps on a background thread while the
// current step computes: for each step, the sampler's slice of the global
// batch for this rank (docs/DESIGN.md §4), read from the split and
// assembled into the task's tensors (BatchAssembler).
//
// A bounded ring of kDepth reused tensors: no allocation per step, and the
// thread never runs more than kDepth steps ahead. A slot belongs to the
// thread while it is not ready and to the training thread from Take(step)
// to Release(step).
//
// Thread-safety: Take and Release are called by one training thread; the
// prefetch thread is the object's own.
#ifndef LOCKSTEP_WORKER_TRAIN_PREFETCHER_H_
#define LOCKSTEP_WORKER_TRAIN_PREFETCHER_H_

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/job_spec.h"
#include "worker/data/sampler.h"
#include "worker/train/batch_assembler.h"
#include "worker/train/batch_source.h"

namespace lockstep::worker {

class Prefetcher : public BatchSource {
 public:
  static constexpr int kDepth = 2;

  // Prepares the batches of steps [first_step, end_step) of `rank` under
  // `plan`, in the order `sampler` gives. `assembler` must outlive the
  // prefetcher. `pinned`: the slots are in page-locked memory, for
  // asynchronous copies to a GPU; the caller releases a slot only once its
  // copy completed.
  Prefetcher(const BatchAssembler& assembler, GlobalSampler sampler,
             const BatchPlan& plan, int64_t first_step, int64_t end_step,
             bool pinned = false);
  ~Prefetcher() override;
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The inputs and targets of `step`, the next one not yet taken, once they
  // are ready. Valid until Release(step). Errors: the data's (a corrupt
  // record, a label out of range), naming the sample.
  absl::StatusOr<Batch> Take(int64_t step) override;
  // Hands the slot of `step` back to the thread.
  void Release(int64_t step) override;

 private:
  struct Buffers {
    Batch batch;
    std::vector<char> scratch;
  };
  struct SlotState {
    int64_t step = -1;
    bool ready = false;
    absl::Status status;  // how filling it went
  };

  void Loop();

  const BatchAssembler& assembler_;
  const int64_t end_;
  GlobalSampler sampler_;  // the thread's only
  // Written by the thread while its slot is not ready, read by the training
  // thread while it is: the slot state hands them over.
  std::array<Buffers, kDepth> buffers_;

  absl::Mutex mu_;
  std::array<SlotState, kDepth> slots_ ABSL_GUARDED_BY(mu_);
  int64_t next_ ABSL_GUARDED_BY(mu_);  // the next step the thread fills
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: started once everything above exists
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_PREFETCHER_H_
