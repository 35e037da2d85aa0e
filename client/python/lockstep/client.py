"""Client and Job: the coordinator's calls from Python (the CLI's submit,
status, watch, stop, jobs and workers)."""
import collections
import hashlib
import html
import os
import sys
import tarfile
import tempfile
import time

import grpc

from lockstep import errors
from lockstep import metrics as metrics_lib
from lockstep._connection import Settings
from lockstep.spec import job_spec, keyword_overrides
from lockstep.v1 import coordinator_pb2
from lockstep.v1 import coordinator_pb2_grpc

_TERMINAL = (coordinator_pb2.JOB_STATE_SUCCEEDED,
             coordinator_pb2.JOB_STATE_FAILED,
             coordinator_pb2.JOB_STATE_STOPPED)

# How long a watch without a timeout waits for a coordinator that went away
# before it gives up (Job.watch's reconnect_timeout).
_RECONNECT_SECONDS = 300.0

# What Job.watch() yields: kind "event" with the JobEvent that happened, or
# "progress" with the job's new status (event None). `status` is always the
# job's latest JobStatus.
Update = collections.namedtuple("Update", ["kind", "status", "event"])


class Client:
    """A connection to a lockstep coordinator.

    Client(address, cert, key, ca) uses those; any left out comes from the
    CLI's environment (LOCKSTEP_COORDINATOR, LOCKSTEP_TLS_CERT,
    LOCKSTEP_TLS_KEY, LOCKSTEP_TLS_CA; LOCKSTEP_INSECURE=1 or insecure=True
    for a coordinator run with --insecure). The server must present the
    coordinator's SPIFFE ID from that CA, for the host dialed; that is
    checked here, so an unreachable or wrong server raises Unavailable or
    Unauthenticated at once. `timeout` bounds each call (not Job.wait()).
    """

    def __init__(self, address=None, cert=None, key=None, ca=None, *,
                 insecure=None, timeout=30.0):
        self._settings = Settings(address, cert, key, ca, insecure)
        self.address = self._settings.address
        self.timeout = timeout
        self._settings.check_server(timeout)
        self._channel = self._settings.channel()
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    @classmethod
    def from_env(cls, **kwargs):
        """A Client configured only by the environment, as the CLI is."""
        return cls(**kwargs)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "lockstep.Client(%r)" % self.address

    def _call(self, method, request, timeout=None):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as error:
            raise errors.from_rpc(error, self.address) from None

    def submit(self, spec, overrides=None, **kwargs):
        """Submits a job and returns its Job. `spec` is a dict, a path to a
        JSON spec or a JobSpec; `overrides` ({"epochs": 1,
        "communication.algorithm": "ring"}) and keyword arguments
        (epochs=1, communication__algorithm="ring") replace fields, as the
        CLI's --set does. Raises InvalidArgument for a bad spec (the
        coordinator's message says which field and why)."""
        merged = dict(overrides or {})
        merged.update(keyword_overrides(kwargs))
        request = coordinator_pb2.SubmitJobRequest(spec=job_spec(spec, merged))
        response = self._call("SubmitJob", request)
        return Job(self, response.job_id)

    def job(self, job_id):
        """The Job of an existing job id (NotFound at its first call when
        there is none)."""
        return Job(self, job_id)

    def jobs(self, limit=None, state=None, owner=None, name=None):
        """Summaries (JobStatus without history, events or evaluations) of
        the coordinator's jobs, newest first; at most `limit` of those that
        match: `state` ("running", or several: ("queued", "running")),
        `owner` ("operator:alice"), `name` (the spec's name)."""
        keep = _JobFilter(state, owner, name)
        out = []
        token = ""
        while limit is None or len(out) < limit:
            page = self._call("GetJobStatus", coordinator_pb2.GetJobStatusRequest(
                page_token=token, page_size=1000))
            out.extend(job for job in page.jobs if keep(job))
            token = page.next_page_token
            if not token:
                break
        return out if limit is None else out[:limit]

    def delete(self, job_id):
        """Deletes a finished job's record (DeleteJob: its owner or an
        admin; a job still queued or running is refused, FailedPrecondition:
        stop it first)."""
        self._call("DeleteJob", coordinator_pb2.DeleteJobRequest(job_id=job_id))

    def workers(self):
        """Every registered worker (WorkerInfo: id, host, state, job, rank,
        device, labels), in worker id order."""
        out = []
        token = ""
        while True:
            page = self._call("ListWorkers", coordinator_pb2.ListWorkersRequest(
                page_token=token))
            out.extend(page.workers)
            token = page.next_page_token
            if not token:
                return out

    def queue(self):
        """The queued jobs, head first, each with why it waits
        (JobStatus.queue)."""
        return list(self._call("ListQueue",
                               coordinator_pb2.ListQueueRequest()).jobs)


class Job:
    """One job of a coordinator: its id, and the calls on it."""

    def __init__(self, client, job_id):
        self.client = client
        self.id = job_id

    def __repr__(self):
        return "lockstep.Job(%r)" % self.id

    def status(self, history=False):
        """The job's JobStatus; with history=True its whole per-step loss
        history in step_losses (paged from the coordinator)."""
        if history:
            return metrics_lib.fetch_history(
                lambda request: self.client._call("GetJobStatus", request),
                self.id)
        request = coordinator_pb2.GetJobStatusRequest(job_id=self.id)
        return self.client._call("GetJobStatus", request).jobs[0]

    def state(self):
        """"queued", "running", "recovering", "succeeded", "failed" or
        "stopped"."""
        return metrics_lib.state_name(self.status().state)

    def digest(self):
        """The trained model's digest (rank 0's), or "" before the end."""
        ranks = self.status().ranks
        return ranks[0].model_digest if ranks else ""

    def stop(self):
        """Asks the coordinator to stop the job (an operator's call; the
        job's owner or an admin)."""
        self.client._call("StopJob", coordinator_pb2.StopJobRequest(
            job_id=self.id))

    def delete(self):
        """Deletes the job's record once it ended (Client.delete)."""
        self.client.delete(self.id)

    def checkpoints(self):
        """The job's committed checkpoints (CheckpointInfo: name, step,
        epoch, generation, time, bytes), oldest first."""
        return list(self.status().checkpoints)

    def artifacts(self):
        """What the coordinator keeps of the job (ArtifactInfo: name,
        file_name, format, bytes, sha256, step, time, owner): its exported
        model once it succeeded, when the coordinator runs with
        --artifact-dir (LocalCluster does)."""
        return list(self.client._call(
            "ListArtifacts",
            coordinator_pb2.ListArtifactsRequest(job_id=self.id)).artifacts)

    def download(self, name="model", path=None, timeout=3600):
        """Downloads the artifact `name` the coordinator keeps of the job
        ("model": its export; "checkpoint": its last checkpoint, when the
        job asked for it with checkpoint.upload_last) to `path` (default:
        the artifact's file name in the current folder) and returns the
        path. It is written to a temporary file beside `path`, its size and
        SHA-256 checked against the coordinator's record (DataLoss when they
        differ), then moved into place."""
        stream = self.client._stub.DownloadArtifact(
            coordinator_pb2.DownloadArtifactRequest(job_id=self.id,
                                                    name=name),
            timeout=timeout)
        receiver = None
        try:
            info = next(stream).info
            receiver = _Receiver(info, path or info.file_name, self.id)
            for message in stream:
                receiver.add(message.data)
            return receiver.finish()
        except grpc.RpcError as error:
            if receiver is not None:
                receiver.abort()
            raise errors.from_rpc(error, self.client.address) from None
        except StopIteration:
            raise errors.DataLoss("the download of job %s's %s ended at "
                                  "once" % (self.id, name)) from None
        finally:
            stream.cancel()

    def download_model(self, path=None, timeout=3600):
        """Downloads the job's exported model (download("model"))."""
        return self.download("model", path, timeout)

    def download_checkpoint(self, folder, timeout=3600):
        """Downloads the job's last checkpoint (the job asked for it with
        checkpoint.upload_last) and unpacks it into `folder` (created; it
        must be empty), which is then a checkpoint.backup_dir a job resumes
        from. Returns the folder."""
        with tempfile.TemporaryDirectory(prefix="lockstep-ckpt-") as temp:
            tar = self.download("checkpoint", os.path.join(temp, "ckpt.tar"),
                                timeout)
            return unpack_checkpoint(tar, folder, self.id)

    def load_model(self, **sizes):
        """The job's exported model in PyTorch (needs python3-torch),
        downloaded from the coordinator: a "torchscript" export as
        torch.jit.load gives it; a "state_dict" export loaded (strictly)
        into lockstep.models' module of the job's model, its sizes from the
        job's spec and the weights (`sizes` overrides them, as
        lockstep.models.build takes them). An "archive" export is LibTorch's
        C++ format, which Python does not read: FailedPrecondition."""
        status = self.status()
        _check_loadable(status)
        with tempfile.TemporaryDirectory(prefix="lockstep-model-") as folder:
            return _load(status.spec,
                         self.download_model(os.path.join(folder, "model.pt")),
                         sizes)

    def logs(self, follow=True, timeout=None):
        """The job's events and progress as text lines, as `lockstep watch`
        prints them piped: each event, and its progress at most every 2 s
        and at each change of state. follow=False: the events so far, and
        the current progress, then stop."""
        if not follow:
            status = self.status()
            for event in status.events:
                yield _event_line(event)
            yield _progress_line(status)
            return
        last = (None, 0.0)
        for update in self.watch(display=False, timeout=timeout):
            if update.kind == "event":
                yield _event_line(update.event)
                continue
            status = update.status
            now = time.monotonic()
            if (status.state != last[0] or now - last[1] >= 2.0 or
                    status.state in _TERMINAL):
                last = (status.state, now)
                yield _progress_line(status)

    def _repr_html_(self):
        """A table of the job's state in a notebook."""
        return _status_html(self.status())

    def watch(self, display=True, timeout=None,
              reconnect_timeout=_RECONNECT_SECONDS):
        """Follows the job until it ends, yielding Update("event", status,
        event) for each JobEvent (those before the watch began first) and
        Update("progress", status, None) for each new status. With
        display=True it also draws progress on stderr: a tqdm bar when tqdm
        is installed, a plain line otherwise.

        A coordinator that goes away (a restart, a network cut) does not end
        the watch: the server's identity is checked again (with TLS) and the
        stream reopened, with backoff (0.1 s doubling to 2 s), until
        `timeout` (seconds, the whole watch: DeadlineExceeded) or, without
        one, until the coordinator has been away `reconnect_timeout` seconds
        in a row (Unavailable). A server that presents another identity ends
        it at once (Unauthenticated). Each event is yielded once: a reopened
        stream sends the job's events again, and those already yielded are
        known by their content (time, generation, kind, worker, rank,
        message). Not by their place in the list: a coordinator killed
        before it saved its newest events comes back with fewer, and its
        next event takes a place already seen."""
        reconnect = _Reconnect(self, timeout, reconnect_timeout)
        view = _Display(self.id) if display else None
        seen = _SeenEvents()
        stream = None
        try:
            while True:
                error = None
                try:
                    if reconnect.away():
                        self.client._settings.check_server(
                            reconnect.check_timeout())
                    stream = self.client._stub.WatchJob(
                        coordinator_pb2.WatchJobRequest(job_id=self.id),
                        timeout=reconnect.remaining())
                    for status in stream:
                        reconnect.served()
                        for update in _updates(status, seen, view):
                            yield update
                        if status.state in _TERMINAL:
                            return
                except grpc.RpcError as rpc_error:
                    error = reconnect.resumable(rpc_error)
                except errors.Unavailable as unreachable:
                    error = unreachable  # the identity check's connection
                finally:
                    if stream is not None:
                        stream.cancel()
                time.sleep(reconnect.lost(error))
        finally:
            if view:
                view.close()
            if stream is not None:
                stream.cancel()  # a caller that stopped iterating early

    def wait(self, timeout=None, display=False):
        """Waits for the job to end and returns its final JobStatus when it
        succeeded; raises JobFailed or JobStopped (with .status) when it did
        not, DeadlineExceeded after `timeout` seconds."""
        final = None
        for update in self.watch(display=display, timeout=timeout):
            final = update.status
        return _outcome(self.id, final)

    def metrics(self):
        """The training curve as a pandas DataFrame: columns step,
        samples_seen, loss, lr, then the test metrics at the steps where the
        test set was evaluated (test_accuracy, test_loss, ...; NaN
        elsewhere) and the epoch of each evaluation."""
        return metrics_lib.frame(self.status(history=True))


class _JobFilter:
    """Which job summaries Client.jobs() keeps."""

    def __init__(self, state, owner, name):
        if isinstance(state, str):
            state = (state,)
        names = {metrics_lib.state_name(value): value
                 for value in coordinator_pb2.JobState.values()}
        unknown = [s for s in state or () if s not in names]
        if unknown:
            raise errors.InvalidArgument(
                "no job state %s; the states are %s"
                % (", ".join(map(repr, unknown)), ", ".join(sorted(names))))
        self.states = None if state is None else {names[s] for s in state}
        self.owner = owner
        self.name = name

    def __call__(self, job):
        return ((self.states is None or job.state in self.states) and
                (self.owner is None or job.owner == self.owner) and
                (self.name is None or job.spec.name == self.name))


def _when(seconds):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _event_line(event):
    """One event as `lockstep watch` prints it."""
    where = " rank %d" % event.rank if event.worker_id else ""
    return _terminal_safe("%s %s gen %d%s: %s" % (
        _when(event.time), event.kind, event.generation, where, event.message))


def _progress_line(status):
    """The job's progress in one line."""
    line = "%s %s step %d/%d loss %.4f gen %d" % (
        status.job_id, metrics_lib.state_name(status.state), status.step,
        status.total_steps, status.loss, status.generation)
    for name, value in sorted(status.test_metrics.items()):
        line += " %s %.4g" % (name, value)
    if status.error:
        line += ": " + status.error
    return _terminal_safe(line)


def _status_html(status):
    """A JobStatus as a small HTML table (Job._repr_html_)."""
    rows = [("job", status.job_id),
            ("state", metrics_lib.state_name(status.state)),
            ("owner", status.owner or "-"),
            ("priority", status.priority),
            ("workers", status.world_size),
            ("step", "%d / %d" % (status.step, status.total_steps)),
            ("loss", "%.4f" % status.loss),
            ("samples/s", "%.0f" % status.samples_per_second)]
    rows += [(name, "%.4g" % value)
             for name, value in sorted(status.test_metrics.items())]
    if status.error:
        rows.append(("error", status.error))
    cells = "".join("<tr><th style='text-align:left'>%s</th><td>%s</td></tr>"
                    % (html.escape(str(k)), html.escape(str(v)))
                    for k, v in rows)
    return "<table>%s</table>" % cells


class _Receiver:
    """Where a downloaded artifact goes (Job.download_model and
    lockstep.aio's): a temporary file beside `path`, checked against the
    info's size and SHA-256 by finish(), then renamed to `path`."""

    def __init__(self, info, path, job_id):
        self.info = info
        self.path = path
        self.job_id = job_id
        self.digest = hashlib.sha256()
        self.received = 0
        try:
            handle, self.temp = tempfile.mkstemp(
                prefix=".%s.part-" % os.path.basename(path),
                dir=os.path.dirname(os.path.abspath(path)))
        except OSError as error:
            raise errors.FailedPrecondition(
                "cannot write the %s of job %s to %s: %s"
                % (info.name, job_id, path, error.strerror or error)) from None
        self.out = os.fdopen(handle, "wb")

    def add(self, data):
        self.received += len(data)
        if self.received <= self.info.bytes:
            self.digest.update(data)
            self.out.write(data)

    def finish(self):
        """Returns the path; DataLoss (nothing written) when the bytes are
        not the coordinator's."""
        try:
            self.out.flush()
            os.fsync(self.out.fileno())
            self.out.close()
            if (self.received != self.info.bytes or
                    self.digest.hexdigest() != self.info.sha256):
                raise errors.DataLoss(
                    "the %s of job %s came with %d bytes and SHA-256 %s; "
                    "the coordinator keeps %d bytes with SHA-256 %s: nothing "
                    "was written" % (self.info.name, self.job_id,
                                     self.received, self.digest.hexdigest(),
                                     self.info.bytes, self.info.sha256))
            os.replace(self.temp, self.path)
            return self.path
        except OSError as error:
            self.abort()
            raise errors.FailedPrecondition(
                "cannot write the %s of job %s to %s: %s"
                % (self.info.name, self.job_id, self.path,
                   error.strerror or error)) from None
        except BaseException:
            self.abort()
            raise

    def abort(self):
        self.out.close()
        if os.path.exists(self.temp):
            os.unlink(self.temp)


def unpack_checkpoint(tar, folder, job_id):
    """Unpacks a checkpoint archive (ckpt-<step>.tar: one ckpt-<step>/
    folder of regular files and a LATEST) into `folder`, created if need
    be and required empty, and returns it. Anything else in the archive (a
    link, a device, a path outside the folder) is DataLoss and nothing is
    unpacked."""
    try:
        with tarfile.open(tar, "r:") as archive:
            members = archive.getmembers()
            for member in members:
                parts = member.name.rstrip("/").split("/")
                # Plain files only (not sparse, not links), in at most one
                # folder.
                plain = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
                safe = (not member.name.startswith("/") and ".." not in parts
                        and len(parts) <= 2 and
                        (plain or (member.isdir() and len(parts) == 1)))
                if not safe:
                    raise errors.DataLoss(
                        "the checkpoint of job %s holds %r, which is not a "
                        "file of a checkpoint: nothing was unpacked"
                        % (job_id, member.name))
            os.makedirs(folder, exist_ok=True)
            if os.listdir(folder):
                raise errors.FailedPrecondition(
                    "cannot unpack the checkpoint of job %s into %s: the "
                    "folder is not empty; give an empty or new one"
                    % (job_id, folder))
            for member in members:
                archive.extract(member, folder, set_attrs=False)
        return folder
    except tarfile.TarError as error:
        raise errors.DataLoss("the checkpoint of job %s is not a readable "
                              "archive: %s" % (job_id, error)) from None
    except OSError as error:
        raise errors.FailedPrecondition(
            "cannot unpack the checkpoint of job %s into %s: %s"
            % (job_id, folder, error.strerror or error)) from None


def _check_loadable(status):
    """FailedPrecondition unless Python can load the job's export."""
    if (status.spec.export_format or "archive") == "archive":
        raise errors.FailedPrecondition(
            "job %s exported an \"archive\" (LibTorch's C++ format); Python "
            "loads export_format \"torchscript\" or \"state_dict\""
            % status.job_id)


def _load(spec, path, sizes):
    """The model of the export at `path` (Job.load_model)."""
    import torch  # pylint: disable=import-outside-toplevel

    if spec.export_format == "torchscript":
        return torch.jit.load(path).eval()
    return _built_model(spec, torch.load(path), sizes)


def _built_model(spec, state, sizes):
    """lockstep.models' module of `spec`'s built-in model with `state`
    loaded: its sizes from the spec and the weights, then `sizes`."""
    from lockstep import models  # pylint: disable=import-outside-toplevel

    name = spec.model.name
    if not name:
        raise errors.FailedPrecondition(
            "the job trains a model.torchscript module; its state_dict loads "
            "into that module, not one of lockstep.models: export "
            "\"torchscript\" instead")
    found = {"dropout": spec.model.dropout}
    if name == "gpt":
        found.update(vocab_size=state["wte.weight"].shape[0],
                     block_size=state["wpe.weight"].shape[0],
                     n_layer=spec.model.n_layer or 4,
                     n_head=spec.model.n_head or 4,
                     n_embd=spec.model.n_embd or 128)
    elif spec.task.num_classes:
        found["outputs"] = spec.task.num_classes
    found.update(sizes)
    model = models.build(name, **found)
    model.load_state_dict(state)
    return model.eval()


def _updates(status, seen, view):
    """What a watch yields for one status from its stream: an Update per
    event not yielded before, then the progress Update; drawn on `view`
    (None: no display)."""
    for event in status.events:
        if seen.first_time(event):
            if view:
                view.event(event)
            yield Update("event", status, event)
    if view:
        view.progress(status)
    yield Update("progress", status, None)


def _outcome(job_id, final):
    """Job.wait()'s result from the last status its watch saw."""
    if final is None or final.state not in _TERMINAL:
        raise errors.Unavailable("the watch of job %s ended before the job "
                                 "did" % job_id)
    if final.state == coordinator_pb2.JOB_STATE_FAILED:
        raise errors.JobFailed("job %s failed: %s" % (job_id, final.error),
                               final)
    if final.state == coordinator_pb2.JOB_STATE_STOPPED:
        raise errors.JobStopped(
            "job %s was stopped%s" % (
                job_id, ": " + final.error if final.error else ""), final)
    return final


class _Reconnect:
    """When a watch (sync or lockstep.aio) tries its coordinator again:
    after a pause from 0.1 s doubling to 2 s, until the watch's deadline
    (DeadlineExceeded) or, without one, until the coordinator has been away
    reconnect_timeout seconds in a row (Unavailable)."""

    def __init__(self, job, timeout, reconnect_timeout):
        self.job = job
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.reconnect_timeout = reconnect_timeout
        self.away_since = None
        self.attempts = 0

    def remaining(self):
        """What is left of the watch's timeout (None: no timeout)."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def check_timeout(self):
        """The timeout of one identity check of the server."""
        remaining = self.remaining()
        if remaining is None:
            return self.job.client.timeout
        return max(0.1, min(self.job.client.timeout, remaining))

    def away(self):
        return self.away_since is not None

    def served(self):
        """A status arrived: the coordinator is back."""
        self.away_since = None
        self.attempts = 0

    def resumable(self, rpc_error):
        """The error of a broken stream when trying again may help (the
        coordinator is unavailable); raises the others."""
        code = rpc_error.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise errors.DeadlineExceeded(
                "job %s did not end within %s s"
                % (self.job.id, self.timeout)) from None
        error = errors.from_rpc(rpc_error, self.job.client.address)
        if code != grpc.StatusCode.UNAVAILABLE:
            raise error from None
        return error

    def lost(self, error):
        """The stream broke with `error` (None: it ended before the job
        did): the seconds to pause before the next try, or the error that
        ends the watch."""
        now = time.monotonic()
        if self.away_since is None:
            self.away_since = now
        if self.deadline is not None and now >= self.deadline:
            raise errors.DeadlineExceeded(
                "job %s did not end within %s s; the coordinator at %s was "
                "away for the last %.1f s"
                % (self.job.id, self.timeout, self.job.client.address,
                   now - self.away_since))
        if self.deadline is None and (now - self.away_since >
                                      self.reconnect_timeout):
            raise errors.Unavailable(
                "the coordinator at %s has not served the watch of job %s "
                "for %.0f s%s" % (
                    self.job.client.address, self.job.id,
                    now - self.away_since,
                    "" if error is None else ": %s" % error), "UNAVAILABLE")
        self.attempts += 1
        pause = min(2.0, 0.1 * 2 ** self.attempts)
        if self.deadline is not None:
            pause = min(pause, max(0.0, self.deadline - now))
        return pause


class _SeenEvents:
    """The events a watch has yielded, by their content: a coordinator that
    restarted may hold fewer than it had sent (it saves them now and then),
    so a position in the list does not identify an event."""

    _KEEP = 4096

    def __init__(self):
        self.keys = set()
        self.order = collections.deque()

    def first_time(self, event):
        key = event.SerializeToString(deterministic=True)
        if key in self.keys:
            return False
        self.keys.add(key)
        self.order.append(key)
        if len(self.order) > self._KEEP:
            self.keys.discard(self.order.popleft())
        return True


def _terminal_safe(text):
    """Server text for a terminal: control characters (escape sequences)
    shown as '?', as the CLI's TerminalSafe does."""
    return "".join("?" if ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 else c
                   for c in text)


class _Display:
    """Progress on stderr: a tqdm bar, or a plain line at most once a second
    (and at every change of state)."""

    def __init__(self, job_id):
        self.job_id = job_id
        self.bar = None
        self.last_line = 0.0
        self.last_state = None
        try:
            from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
            self.tqdm = tqdm
        except ImportError:
            self.tqdm = None

    def _write(self, text):
        text = _terminal_safe(text)
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def event(self, event):
        where = " %s rank %d" % (event.worker_id, event.rank) if event.worker_id else ""
        self._write("%s: %s%s%s" % (self.job_id, event.kind, where,
                                    ": " + event.message if event.message else ""))

    def progress(self, status):
        state = metrics_lib.state_name(status.state)
        speed = ("%.0f tokens/s" % status.tokens_per_second
                 if status.tokens_per_second > 0 else
                 "%.0f samples/s" % status.samples_per_second)
        if self.tqdm is not None and status.total_steps > 0:
            if self.bar is None:
                self.bar = self.tqdm(total=status.total_steps,
                                     desc=_terminal_safe(self.job_id),
                                     unit="step", file=sys.stderr,
                                     initial=min(status.step, status.total_steps))
            self.bar.n = min(status.step, status.total_steps)
            self.bar.set_postfix_str(_terminal_safe("%s, loss %.4f, %s" % (
                state, status.loss, speed)), refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if state == self.last_state and now - self.last_line < 1.0:
            return
        self.last_state, self.last_line = state, now
        total = "/%d" % status.total_steps if status.total_steps else ""
        self._write("%s: %s, step %d%s, loss %.4f, %s" % (
            self.job_id, state, status.step, total, status.loss, speed))

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
