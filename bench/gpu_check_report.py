"""Reads what bench/gpu_check.sh left in BUILD_DIR/gpu_check/ (one folder per
check: kind, meta, rc, stdout, stderr, ...), decides each check's status,
writes the one JSON file of results and prints the tables. Standard library
only.

  gpu_check_report.py WORK_DIR RESULTS_JSON   exit 0 all passed, 1 a check
                                              failed, 3 some were skipped
  gpu_check_report.py --summary CHECK_DIR     one line about one check
"""
import json
import math
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roofline  # noqa: E402  (its FLOP counts; torch not needed)

ACCURACY_FLOOR = 0.5  # after a few hundred steps every model is far above
RECOVERY_TARGET_S = 2.0


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def tail(text, n=1500):
    return text if len(text) <= n else "..." + text[-n:]


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def meta(d):
    out = {}
    for line in read(os.path.join(d, "meta")).splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = int(v) if v.isdigit() else v
    return out


def rc(d, name="rc"):
    text = read(os.path.join(d, name)).strip()
    return int(text) if text.lstrip("-").isdigit() else None


def run_logs(stderr):
    """The tails of a failed `lockstep local` run's logs (it keeps them)."""
    m = re.search(r"logs are in (\S+)", stderr)
    if not m or not os.path.isdir(m.group(1)):
        return {}
    logs = {}
    for name in sorted(os.listdir(m.group(1))):
        if name.endswith(".log"):
            logs[name] = tail(read(os.path.join(m.group(1), name)), 1200)
    return logs


def check_gtest(d, r):
    out = read(os.path.join(d, "stdout")) + read(os.path.join(d, "stderr"))
    r["tests_ok"] = len(re.findall(r"^\[       OK \]", out, re.M))
    # Each skipped test once (gtest lists them again at the end), with the
    # reason it gave; a test that needs more GPUs than the node has may skip.
    skipped = re.findall(r"^\S+: Skipped\n(.*)\n\[  SKIPPED \] (\S+)", out, re.M)
    r["tests_skipped"] = len(skipped)
    r["tests_failed"] = len(re.findall(r"^\[  FAILED  \] \S+\.\S+ \(", out, re.M))
    problems = []
    if r["rc"] != 0:
        problems.append(f"exit status {r['rc']}")
    unexpected = [name for why, name in skipped if "needs two GPUs" not in why]
    if unexpected:
        problems.append(f"{len(unexpected)} tests skipped although a GPU is visible: "
                        + ", ".join(unexpected))
    if r["tests_ok"] == 0:
        problems.append("no test passed")
    return problems, tail(out) if problems else None


def check_allreduce(d, r):
    out = read(os.path.join(d, "stdout"))
    rows, in_nccl = [], False
    for line in out.splitlines():
        if line.startswith("NCCL, W ="):
            in_nccl = True
            r["nccl_world"] = int(line.split("=")[1].split()[0])
            continue
        if in_nccl:
            fields = line.split()
            if len(fields) == 4 and fields[0].isdigit():
                rows.append({"bytes": int(fields[0]), "us": float(fields[1]),
                             "algbw_gbps": float(fields[2]), "busbw_gbps": float(fields[3])})
            elif rows and not fields:
                in_nccl = False
    r["nccl"] = rows
    nccl_note = re.search(r"^NCCL: .*$", out, re.M)
    problems = []
    if r["rc"] != 0:
        problems.append(f"exit status {r['rc']}")
    if not rows:
        problems.append(nccl_note.group(0) if nccl_note else "no NCCL section in the output")
    return problems, tail(out + read(os.path.join(d, "stderr"))) if problems else None


def check_local_run(d, r, keys, result_problem):
    """A `lockstep local --json` run: `keys` of its summary into r; problems
    when it timed out, exited non-zero, did not succeed, or when
    result_problem(summary) says what is wrong with its result."""
    stdout, stderr = read(os.path.join(d, "stdout")), read(os.path.join(d, "stderr"))
    j = last_json(stdout) or {}
    for key in keys + ("error",):
        if key in j:
            r[key] = j[key]
    problems = []
    if r["rc"] == 124 or r["rc"] == 137:
        problems.append("timed out")
    elif r["rc"] != 0:
        problems.append(f"exit status {r['rc']}")
    if j.get("state") != "succeeded":
        problems.append(f"state {j.get('state', 'unknown')}")
    elif result_problem(j):
        problems.append(result_problem(j))
    if problems:
        said = re.search(r"^lockstep: (.*)$", stderr, re.M)
        if said and "error" not in r:
            r["error"] = said.group(1)
        if r.get("error"):
            problems.append(r["error"].splitlines()[0][:300])
        r["logs"] = run_logs(stderr)
    return problems, tail(stderr) if problems else None


def check_train(d, r):
    def accuracy(j):
        if j.get("test_accuracy", 0) < ACCURACY_FLOOR:
            return f"test accuracy {j.get('test_accuracy')} below {ACCURACY_FLOOR}"
        return None
    return check_local_run(d, r, (
        "state", "steps", "test_accuracy", "samples_per_second", "final_loss",
        "model_digest", "generations", "wall_seconds", "startup_seconds",
        "first_step_seconds", "step_breakdown_ms"), accuracy)


def check_lm(d, r):
    """The gpt on the GPU: it must succeed with a finite test loss."""
    def loss(j):
        if not math.isfinite(j.get("test_loss", float("nan"))):
            return f"test loss {j.get('test_loss')}"
        return None
    return check_local_run(d, r, (
        "state", "steps", "tokens_per_second", "test_loss", "final_loss",
        "model_digest", "step_breakdown_ms"), loss)


def check_reference(d, r):
    stdout, stderr = read(os.path.join(d, "stdout")), read(os.path.join(d, "stderr"))
    j = last_json(stdout) or {}
    for key in ("torch", "torch_cuda", "device", "cudnn_benchmark", "warmup_steps",
                "ddp_error", "results", "error"):
        if key in j:
            r[key] = j[key]
    problems = []
    if r["rc"] != 0:
        problems.append(f"exit status {r['rc']}")
    if not j.get("results"):
        problems.append(j.get("error", "no results"))
    for row in j.get("results", []):
        if "error" in row:
            problems.append(f"{row['model']} {row['precision']} {row['mode']}: {row['error']}")
    if "ddp_error" in j:
        problems.append(f"DDP: {j['ddp_error']}")
    return problems, tail(stderr) if problems else None


def check_recovery(d, r):
    ref = last_json(read(os.path.join(d, "reference.stdout"))) or {}
    got = last_json(read(os.path.join(d, "stdout"))) or {}
    stderr = read(os.path.join(d, "stderr"))
    r["reference"] = {k: ref.get(k) for k in ("state", "steps", "model_digest",
                                                "samples_per_second", "wall_seconds")}
    r["reference_rc"] = rc(d, "reference.rc")
    r["killed_run"] = {k: got.get(k) for k in ("state", "steps", "model_digest",
                                                 "generations", "samples_per_second",
                                                 "wall_seconds", "error")}
    kill_time = read(os.path.join(d, "kill_time")).strip()
    problems = []
    if not kill_time:
        problems.append("no worker was killed (the run ended first or never trained)")
    else:
        killed = float(kill_time)
        for line in stderr.splitlines():
            stamp, _, text = line.partition(" ")
            try:
                t = float(stamp)
            except ValueError:
                continue
            if "restarting it" in text and "restart_seen_s" not in r:
                r["restart_seen_s"] = round(t - killed, 3)
            m = re.match(r"gen (\d+)\s+([A-Za-z_]+)(?::\s*(.*))?$", text)
            if not m or t < killed:
                continue
            if m.group(2) in ("worker_failed", "generation_failed") and "detect_s" not in r:
                r["detect_s"] = round(t - killed, 3)
            if m.group(2) == "resumed" and int(m.group(1)) >= 2:
                if "resume_s" not in r:
                    r["resume_s"] = round(t - killed, 3)
                    r["resumed_event"] = m.group(3) or ""
        if "resume_s" not in r:
            problems.append("no \"resumed\" event of a later generation")
    if r["reference_rc"] != 0 or ref.get("state") != "succeeded":
        problems.append(f"the uninterrupted run failed (exit {r['reference_rc']}, state {ref.get('state')})")
    if r["rc"] != 0 or got.get("state") != "succeeded":
        problems.append(f"the killed run failed (exit {r['rc']}, state {got.get('state')})")
    if got.get("generations", 0) < 2 and kill_time:
        problems.append(f"{got.get('generations')} generation(s): the kill went unnoticed")
    r["digest_matches"] = bool(ref.get("model_digest")) and ref.get("model_digest") == got.get("model_digest")
    if not r["digest_matches"]:
        problems.append("the model digest differs from the uninterrupted run's")
    if problems:
        r["logs"] = run_logs(stderr)
    return problems, tail(stderr, 2500) if problems else None


def check_roofline(d, r):
    """bench/roofline.py --device cuda: the GPU's GEMM peak per precision."""
    try:
        with open(os.path.join(d, "peaks.json")) as f:
            found = json.load(f)
        r["peaks_gflops"] = {k: float(v) for k, v in found["peaks"].items()}
        r["gemm"] = found.get("gemm")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"no peaks (exit {r['rc']}): {e}"], tail(read(os.path.join(d, "stderr")))
    if r["rc"] != 0:
        return [f"exit {r['rc']}"], tail(read(os.path.join(d, "stderr")))
    return [], None


CHECKS = {"gtest": check_gtest, "allreduce": check_allreduce, "train": check_train,
          "lm": check_lm,
          "reference": check_reference, "recovery": check_recovery,
          "roofline": check_roofline}


def evaluate(d):
    r = {"name": os.path.basename(d).split("-", 1)[1],
         "kind": read(os.path.join(d, "kind")).strip()}
    r.update(meta(d))
    skipped = read(os.path.join(d, "skipped")).strip()
    if skipped:
        r["status"] = "skipped"
        r["reason"] = skipped
        return r
    r["rc"] = rc(d)
    problems, output = CHECKS[r["kind"]](d, r)
    r["status"] = "failed" if problems else "passed"
    if problems:
        r["problems"] = problems
    if output:
        r["output_tail"] = output
    return r


def one_line(r):
    head = f"  {r['status'].upper():7s} {r['name']}"
    if r["status"] == "skipped":
        return f"{head}: {r['reason']}"
    bits = []
    if r["kind"] == "train" and "samples_per_second" in r:
        bits.append(f"{r['samples_per_second']:.0f} samples/s, test accuracy "
                    f"{100 * r.get('test_accuracy', 0):.2f}%, digest {str(r.get('model_digest'))[:12]}")
    if r["kind"] == "lm" and "tokens_per_second" in r:
        bits.append(f"{r['tokens_per_second']:.0f} tokens/s, test loss "
                    f"{r.get('test_loss', float('nan')):.4f}")
    if r["kind"] == "gtest":
        bits.append(f"{r['tests_ok']} ok, {r['tests_skipped']} skipped, {r['tests_failed']} failed")
    if r["kind"] == "allreduce" and r.get("nccl"):
        big = r["nccl"][-1]
        bits.append(f"NCCL W={r.get('nccl_world')}: {big['bytes']} bytes in {big['us']:.0f} us, "
                    f"busbw {big['busbw_gbps']:.1f} GB/s")
    if r["kind"] == "reference":
        bits.append(f"{len(r.get('results', []))} runs, torch {r.get('torch')}")
    if r["kind"] == "roofline" and r.get("peaks_gflops"):
        bits.append(", ".join(f"{k} {v / 1000:.1f} TFLOP/s"
                              for k, v in r["peaks_gflops"].items()))
    if r["kind"] == "recovery":
        bits.append(f"resumed {r.get('resume_s')} s after SIGKILL, digest "
                    f"{'matches' if r.get('digest_matches') else 'DIFFERS'}")
    if r.get("problems"):
        bits.append("; ".join(str(p) for p in r["problems"]))
    return head + (": " + " | ".join(bits) if bits else "")


def tables(checks):
    train = {(c["model"], c["precision"], c["workers"], c["backend"]): c
             for c in checks if c["kind"] == "train" and c["status"] == "passed"}
    ref = next((c for c in checks if c["kind"] == "reference"), {})
    torch_rows = {(row["model"], row["precision"], row["mode"]): row
                  for row in ref.get("results", []) if "error" not in row}
    roof = next((c for c in checks if c["kind"] == "roofline"
                 and c["status"] == "passed"), {})
    peaks = roof.get("peaks_gflops", {})
    rows = []
    for model in ("mlp", "cnn", "resnet"):
        for precision in ("fp32", "bf16", "fp16"):
            one = train.get((model, precision, 1, "nccl"), {})
            two = train.get((model, precision, 2, "gloo"), {})
            eager = torch_rows.get((model, precision, "eager"), {})
            ddp = torch_rows.get((model, precision, "ddp"), {})
            row = {"model": model, "precision": precision,
                   "lockstep_1w_nccl": one.get("samples_per_second"),
                   "lockstep_1w_nccl_accuracy": one.get("test_accuracy"),
                   "lockstep_2w_gloo": two.get("samples_per_second"),
                   "lockstep_2w_gloo_accuracy": two.get("test_accuracy"),
                   "pytorch_eager": eager.get("samples_per_second"),
                   "pytorch_eager_accuracy": eager.get("test_accuracy"),
                   "pytorch_ddp1": ddp.get("samples_per_second"),
                   "batch": eager.get("batch")}
            if row["lockstep_1w_nccl"] and row["pytorch_eager"]:
                row["lockstep_vs_eager"] = round(row["lockstep_1w_nccl"] / row["pytorch_eager"], 3)
            if row["lockstep_1w_nccl"] and row["pytorch_ddp1"]:
                row["lockstep_vs_ddp1"] = round(row["lockstep_1w_nccl"] / row["pytorch_ddp1"], 3)
            # The roofline (bench/roofline.py): FLOP/s against the GPU's own
            # GEMM peak in the same precision.
            flops = roofline.flops_per_sample(model)
            row["flops_per_sample"] = flops
            for key in ("lockstep_1w_nccl", "pytorch_eager"):
                if row[key] and peaks.get(precision):
                    row[key + "_of_peak"] = round(
                        row[key] * flops / 1e9 / peaks[precision], 4)
            rows.append(row)
    return rows


def targets(rows, checks):
    out = {}
    for row in rows:
        if row["precision"] == "bf16" and row["model"] in ("cnn", "resnet"):
            ratio = row.get("lockstep_vs_eager")
            out[f"{row['model']}_bf16_lockstep_ge_eager"] = {
                "ratio": ratio, "met": None if ratio is None else ratio >= 1.0}
    rec = next((c for c in checks if c["kind"] == "recovery"), {})
    resume = rec.get("resume_s")
    out["recovery_within_2s"] = {"resume_s": resume,
                                 "met": None if resume is None else resume <= RECOVERY_TARGET_S}
    return out


def fmt(v, spec="{:.0f}"):
    return "-" if v is None else spec.format(v)


def print_tables(rows, tgt):
    print("\nsamples/s on the GPU (lockstep 1 worker NCCL / 2 workers Gloo; "
          "PyTorch eager / DDP 1 process), test accuracy")
    print(f"{'model':7s}{'prec':5s}{'batch':>6s}{'ls 1w':>9s}{'ls 2w':>9s}{'eager':>9s}"
          f"{'ddp1':>9s}{'vs eager':>9s}{'ls1 peak':>9s}  accuracy ls1/ls2/eager")
    for r in rows:
        print(f"{r['model']:7s}{r['precision']:5s}{fmt(r['batch'], '{}'):>6s}"
              f"{fmt(r['lockstep_1w_nccl']):>9s}{fmt(r['lockstep_2w_gloo']):>9s}"
              f"{fmt(r['pytorch_eager']):>9s}{fmt(r['pytorch_ddp1']):>9s}"
              f"{fmt(r.get('lockstep_vs_eager'), '{:.2f}'):>9s}"
              f"{fmt(r.get('lockstep_1w_nccl_of_peak'), '{:.1%}'):>9s}  "
              + "/".join(fmt(r[k], "{:.3f}") for k in (
                  "lockstep_1w_nccl_accuracy", "lockstep_2w_gloo_accuracy",
                  "pytorch_eager_accuracy")))
    print("targets: " + "; ".join(
        f"{k}: {'met' if v['met'] else 'NOT met' if v['met'] is not None else 'not measured'}"
        for k, v in tgt.items()))


def copy_logs(work, results):
    """Where $OUT is set (a device run), the check folders go back too."""
    dest = os.path.join(os.path.dirname(os.path.abspath(results)), "gpu_check-logs")
    if os.path.abspath(dest).startswith(os.path.abspath(work)):
        return
    shutil.rmtree(dest, ignore_errors=True)
    for root, _, files in os.walk(work):
        for name in files:
            src = os.path.join(root, name)
            if os.path.getsize(src) > 2_000_000:
                continue
            target = os.path.join(dest, os.path.relpath(src, work))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(src, target)


def main(argv):
    if len(argv) == 3 and argv[1] == "--summary":
        print(one_line(evaluate(argv[2])), flush=True)
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    work, results = argv[1], argv[2]
    machine = dict(line.split("=", 1) for line in read(os.path.join(work, "machine")).splitlines()
                   if "=" in line)
    checks_dir = os.path.join(work, "checks")
    checks = [evaluate(os.path.join(checks_dir, d))
              for d in sorted(os.listdir(checks_dir))] if os.path.isdir(checks_dir) else []
    setup_error = read(os.path.join(work, "setup_error")).strip()
    rows = tables(checks)
    tgt = targets(rows, checks)
    failed = [c["name"] for c in checks if c["status"] == "failed"]
    skipped = [c["name"] for c in checks if c["status"] == "skipped"]
    out = {"machine": machine,
           "settings": {k: os.environ.get(k) for k in ("STEPS", "KILL_STEPS", "BUDGET_S")},
           "ok": not setup_error and not failed and not skipped and bool(checks),
           "setup_error": setup_error or None,
           "failed": failed, "skipped": skipped,
           "throughput": rows, "targets": tgt, "checks": checks}
    os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
    with open(results, "w") as f:
        json.dump(out, f, indent=1)
    if os.environ.get("OUT"):
        copy_logs(work, results)
    if checks:
        print_tables(rows, tgt)
    print(f"\ngpu_check: {len(checks) - len(failed) - len(skipped)} passed, {len(failed)} failed"
          f"{' (' + ', '.join(failed) + ')' if failed else ''}, {len(skipped)} skipped"
          f"{'; setup failed: ' + setup_error.splitlines()[0] if setup_error else ''}; "
          f"results in {results}")
    if setup_error or failed:
        return 1
    return 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
