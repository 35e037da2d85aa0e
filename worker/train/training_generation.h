// One generation of one job on this rank (docs/DESIGN.md §3): the ranks
// connect and load their data, agree on the state to continue from, then
// take synchronous steps (forward, backward with bucketed all-reduces,
// optimizer) until the plan's last step or a stop every rank agreed on,
// evaluating after each epoch and saving checkpoints as the job asks.
//
// Lifecycle: constructed for one assignment, Run() once, destroyed. The
// replica it trains outlives it; everything else (communicator, data
// pipeline, gradient buckets, checkpointer) is the generation's own.
// Thread-compatible: the agent's task thread runs it; an abort reaches it
// through the TaskContext, which closes its communicator.
#ifndef LOCKSTEP_WORKER_TRAIN_TRAINING_GENERATION_H_
#define LOCKSTEP_WORKER_TRAIN_TRAINING_GENERATION_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/collective/algorithm_probe.h"
#include "worker/collective/communicator.h"
#include "worker/collective/counting_communicator.h"
#include "worker/data/sampler.h"
#include "worker/task_context.h"
#include "worker/train/batch_assembler.h"
#include "worker/train/batch_source.h"
#include "worker/train/gradient_reducer.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/progress_reporter.h"
#include "worker/train/replica.h"
#include "worker/train/replica_checkpoint.h"
#include "worker/train/skip_reporter.h"
#include "worker/train/state_agreement.h"
#include "worker/train/step_metrics.h"
#include "worker/train/task.h"

namespace lockstep::worker {

class TrainingGeneration {
 public:
  // Trains `replica` on `device`, this worker's.
  TrainingGeneration(TaskContext& task, Replica& replica, torch::Device device);
  ~TrainingGeneration();
  TrainingGeneration(const TrainingGeneration&) = delete;
  TrainingGeneration& operator=(const TrainingGeneration&) = delete;

  // Trains to the end of the generation. Errors: Aborted when the
  // generation was aborted; Unavailable, DeadlineExceeded when a peer
  // failed (the job re-forms); any other code fails the job.
  absl::StatusOr<v1::TaskResult> Run();

  // Where the replica stands, once setup planned the generation (the batch
  // plan, epoch length, learning rate and model label a checkpoint of it
  // records); nullopt if the generation ended before that.
  std::optional<ReplicaPosition> LastPosition() const;

 private:
  // The backend every rank of the generation uses.
  std::string Backend() const;
  // Refuses what this worker cannot train (NCCL or fp16 without a GPU).
  absl::Status CheckSupported() const;
  absl::StatusOr<std::unique_ptr<Communicator>> Connect();
  absl::Status Setup();
  // Connects to the other ranks while the data loads: both are on the
  // critical path back to training.
  absl::Status ConnectAndLoad(absl::Time* connected);
  // Splits the global batch over this generation's ranks.
  absl::Status PlanBatches();
  // communication.algorithm "auto": times both CPU algorithms on a buffer
  // the size of a gradient bucket and runs the faster (3 ranks or more; on
  // 2 both sum the same way).
  absl::Status ChooseAlgorithm(size_t bucket_bytes);
  // The CPU all-reduce algorithm this generation runs ("" with NCCL or one
  // rank).
  std::string AlgorithmName() const;
  absl::Status StartPipeline();
  void LogPlan(absl::Duration setup, absl::Duration rendezvous,
               absl::Duration loaded) const;
  v1::TrainingPlan TrainingPlanOf() const;
  // The job's model for its task's shapes.
  ModelOptions Model() const;
  // The sampler of this rank under the job's data.shuffle.
  GlobalSampler MakeSampler() const;
  ReplicaPosition Position() const;

  // Run's set-up and steps.
  absl::StatusOr<v1::TaskResult> Train();
  // One optimizer step; sets *stop when any rank asked to stop.
  absl::Status Step(bool* stop);
  // The loss of samples [begin, begin + count) of `batch`.
  torch::Tensor MicroBatchLoss(const Batch& batch, int64_t begin,
                               int64_t count);
  // A training-step module's evaluation of `batch` (`count` samples) added
  // to `sums`: the loss weighted by the samples, the samples, then each of
  // the module's sums.
  absl::Status AddCustomSums(const Batch& batch, int64_t count,
                             std::vector<double>* sums);
  // Applies the averaged gradients unless fp16 overflowed.
  absl::Status ApplyGradients(int64_t step);
  // Evaluates every test sample once (this rank's share), or with `subset`
  // the fixed eval_batches x global batch samples of a scheduled
  // evaluation, all-reduces the sums, and keeps the metrics in the replica.
  // Returns the samples read.
  absl::StatusOr<int64_t> Evaluate(bool subset = false);
  // Saves when the job's checkpoint rules say so (and on a stop).
  absl::Status MaybeSave(int64_t step, bool epoch_end, bool stop);
  // The chief's work after the last step: export, then drop the backups.
  absl::Status Finalize();
  absl::StatusOr<v1::TaskResult> Result(int64_t first_step, bool stop) const;

  TaskContext& task_;
  Replica& replica_;
  const v1::JobSpec& spec_;
  const int rank_;
  const int world_;
  const torch::Device device_;

  // The data plane, and the counting view of it every collective goes
  // through. Declared first: everything below may use it until destroyed.
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<CountingCommunicator> counted_;

  // The job's data and what it learns from it.
  std::shared_ptr<const SplitSource> train_;
  std::shared_ptr<const SplitSource> test_;
  Task learning_;
  std::unique_ptr<BatchAssembler> train_assembler_;
  std::unique_ptr<BatchAssembler> test_assembler_;
  std::vector<std::string> column_names_;  // a training-step module's
  BatchPlan plan_;
  std::optional<AlgorithmProbe> probe_;         // set when "auto" chose
  std::unique_ptr<Checkpointer> checkpointer_;  // null without backup_dir
  AgreedState agreed_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<RunningStatistics> statistics_;
  std::unique_ptr<GlobalSampler> sampler_;
  int64_t total_steps_ = 0;
  std::unique_ptr<LrSchedule> lr_;
  // Orders the gradient copies and their reduction (a GPU's streams).
  std::unique_ptr<BucketHandoff> handoff_;
  // Gradients of every parameter, then this rank's loss and stop vote.
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<BatchSource> batches_;
  std::unique_ptr<ProgressReporter> reporter_;  // the chief's only
  SkipReporter skips_;
  bool preempted_ = false;
  // How the save of a stop went (checkpoints configured, stopped).
  std::optional<absl::Status> stop_save_;

  absl::Time train_start_;
  absl::Duration eval_time_;
  StepMetrics metrics_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TRAINING_GENERATION_H_
