"""LocalCluster: a coordinator and N workers on this machine for a notebook
or a test, run by `lockstep local --serve` with mutual TLS."""
import json
import os
import shutil
import signal
import subprocess
import threading

from lockstep.client import Client
from lockstep.errors import LockstepError, Unavailable

# Starting N workers is mostly loading LibTorch: seconds each.
_START_TIMEOUT_SECONDS = 120


def _built_binaries():
    """Where the build tree or `make install` put the binaries (_paths.py,
    which CMake writes); None for a package pip installed."""
    try:
        from lockstep import _paths  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return _paths.BIN_DIR


def _lockstep_binary(bin_dir):
    folders = [folder for folder in (bin_dir, os.environ.get("LOCKSTEP_BIN_DIR"),
                                     _built_binaries()) if folder]
    for folder in folders:
        if os.access(os.path.join(folder, "lockstep"), os.X_OK):
            return os.path.join(folder, "lockstep")
    found = shutil.which("lockstep")
    if found:
        return found
    raise LockstepError(
        "cannot find the lockstep binary (looked in %s): build lockstep "
        "(make build) or install it (make install), and give its bin folder "
        "as bin_dir or LOCKSTEP_BIN_DIR, or put it on PATH"
        % ", ".join(folders + ["PATH"]))


class LocalCluster:
    """A pool of `workers` worker processes (and `spares` hot spares) with
    their coordinator on 127.0.0.1, until close() (or the end of a with
    block). Jobs may read data below `data_roots` (Fashion-MNIST's Debian
    folder is always allowed), keep checkpoints below `backup_roots` and
    export below `export_roots`. `threads` compute threads per worker
    (default: cores / workers). gpus=True trains on this machine's GPUs,
    worker i on GPU i mod G (`lockstep local --gpus`).

        with lockstep.LocalCluster(workers=2) as cluster:
            job = cluster.client().submit("examples/fashion_mnist_cnn.json")
            job.wait(display=True)
    """

    def __init__(self, workers=2, spares=0, threads=None, data_roots=(),
                 backup_roots=(), export_roots=(), bin_dir=None,
                 keep_logs=False, gpus=False):
        command = [_lockstep_binary(bin_dir), "local", "--serve", "--json",
                   "--workers", str(workers), "--spares", str(spares)]
        if gpus:
            command.append("--gpus")
        if threads is not None:
            command += ["--threads", str(threads)]
        for flag, roots in (("--data-root", data_roots),
                            ("--backup-root", backup_roots),
                            ("--export-root", export_roots)):
            for root in roots:
                command += [flag, os.path.abspath(os.fspath(root))]
        if keep_logs:
            command.append("--keep-logs")
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self._stderr = []
        drain = threading.Thread(target=self._drain_stderr, daemon=True)
        drain.start()
        line = self._first_line()
        try:
            info = json.loads(line)
        except ValueError:
            self.close()
            raise Unavailable("lockstep local --serve did not start: %s"
                              % ("".join(self._stderr)[-2000:] or line),
                              "UNAVAILABLE") from None
        self.address = info["coordinator"]
        self.run_dir = info["run_dir"]
        self.insecure = info.get("insecure", False)
        self.cert = info.get("tls_cert")
        self.key = info.get("tls_key")
        self.ca = info.get("tls_ca")
        self.viewer_cert = info.get("viewer_tls_cert")
        self.viewer_key = info.get("viewer_tls_key")

    def _drain_stderr(self):
        for raw in self._process.stderr:
            self._stderr.append(raw.decode("utf-8", "replace"))
            del self._stderr[:-200]

    def _first_line(self):
        timer = threading.Timer(_START_TIMEOUT_SECONDS, self._process.kill)
        timer.start()
        try:
            return self._process.stdout.readline().decode("utf-8", "replace")
        finally:
            timer.cancel()

    def client(self, viewer=False, **kwargs):
        """A Client of the pool as its operator (submit, stop, read), or
        with viewer=True as a viewer (read only)."""
        if self.insecure:
            return Client(self.address, insecure=True, **kwargs)
        if viewer:
            return Client(self.address, self.viewer_cert, self.viewer_key,
                          self.ca, **kwargs)
        return Client(self.address, self.cert, self.key, self.ca, **kwargs)

    def environment(self):
        """The LOCKSTEP_* variables that point the CLI at the pool."""
        if self.insecure:
            return {"LOCKSTEP_COORDINATOR": self.address,
                    "LOCKSTEP_INSECURE": "1"}
        return {"LOCKSTEP_COORDINATOR": self.address,
                "LOCKSTEP_TLS_CERT": self.cert, "LOCKSTEP_TLS_KEY": self.key,
                "LOCKSTEP_TLS_CA": self.ca}

    def close(self):
        """Stops every process of the pool (running jobs end with it) and
        removes its run folder (unless keep_logs)."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._process.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_process", None) is not None and \
                self._process.poll() is None:
            self._process.kill()
