#!/usr/bin/python3
"""How close lockstep's training gets to this machine's arithmetic peak.

    /usr/bin/python3 bench/roofline.py [--build build] [--steps 120]
        [--repeats 3] [--models mlp cnn resnet gpt] [--workers 1 2]
        [--precisions fp32 bf16] [--gemm 2048] [--json OUT]
    /usr/bin/python3 bench/roofline.py --device cuda --precisions fp32 bf16 fp16
        --gemm 8192 --json OUT      the GPU's peaks, for bench/gpu_check.sh

1. The peak: LibTorch's matrix product (Debian's python3-torch, the same
   LibTorch the workers link) of two N x N matrices (N = --gemm), in fp32
   and in bf16, on 1..cores threads; the median of 3 timings of at least
   0.3 s each, in GFLOP/s (2 N^3 per product).
2. Each model's FLOPs per training sample, counted from its layer shapes
   (worker/train/model.cc and gpt.cc): a matrix product or convolution
   of M multiply-adds is 2 M FLOPs forward and 4 M backward (the input's
   gradient and the weight's), except the first layer, whose input needs no
   gradient (2 M). Element-wise work (activations, norms, pooling, softmax,
   the optimizer) is left out: it is a few percent of the FLOPs and none of
   the peak. The gpt's attention products are counted over the full T x T
   scores, as they are computed.
3. Every model x precision x workers cell on `lockstep local` (global batch
   64, --steps steps, the default threads: cores / workers each), the cells
   interleaved, the median of --repeats runs: samples/s (lockstep's own,
   every step, evaluation excluded), achieved GFLOP/s = samples/s x FLOPs
   per sample, and that as a fraction of the peak of the same precision on
   all the cores.

--device cuda measures only the GPU's peaks (fp16 too, when asked):
bench/gpu_check.sh trains the models there and its report divides each
cell's FLOP/s by them (flops_per_sample, importable without torch).

Without python3-torch it exits 77. The last line of stdout is one JSON
object with the peaks and every cell (also written to --json OUT).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError:  # the FLOP counts below need no torch (gpu_check_report)
    torch = None

BATCH = 64
IMAGE = (1, 28, 28)  # Fashion-MNIST
CLASSES = 10
# examples/char_lm_fortunes.json
GPT = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block": 64}


def gemm_gflops(n, dtype, threads, device):
    """Median GFLOP/s of an n x n x n product on `threads` threads."""
    torch.set_num_threads(threads)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        torch.mm(a, b)
    sync()
    rates = []
    for _ in range(3):
        reps, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            reps += 1
            if reps % 4 == 0:
                sync()
                elapsed = time.perf_counter() - start
                if elapsed >= 0.3:
                    break
        rates.append(2.0 * n**3 * reps / elapsed / 1e9)
    return statistics.median(rates)


# Multiply-adds of each layer's forward pass, per sample.
def conv_macs(c_in, c_out, k, h_out, w_out):
    return c_in * c_out * k * k * h_out * w_out


def model_layers(model, vocab=None):
    c, h, w = IMAGE
    if model == "mlp":
        return [c * h * w * 256, 256 * 128, 128 * CLASSES]
    if model == "cnn":
        return [conv_macs(c, 32, 3, h, w),
                conv_macs(32, 64, 3, h // 2, w // 2),
                64 * (h // 4) * (w // 4) * 128, 128 * CLASSES]
    if model == "resnet":
        layers = [conv_macs(c, 16, 3, h, w)]  # the stem
        size = (h, w)
        for c_in, c_out, stride in ((16, 16, 1), (16, 32, 2), (32, 64, 2)):
            size = (size[0] // stride, size[1] // stride)
            layers += [conv_macs(c_in, c_out, 3, *size),
                       conv_macs(c_out, c_out, 3, *size)]
            if stride != 1 or c_in != c_out:
                layers.append(conv_macs(c_in, c_out, 1, *size))
        return layers + [64 * CLASSES]
    if model == "gpt":
        # Per window of T tokens; the embeddings are lookups.
        t, e = GPT["block"], GPT["n_embd"]
        block = [t * e * 3 * e,   # q, k, v
                 t * t * e,       # q k^T, all heads
                 t * t * e,       # att v
                 t * e * e,       # attention's projection
                 t * e * 4 * e,   # fc
                 t * 4 * e * e]   # fc's projection
        return block * GPT["n_layer"] + [t * e * vocab]  # tied output layer
    raise ValueError(model)


def flops_per_sample(model, vocab=None):
    """2 + 4 FLOPs per multiply-add; the images get no gradient (the gpt's
    first product takes the embeddings, which train)."""
    layers = model_layers(model, vocab)
    first_input_gradient = 0 if model == "gpt" else 2 * layers[0]
    return sum(6 * m for m in layers) - first_input_gradient


def token_data(build):
    """build/data/fortunes (scripts/text-to-tokens) and its vocabulary."""
    data = os.path.join(build, "data", "fortunes")
    if not os.path.exists(os.path.join(data, "train.bin")):
        fortunes = "/usr/share/games/fortunes"
        if not os.path.isdir(fortunes):
            return None, None
        files = [os.path.join(fortunes, f) for f in sorted(os.listdir(fortunes))]
        subprocess.run([sys.executable, "scripts/text-to-tokens", data] + files,
                       check=True, stdout=subprocess.DEVNULL)
    import array
    largest = 0
    for split in ("train.bin", "val.bin"):
        ids = array.array("H")
        with open(os.path.join(data, split), "rb") as f:
            ids.frombytes(f.read())
        largest = max(largest, max(ids))
    return data, largest + 1


def run_cell(build, model, precision, workers, steps, data):
    args = [os.path.join(build, "bin", "lockstep"), "local", "--workers",
            str(workers), "--json", "--set", f"precision={precision}",
            "--set", f"max_steps={steps}", "--set",
            f"global_batch_size={BATCH}", "--set", "log_every_steps=1000000"]
    if model == "gpt":
        args += ["--set", f"data.dir={data}", "--set", "epochs=100",
                 "examples/char_lm_fortunes.json"]
    else:
        if os.environ.get("BENCH_DATA_DIR"):
            args += ["--set", "data.dir=" + os.environ["BENCH_DATA_DIR"]]
        args += ["--set", f"model={model}", "examples/fashion_mnist_mlp.json"]
    out = subprocess.run(args, capture_output=True, text=True,
                         timeout=120 + 5 * steps)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise RuntimeError(f"{model} {precision} W={workers} failed")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["state"] == "succeeded", result
    return result["samples_per_second"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["mlp", "cnn", "resnet", "gpt"])
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--gemm", type=int, default=2048)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json")
    a = p.parse_args()
    if torch is None:
        sys.stderr.write("roofline: needs Debian's python3-torch\n")
        return 77
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16,
              "fp16": torch.float16}
    cores = os.cpu_count()

    env = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}
    print(f"roofline: {cores} cores, torch {torch.__version__}, "
          f"environment {env or 'no OPENBLAS_*'}")
    peaks = {}
    thread_counts = [1] if a.device == "cuda" else list(range(1, cores + 1))
    print(f"GEMM {a.gemm}^3 GFLOP/s (median of 3)")
    print(f"{'threads':>8} " + " ".join(f"{p_:>8}" for p_ in a.precisions))
    for threads in thread_counts:
        row = {}
        for precision in a.precisions:
            row[precision] = gemm_gflops(a.gemm, dtypes[precision], threads,
                                         a.device)
        peaks[threads] = row
        print(f"{threads:>8} " + " ".join(f"{row[p_]:>8.1f}"
                                          for p_ in a.precisions))
    peak = peaks[thread_counts[-1]]
    if a.device == "cuda":  # bench/gpu_check.sh trains the models
        result = {"device": torch.cuda.get_device_name(), "gemm": a.gemm,
                  "peaks": peaks[1]}
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
        print(json.dumps(result))
        return 0

    data, vocab = (None, None)
    if "gpt" in a.models:
        data, vocab = token_data(a.build)
        if data is None:
            sys.stderr.write("roofline: no fortunes for the gpt; skipping it\n")
            a.models = [m for m in a.models if m != "gpt"]
    flops = {m: flops_per_sample(m, vocab) for m in a.models}
    print("training FLOPs per sample (MFLOP): " + ", ".join(
        f"{m} {flops[m] / 1e6:.2f}" for m in a.models) +
        (f" (gpt: a window of {GPT['block']} tokens, vocabulary {vocab})"
         if vocab else ""))

    cells = [(m, w, p_) for m in a.models for w in a.workers
             for p_ in a.precisions]
    rates = {cell: [] for cell in cells}
    for _ in range(a.repeats):
        for cell in cells:
            model, workers, precision = cell
            rates[cell].append(run_cell(a.build, model, precision, workers,
                                        a.steps, data))
    print(f"\nglobal batch {BATCH}, {a.steps} steps, median of {a.repeats}; "
          f"peak = the GEMM on {cores} threads")
    print(f"{'model':<7} {'W':>2} {'prec':<5} {'samples/s':>10} "
          f"{'GFLOP/s':>8} {'of peak':>8}")
    rows = []
    for (model, workers, precision) in cells:
        rate = statistics.median(rates[(model, workers, precision)])
        achieved = rate * flops[model] / 1e9
        fraction = achieved / peak[precision]
        rows.append({"model": model, "workers": workers,
                     "precision": precision, "samples_per_second": rate,
                     "runs": rates[(model, workers, precision)],
                     "gflops": achieved, "fraction_of_peak": fraction})
        print(f"{model:<7} {workers:>2} {precision:<5} {rate:>10.0f} "
              f"{achieved:>8.1f} {100 * fraction:>7.1f}%")
    for model in a.models:
        for workers in a.workers:
            if {"fp32", "bf16"} <= set(a.precisions):
                r = {row["precision"]: row["samples_per_second"] for row in rows
                     if row["model"] == model and row["workers"] == workers}
                print(f"{model} W={workers}: bf16 / fp32 = "
                      f"{r['bf16'] / r['fp32']:.2f}")
    result = {"cores": cores, "peaks": peaks,
              "flops_per_sample": flops, "vocab": vocab, "cells": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
