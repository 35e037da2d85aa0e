"""What the Prometheus tests share: asking a Prometheus server on
127.0.0.1 (its HTTP API) and stopping the processes they start."""
import json
import signal
import subprocess
import urllib.parse
import urllib.request


def query(prom_port, expression):
    """The instant vector of `expression`: a list of (labels, value)."""
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (
        prom_port, urllib.parse.urlencode({"query": expression}))
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError("query %s: %s" % (expression, body))
    return [(r["metric"], float(r["value"][1]))
            for r in body["data"]["result"]]


def ready(prom_port):
    """Whether the server answers /-/ready."""
    try:
        url = "http://127.0.0.1:%d/-/ready" % prom_port
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def stop(process):
    """SIGTERM, then SIGKILL after 10 s; nothing for a process gone."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
