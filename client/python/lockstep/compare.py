"""Runs compared side by side: one DataFrame of their curves keyed by job
and step, a matplotlib figure, and for each pair whether the runs computed
the same function or what differs (the CLI's `lockstep compare`)."""
import base64
import html
import io
import itertools
import json

from google.protobuf import json_format

from lockstep import metrics as metrics_lib
from lockstep.errors import FailedPrecondition, InvalidArgument

# Fields of a job spec that do not change the function a run computes: where
# and how it runs, saves and reports (the steps it trains are compared on
# their own, and the schedule's length through the plan's total steps). The
# same list as client/curve_commands.cc's.
_NOT_THE_FUNCTION = (
    "name", "num_workers", "per_replica_batch_size", "global_batch_size",
    "min_workers", "max_workers", "max_restarts", "communication",
    "checkpoint", "export_path", "export_format", "priority", "priority_class",
    "placement", "log_every_steps", "eval_every_steps", "eval_batches",
    "reproducible", "epochs", "max_steps")


class Comparison:
    """What compare() returns.

    frame: DataFrame indexed by (job, step) with the columns of
        Job.metrics().
    summary: DataFrame, one row per job: replicas, per-replica and global
        batch, accumulation, precision, seed, scaled LR, steps, final loss,
        test metrics, samples/s, digest.
    verdicts: one sentence per pair of jobs (in the order of
        itertools.combinations): "same function" or what differs.
    figure: the matplotlib Figure of the curves (None with plot=False).
    """

    def __init__(self, frame, summary, pairs, figure):
        self.frame = frame
        self.summary = summary
        self._same = [same for same, _ in pairs]
        self.verdicts = [text for _, text in pairs]
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
        """The verdicts, the summary table and the figure, in a notebook."""
        parts = ["<p>lockstep.Comparison of %d jobs</p><ul>%s</ul>" % (
            len(self.summary), "".join("<li>%s</li>" % html.escape(text)
                                       for text in self.verdicts)),
                 self.summary.to_html()]
        if self.figure is not None:
            png = io.BytesIO()
            self.figure.savefig(png, format="png")
            parts.append("<img src='data:image/png;base64,%s'/>"
                         % base64.b64encode(png.getvalue()).decode("ascii"))
        return "".join(parts)

    def __repr__(self):
        return "\n".join(["lockstep.Comparison of %d jobs" % len(self.summary)]
                         + self.verdicts)


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


def _flatten(tree, prefix, out):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            _flatten(value, prefix + key + ".", out)
        else:
            out[prefix + key] = json.dumps(value, sort_keys=True)


def _function_settings(status):
    """{dotted field: JSON value} of every setting that decides the
    function a run computes: the job spec without _NOT_THE_FUNCTION, the
    gradient's wire format (the one part of communication that rounds it),
    and the global batch, scaled LR and total steps of its plan."""
    tree = json_format.MessageToDict(status.spec,
                                     preserving_proto_field_name=True)
    for name in _NOT_THE_FUNCTION:
        tree.pop(name, None)
    flat = {}
    _flatten(tree, "", flat)
    flat["communication.compression"] = json.dumps(
        status.spec.communication.compression or "none")
    flat["global batch"] = str(metrics_lib.global_batch(status))
    flat["scaled LR"] = "%.6g" % status.plan.scaled_lr
    flat["total steps"] = str(status.plan.total_steps)
    return flat


def _loss_gap(a, b):
    """(the largest difference of the two loss histories over their common
    steps, how many steps they share)."""
    losses_a = {metrics_lib.history_step(a, i): loss
                for i, loss in enumerate(a.step_losses)}
    gaps = [abs(losses_a[metrics_lib.history_step(b, i)] - loss)
            for i, loss in enumerate(b.step_losses)
            if metrics_lib.history_step(b, i) in losses_a]
    return (max(gaps) if gaps else 0.0), len(gaps)


def verdict(a, b):
    """(whether two finished runs computed the same function, one sentence
    saying so or what differs). `a` and `b` are final JobStatus with their
    loss histories. The same function: every setting of the job spec but
    where and how it runs, saves and reports (_NOT_THE_FUNCTION), the same
    global batch, scaled LR and schedule length, trained for the same
    steps. Then on one world size the models are bit-identical
    (the same digest); across world sizes the gradient is summed in another
    floating-point order (docs/DESIGN.md, "Determinism"), so the digests
    differ and the sentence gives the largest gap between the loss curves.
    """
    names = "%s and %s" % (a.job_id, b.job_id)
    if a.plan.replicas != b.plan.replicas:
        workers = "%d and %d workers" % (a.plan.replicas, b.plan.replicas)
    else:
        workers = "%d workers each" % a.plan.replicas
    da, db = _digest(a), _digest(b)
    if not da or not db:
        return False, ("%s: cannot tell yet: %s has no final model digest "
                       "(it has not succeeded)"
                       % (names, a.job_id if not da else b.job_id))
    sa, sb = _function_settings(a), _function_settings(b)
    differs = ["%s (%s vs %s)" % (name, sa.get(name, "unset"),
                                  sb.get(name, "unset"))
               for name in sorted(set(sa) | set(sb))
               if sa.get(name) != sb.get(name)]
    if a.step != b.step:
        differs.insert(0, "steps trained (%d vs %d)" % (a.step, b.step))
    if differs:
        return False, ("%s: different functions: %s (on %s)"
                       % (names, "; ".join(differs), workers))
    if da == db:
        return True, ("%s: same function, bit-identical: the same model "
                      "(digest %s) after %d steps on %s"
                      % (names, da[:16], a.step, workers))
    gap, common = _loss_gap(a, b)
    if a.plan.replicas != b.plan.replicas:
        return True, (
            "%s: same function on %s: the same seed, global batch and "
            "settings; the models differ only by the floating-point order of "
            "the gradient sum across world sizes (digests %s vs %s), the "
            "losses by at most %.3g over %d common steps"
            % (names, workers, da[:16], db[:16], gap, common))
    cause = ("although both ran with reproducible: true; report it"
             if a.spec.reproducible and b.spec.reproducible else
             "replicas on different CPU kernels? Set reproducible: true")
    return False, (
        "%s: the same settings on %s, yet different models (digests %s vs "
        "%s; losses up to %.3g apart): %s"
        % (names, workers, da[:16], db[:16], gap, cause))


def compare(jobs, plot=True, client=None):
    """Compares finished runs: `jobs` are Job objects (of one Client or
    several), or job ids of `client`. Returns a Comparison with the curves in one DataFrame keyed by
    (job, step), a per-job summary, a verdict for each pair and, unless
    plot=False, a matplotlib Figure of the loss by step and by samples seen
    and of the test loss at each evaluation."""
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
    pairs = [verdict(a, b) for a, b in itertools.combinations(statuses, 2)]
    figure = _plot(statuses, frames) if plot else None
    return Comparison(frame, summary, pairs, figure)


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
