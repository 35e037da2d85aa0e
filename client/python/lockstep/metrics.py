"""A job's training curve as a pandas DataFrame: the loss history (paged
from the coordinator), the learning rate each step was taken with (as the
workers reported it), and the test-set evaluations."""
import math

from lockstep.errors import Aborted
from lockstep.v1 import coordinator_pb2

# A history whose stride changes while it is read (it passed 2^20 steps and
# was thinned) is read again from the start, at most this often.
_HISTORY_RETRIES = 3


def state_name(state):
    """"running", "succeeded", ... as the CLI prints a JobState."""
    return coordinator_pb2.JobState.Name(state)[len("JOB_STATE_"):].lower()


def global_batch(status):
    """The job's global batch (as client/views.cc's GlobalBatch)."""
    if status.plan.global_batch_size > 0:
        return status.plan.global_batch_size
    spec = status.spec
    if spec.HasField("global_batch_size"):
        return spec.global_batch_size
    return spec.per_replica_batch_size * max(1, status.world_size)


def history_step(status, index):
    """The optimizer step (1-based) of loss `index` of the whole history."""
    return index * max(1, status.loss_stride) + 1


def history_reader(job_id):
    """Reads a job's whole loss history, without doing the calls itself (so
    that lockstep.Client and lockstep.aio share it): a generator that yields
    each GetJobStatusRequest it needs, is sent each answer's JobStatus, and
    returns the status with the whole history in step_losses (and the
    learning rates beside the losses in step_lrs, where the job's workers
    reported them). A history
    that changes under the reader (thinned to a new stride, or rewritten by
    a resume) is read again from the start, a few times at most."""
    for _ in range(_HISTORY_RETRIES):
        losses = []
        lrs = []
        status = None
        offset = 0
        size = 0  # a history only grows while steps are trained
        while True:
            page = yield coordinator_pb2.GetJobStatusRequest(
                job_id=job_id, include_history=True, history_offset=offset)
            if status is None:
                status = page
            elif (page.loss_stride != status.loss_stride or
                  page.history_offset != offset or
                  page.history_size < size):
                break  # thinned, or shortened by a resume: start over
            size = page.history_size
            losses.extend(page.step_losses)
            lrs.extend(page.step_lrs)
            offset = page.history_offset + len(page.step_losses)
            if not page.step_losses or offset >= page.history_size:
                del status.step_losses[:]
                status.step_losses.extend(losses)
                del status.step_lrs[:]
                if len(lrs) == len(losses):
                    status.step_lrs.extend(lrs)
                return status
    raise Aborted("the loss history of %s kept changing while it was read; "
                  "try again" % job_id)


def fetch_history(get_status, job_id):
    """The job's status with its whole loss history in step_losses.
    `get_status(request)` makes one GetJobStatus call."""
    reader = history_reader(job_id)
    request = next(reader)
    while True:
        try:
            request = reader.send(get_status(request).jobs[0])
        except StopIteration as done:
            return done.value


def frame(status):
    """The DataFrame of `status` (with its whole history): one row per step
    of the history (every step's until 2^20 steps, then every
    loss_stride-th), columns step, samples_seen, loss, lr (the learning rate
    the workers reported for the step; NaN where they reported none) and
    the test
    metrics at the steps where the test set was evaluated (test_accuracy,
    test_loss, test_perplexity, ...; NaN elsewhere). An evaluation at a step
    the history thinned out gets its own row with a NaN loss."""
    import pandas  # pylint: disable=import-outside-toplevel

    batch = global_batch(status)
    rows = {}
    lrs = status.step_lrs if len(status.step_lrs) == len(
        status.step_losses) else None
    for index, loss in enumerate(status.step_losses):
        step = history_step(status, index)
        rows[step] = {"step": step, "loss": float(loss),
                      "lr": float(lrs[index]) if lrs else math.nan}
    metric_names = []
    for point in status.evals:
        row = rows.setdefault(point.step, {"step": point.step,
                                           "loss": math.nan})
        metrics = dict(point.metrics)
        if not metrics or "test_accuracy" in metrics:
            metrics.setdefault("test_accuracy", point.test_accuracy)
        metrics.setdefault("test_loss", point.test_loss)
        for name, value in metrics.items():
            row[name] = value
            if name not in metric_names:
                metric_names.append(name)
        row["epoch"] = point.epoch + 1
    columns = ["step", "samples_seen", "loss", "lr"] + sorted(metric_names)
    if status.evals:
        columns.append("epoch")
    ordered = [rows[step] for step in sorted(rows)]
    for row in ordered:
        row["samples_seen"] = row["step"] * batch
        row.setdefault("lr", math.nan)
    table = pandas.DataFrame(ordered, columns=columns)
    table.attrs["job_id"] = status.job_id
    return table
