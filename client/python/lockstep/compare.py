"""Runs compared side by side: one DataFrame of their curves keyed by job
and step, a matplotlib figure, and for each pair whether the runs computed
the same function or what differs, with the warnings that explain diverging
curves. The verdicts and warnings are the coordinator's (CompareJobs,
common/run_comparison.h): `lockstep compare` shows the same ones."""
import base64
import html
import io

from lockstep import metrics as metrics_lib
from lockstep.errors import FailedPrecondition, InvalidArgument
from lockstep.v1 import coordinator_pb2

class Comparison:
    """What compare() returns.

    frame: DataFrame indexed by (job, step) with the columns of
        Job.metrics().
    summary: DataFrame, one row per job: replicas, per-replica and global
        batch, accumulation, precision, seed, scaled LR, steps, final loss,
        test metrics, samples/s, digest.
    verdicts: one sentence per pair of jobs (in the order of
        itertools.combinations): "same function" or what differs.
    warnings: what explains diverging curves (another global batch,
        lr_scaling, or learning rate), as `lockstep compare` warns.
    figure: the matplotlib Figure of the curves (None with plot=False).
    """

    def __init__(self, frame, summary, pairs, figure, warnings=()):
        self.frame = frame
        self.summary = summary
        self._same = [same for same, _ in pairs]
        self.verdicts = [text for _, text in pairs]
        self.warnings = list(warnings)
        self.figure = figure

    def same_function(self):
        """Whether every pair of runs computed the same function."""
        return all(self._same)

    def save(self, path):
        """Writes the figure (PNG, SVG or PDF by the file's extension)."""
        if self.figure is None:
            raise FailedPrecondition(
                "this comparison has no figure: compare(..., plot=False) "
                "made none; compare again with plot=True to save one")
        self.figure.savefig(path)

    def _repr_html_(self):
        """The verdicts, the warnings, the summary table and the figure, in a
        notebook."""
        parts = ["<p>lockstep.Comparison of %d jobs</p><ul>%s</ul>" % (
            len(self.summary), "".join("<li>%s</li>" % html.escape(text)
                                       for text in self.verdicts +
                                       ["warning: " + w
                                        for w in self.warnings])),
                 self.summary.to_html()]
        if self.figure is not None:
            png = io.BytesIO()
            self.figure.savefig(png, format="png")
            parts.append("<img src='data:image/png;base64,%s'/>"
                         % base64.b64encode(png.getvalue()).decode("ascii"))
        return "".join(parts)

    def __repr__(self):
        return "\n".join(["lockstep.Comparison of %d jobs" % len(self.summary)]
                         + self.verdicts +
                         ["warning: " + w for w in self.warnings])


def _digest(status):
    return status.ranks[0].model_digest if status.ranks else ""


def _settings(status):
    """The settings the summary shows, as (name, value)."""
    spec = status.spec
    return [
        ("global batch", metrics_lib.global_batch(status)),
        ("seed", spec.seed),
        ("precision", spec.precision or "fp32"),
        ("accumulation_steps", max(1, spec.accumulation_steps)),
        ("lr_scaling", spec.lr_scaling or "none"),
        ("scaled LR", "%.6g" % status.plan.scaled_lr),
        ("model", spec.model.name or spec.model.torchscript),
        ("optimizer", spec.optimizer.type),
        ("data", spec.data.dir or spec.data.format),
        ("reproducible", spec.reproducible),
    ]


def compare(jobs, plot=True, client=None):
    """Compares finished runs: `jobs` are Job objects of one coordinator,
    or job ids of `client`. Returns a Comparison with the curves in one
    DataFrame keyed by (job, step), a per-job summary, the coordinator's
    verdict for each pair and warnings, and, unless plot=False, a matplotlib
    Figure of the loss by step and by samples seen and of the test loss at
    each evaluation."""
    import pandas  # pylint: disable=import-outside-toplevel

    resolved = []
    for job in jobs:
        if isinstance(job, str):
            if client is None:
                raise InvalidArgument(
                    "compare(): %r is a job id; pass client= to say whose "
                    "(or Job objects)" % job)
            job = client.job(job)
        resolved.append(job)
    statuses = [job.status(history=True) for job in resolved]
    frames = []
    rows = []
    for status in statuses:
        table = metrics_lib.frame(status)
        table.insert(0, "job", status.job_id)
        frames.append(table)
        row = {"job": status.job_id,
               "state": metrics_lib.state_name(status.state),
               "replicas": status.plan.replicas,
               "per_replica_batch": status.plan.per_replica_batch_size}
        row.update({name.replace(" ", "_"): value
                    for name, value in _settings(status)})
        row.update({"steps": status.step, "final_loss": status.loss,
                    "samples_per_second": status.samples_per_second,
                    "digest": _digest(status)})
        row.update(dict(status.test_metrics))
        rows.append(row)
    frame = pandas.concat(frames, ignore_index=True).set_index(["job", "step"])
    summary = pandas.DataFrame(rows).set_index("job")
    addresses = {job.client.address for job in resolved}
    if len(addresses) > 1:
        raise InvalidArgument(
            "compare(): the jobs are on %d coordinators (%s); the verdicts "
            "are a coordinator's, so compare jobs of one"
            % (len(addresses), ", ".join(sorted(addresses))))
    compared = resolved[0].client._call(
        "CompareJobs", coordinator_pb2.CompareJobsRequest(
            job_ids=[status.job_id for status in statuses]), timeout=60)
    pairs = [(v.same_function, v.text) for v in compared.verdicts]
    figure = _plot(statuses, frames) if plot else None
    return Comparison(frame, summary, pairs, figure, compared.warnings)


def _plot(statuses, frames):
    # The Figure API needs no display and no pyplot state: fine headless.
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    figure = Figure(figsize=(15, 4.5), layout="constrained")
    by_step, by_samples, evals = figure.subplots(1, 3)
    for status, table in zip(statuses, frames):
        label = "%s (%dx%d)" % (status.job_id, status.plan.replicas,
                                status.plan.per_replica_batch_size)
        losses = table.dropna(subset=["loss"])
        by_step.plot(losses["step"], losses["loss"], label=label, linewidth=1)
        by_samples.plot(losses["samples_seen"], losses["loss"], label=label,
                        linewidth=1)
        if "test_loss" in table:
            tested = table.dropna(subset=["test_loss"])
            evals.plot(tested["step"], tested["test_loss"], marker="o",
                       label=label)
    for axes, title, xlabel in (
            (by_step, "training loss by step", "optimizer step"),
            (by_samples, "training loss by samples seen", "samples seen"),
            (evals, "test loss at each evaluation", "optimizer step")):
        axes.set_title(title)
        axes.set_xlabel(xlabel)
        axes.grid(alpha=0.3)
    by_step.legend(fontsize="small")
    return figure
