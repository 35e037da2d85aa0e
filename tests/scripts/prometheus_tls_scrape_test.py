#!/usr/bin/env python3
"""A real Prometheus scrapes a coordinator's /metrics over HTTPS with a
client certificate (`--metrics-tls`, CTest: prometheus_tls_scrape).

`scripts/lockstep-certs` makes a cluster's certificates (the coordinator's
naming 127.0.0.1, a viewer "prometheus", worker:0). A real
lockstep-coordinator serves /metrics with `--metrics-tls`, and Debian's
prometheus scrapes it three ways every second:

- `viewer`: https with the viewer's certificate: the target is up and
  `lockstep_jobs` is scraped;
- `worker`: https with worker:0's certificate: refused (403), the target
  is down;
- `plain`: plain http: no TLS handshake, the target is down.

The test asks Prometheus' API until it has seen all three, within the time
limit, and stops every process it started by its pid.

    prometheus_tls_scrape_test.py BIN_DIR SOURCE_DIR
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import prometheus_api
from prometheus_api import ready, stop

DEADLINE_SECONDS = 120


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def query(prom_port, expression):
    """The instant vector of `expression` as {job: float}."""
    return {labels.get("job", ""): value
            for labels, value in prometheus_api.query(prom_port, expression)}


def main():
    bin_dir, source_dir = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="lockstep-prometheus-tls-")
    certs = os.path.join(work, "certs")
    coordinator = prometheus = None
    logs = [open(os.path.join(work, name), "w")
            for name in ("coordinator.log", "prometheus.log")]
    try:
        subprocess.run(
            [os.path.join(source_dir, "scripts", "lockstep-certs"), "--dir",
             certs, "cluster", "--coordinator", "127.0.0.1", "--workers", "1",
             "--viewer", "prometheus"],
            check=True, stdout=subprocess.DEVNULL)
        cert = lambda name: os.path.join(certs, name)
        metrics_port = free_port()
        coordinator = subprocess.Popen(
            [os.path.join(bin_dir, "lockstep-coordinator"),
             "--listen", "127.0.0.1:0",
             "--state-dir", os.path.join(work, "state"),
             "--metrics-listen", "127.0.0.1:%d" % metrics_port,
             "--metrics-tls",
             "--tls-cert", cert("coordinator.crt"),
             "--tls-key", cert("coordinator.key"),
             "--tls-ca", cert("ca.crt")],
            stdout=logs[0], stderr=subprocess.STDOUT)

        target = "[\"127.0.0.1:%d\"]" % metrics_port
        tls = lambda name: (
            "    scheme: https\n"
            "    tls_config: {ca_file: %s, cert_file: %s, key_file: %s}\n"
            % (cert("ca.crt"), cert(name + ".crt"), cert(name + ".key")))
        with open(os.path.join(work, "prometheus.yml"), "w") as config:
            config.write(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n"
                "  - job_name: viewer\n" + tls("viewer-prometheus") +
                "    static_configs: [{targets: %s}]\n" % target +
                "  - job_name: worker\n" + tls("worker-worker-0") +
                "    static_configs: [{targets: %s}]\n" % target +
                "  - job_name: plain\n"
                "    static_configs: [{targets: %s}]\n" % target)
        prom_port = free_port()
        prometheus = subprocess.Popen(
            ["prometheus",
             "--config.file=" + os.path.join(work, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(work, "data"),
             "--web.listen-address=127.0.0.1:%d" % prom_port],
            stdout=logs[1], stderr=subprocess.STDOUT)

        want = {"viewer": 1.0, "worker": 0.0, "plain": 0.0}
        deadline = time.monotonic() + DEADLINE_SECONDS
        up, jobs = {}, {}
        while True:
            if ready(prom_port):
                up = query(prom_port, "up")
                jobs = query(prom_port, "lockstep_jobs")
                if up == want and "viewer" in jobs and len(jobs) == 1:
                    break
            for process, log in ((coordinator, logs[0]), (prometheus, logs[1])):
                if process.poll() is not None:
                    raise RuntimeError("%s exited:\n%s" % (
                        log.name, open(log.name).read()[-3000:]))
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "Prometheus never saw up=%s with lockstep_jobs from the "
                    "viewer only (last: up=%s, lockstep_jobs from %s); "
                    "coordinator log:\n%s" % (
                        want, up, sorted(jobs),
                        open(logs[0].name).read()[-3000:]))
            time.sleep(0.5)
        print("prometheus TLS scrape: OK (up: %s)" % up)
        return 0
    except Exception as error:  # pylint: disable=broad-except
        print("prometheus TLS scrape: FAILED: %s" % error)
        return 1
    finally:
        stop(prometheus)
        stop(coordinator)
        for log in logs:
            log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
