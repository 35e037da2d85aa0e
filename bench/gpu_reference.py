"""PyTorch on the same GPU as lockstep, for bench/gpu_check.sh: the built-in
models of worker/train/model.cc (mlp, cnn, resnet), trained from the same
job files (examples/*.json: batch, Adam or SGD, learning-rate scaling,
warmup and decay, weight decay, dropout) in fp32, bf16 or fp16, in two
modes:
  eager  the model as is, one process
  ddp    DistributedDataParallel with 1 process (NCCL on a GPU, Gloo on the
         CPU), as a 1-replica DDP job would run
Like lockstep's trainer: the data set lives on the device and batches are
gathered there; normalized with the training set's mean and std; autocast
(bf16, fp16) for the body while the output layer and the loss stay fp32;
fp16 with a dynamic loss scaler (torch.amp.GradScaler); no host
synchronisation inside the timed steps. Samples/s is measured after
--warmup steps. The test set is evaluated once at the end.

Everything runs in one process (one CUDA context, one start-up). Progress
goes to stderr; stdout gets one JSON object:
  {"torch": ..., "device": ..., "results": [{model, precision, mode,
   batch, steps, samples_per_second, test_accuracy, final_loss, error?}]}
A configuration that fails is recorded with its error; the others run.

  python3 bench/gpu_reference.py --data DIR --steps 300 \
      --job examples/fashion_mnist_mlp.json --job examples/fashion_mnist_cnn.json \
      --precisions fp32,bf16,fp16 --modes eager,ddp
  python3 bench/gpu_reference.py --device cpu --steps 3 --warmup 1 ...   (smoke)
"""
import argparse
import contextlib
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def log(*args):
    print("gpu_reference:", *args, file=sys.stderr, flush=True)


# ---- data --------------------------------------------------------------------
def read_idx(directory, name):
    for path in (f"{directory}/{name}.gz", f"{directory}/{name}"):
        if os.path.exists(path):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rb") as f:
                data = f.read()
            dims = data[3]
            shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
                     for i in range(dims)]
            return np.frombuffer(data, dtype=np.uint8,
                                 offset=4 + 4 * dims).reshape(shape)
    raise FileNotFoundError(f"{directory}/{name}[.gz]")


class DeviceData:
    """Both splits as uint8 on the device; batches gathered and normalized
    there (worker/train/tensor_dataset.cc: the training set's mean and std,
    pixels as [0, 1] values)."""

    def __init__(self, directory, device):
        def load(prefix):
            x = read_idx(directory, f"{prefix}-images-idx3-ubyte")
            y = read_idx(directory, f"{prefix}-labels-idx1-ubyte")
            return (torch.from_numpy(x.copy()).to(device).unsqueeze(1),
                    torch.from_numpy(y.astype(np.int64)).to(device))
        self.train_x, self.train_y = load("train")
        self.test_x, self.test_y = load("t10k")
        pixels = self.train_x.double() / 255.0
        self.mean = float(pixels.mean())
        self.std = float(pixels.std(unbiased=False))
        del pixels

    def normalize(self, x):
        return x.float().div_(255.0 * self.std).sub_(self.mean / self.std)


# ---- models (worker/train/model.cc) ------------------------------------------
class ResidualBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNetBody(nn.Module):
    def __init__(self, channels, dropout):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(ResidualBlock(16, 16, 1),
                                    ResidualBlock(16, 32, 2),
                                    ResidualBlock(32, 64, 2))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.blocks(self.stem(x)).mean((2, 3)))


def hidden(layers, cin, cout, p):
    layers += [nn.Linear(cin, cout), nn.ReLU()]
    if p > 0:
        layers.append(nn.Dropout(p))


class Network(nn.Module):
    """A body under the caller's autocast and a linear head in fp32 (the
    features cast to fp32, autocast off), as SequentialNetwork and ResNet
    compute their logits."""

    def __init__(self, name, dropout, channels=1, rows=28, cols=28, classes=10):
        super().__init__()
        if name == "mlp":
            layers = [nn.Flatten()]
            hidden(layers, channels * rows * cols, 256, dropout)
            hidden(layers, 256, 128, dropout)
            self.body, self.head = nn.Sequential(*layers), nn.Linear(128, classes)
        elif name == "cnn":
            layers = [nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten()]
            hidden(layers, 64 * (rows // 4) * (cols // 4), 128, dropout)
            self.body, self.head = nn.Sequential(*layers), nn.Linear(128, classes)
        elif name == "resnet":
            self.body, self.head = ResNetBody(channels, dropout), nn.Linear(64, classes)
        else:
            raise ValueError(f"unknown model {name!r}")

    def forward(self, x):
        features = self.body(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.head(features.float())


# ---- the job file's training settings ----------------------------------------
class Job:
    def __init__(self, path, workers=1):
        with open(path) as f:
            spec = json.load(f)
        model = spec.get("model", "mlp")
        if isinstance(model, str):
            model = {"name": model}
        self.path = path
        self.model = model.get("name", "mlp")
        self.dropout = float(model.get("dropout", 0.0))
        if "global_batch_size" in spec:
            self.batch = int(spec["global_batch_size"]) // workers
        else:
            self.batch = int(spec.get("per_replica_batch_size", 32))
        self.global_batch = self.batch * workers
        self.base_lr = float(spec.get("base_lr", 0.1))
        self.reference = int(spec.get("reference_batch_size", 0)) or self.global_batch
        self.scaling = spec.get("lr_scaling", "none")
        self.warmup = int(spec.get("warmup_steps", 0))
        self.decay = spec.get("lr_decay", "none")
        self.min_lr = float(spec.get("min_lr", 0.0))
        optimizer = spec.get("optimizer", {})
        self.optimizer = optimizer.get("type", "sgd")
        self.momentum = float(optimizer.get("momentum", 0.9))
        self.weight_decay = float(optimizer.get("weight_decay", 0.0))
        self.seed = int(spec.get("seed", 1))

    def lr(self, step, total):
        """worker/train/lr_schedule.cc (none, sqrt and linear scaling;
        warmup from base_lr to the scaled rate; cosine decay)."""
        ratio = self.global_batch / self.reference
        scaled = self.base_lr * {"linear": ratio, "sqrt": math.sqrt(ratio)}.get(
            self.scaling, 1.0)
        if step < self.warmup:
            return self.base_lr + (scaled - self.base_lr) * step / self.warmup
        if self.decay == "cosine":
            span = max(1, total - self.warmup)
            progress = min(1.0, (step - self.warmup) / span)
            return self.min_lr + (scaled - self.min_lr) * 0.5 * (
                1 + math.cos(math.pi * progress))
        return scaled

    def make_optimizer(self, params, foreach=True):
        # foreach=None: PyTorch's default (multi-tensor kernels on a GPU).
        foreach = None if foreach else False
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.base_lr,
                                    weight_decay=self.weight_decay, foreach=foreach)
        return torch.optim.SGD(params, lr=self.base_lr, momentum=self.momentum,
                               weight_decay=self.weight_decay, foreach=foreach)


AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device, dtype):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_one(job, precision, mode, data, device, steps, warmup):
    # A mode is "eager" or "ddp", optionally with "+item" (read the loss on
    # the host every step, as lockstep does) and "+loop" (the optimizer one
    # parameter at a time, as LibTorch's C++ optimizers are): variants that
    # tell apart where lockstep's host side spends its time.
    base, *variants = mode.split("+")
    torch.manual_seed(job.seed)
    model = Network(job.model, job.dropout).to(device)
    net = model
    if base == "ddp":
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = job.make_optimizer(net.parameters(), foreach="loop" not in variants)
    read_loss = "item" in variants
    dtype = AUTOCAST[precision]
    scaler = None
    if precision == "fp16":
        scaler = (torch.amp.GradScaler(device.type) if hasattr(torch.amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())
    generator = torch.Generator(device=device).manual_seed(job.seed)
    n = data.train_x.shape[0]
    per_epoch = n // job.batch
    order = None
    net.train()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = None
    for step in range(steps):
        if step == warmup:
            sync()
            started = time.perf_counter()
        k = step % per_epoch
        if k == 0:
            order = torch.randperm(n, device=device, generator=generator)
        index = order[k * job.batch:(k + 1) * job.batch]
        x = data.normalize(data.train_x[index])
        y = data.train_y[index]
        for group in optimizer.param_groups:
            group["lr"] = job.lr(step, steps)
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            logits = net(x)
        loss = F.cross_entropy(logits, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if read_loss:
            float(loss)
    sync()
    elapsed = time.perf_counter() - started if started is not None else float("nan")
    timed = steps - warmup

    model.eval()
    correct = 0
    with torch.no_grad(), autocast(device, dtype):
        for i in range(0, data.test_x.shape[0], 1000):
            logits = model(data.normalize(data.test_x[i:i + 1000]))
            correct += int((logits.argmax(1) == data.test_y[i:i + 1000]).sum())
    return {
        "samples_per_second": timed * job.batch / elapsed if timed > 0 else None,
        "test_accuracy": correct / data.test_x.shape[0],
        "final_loss": float(loss),
        "timed_steps": timed,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", action="append", required=True,
                        help="a job file (examples/*.json); repeatable")
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--precisions", default="fp32,bf16,fp16")
    parser.add_argument("--modes", default="eager,ddp",
                        help="eager, ddp, each optionally +item and/or +loop "
                             "(see train_one)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if args.warmup >= args.steps:
        parser.error("--warmup must be below --steps")

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({"error": "torch.cuda.is_available() is false",
                              "torch": torch.__version__}), flush=True)
            return 1
        torch.cuda.set_device(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    out = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "results": [],
    }
    t0 = time.perf_counter()
    data = DeviceData(args.data, device)
    log(f"data on {device} in {time.perf_counter() - t0:.1f} s "
        f"(mean {data.mean:.4f}, std {data.std:.4f})")

    modes = [m for m in args.modes.split(",") if m]
    if any(m.split("+")[0] == "ddp" for m in modes):
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
        except Exception as e:  # recorded; eager still runs
            out["ddp_error"] = f"{type(e).__name__}: {e}"
            log("DDP unavailable:", out["ddp_error"])
            modes = [m for m in modes if m.split("+")[0] != "ddp"]

    for path in args.job:
        job = Job(path)
        for precision in [p for p in args.precisions.split(",") if p]:
            for mode in modes:
                row = {"model": job.model, "job": os.path.basename(path),
                       "precision": precision, "mode": mode, "batch": job.batch,
                       "steps": args.steps}
                t = time.perf_counter()
                try:
                    row.update(train_one(job, precision, mode, data, device,
                                         args.steps, args.warmup))
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                row["seconds"] = round(time.perf_counter() - t, 2)
                out["results"].append(row)
                log(f"{job.model:6s} {precision} {mode:5s} batch {job.batch}: " + (
                    f"{row['samples_per_second']:.0f} samples/s, "
                    f"test accuracy {row['test_accuracy']:.4f}"
                    if "error" not in row else row["error"]))
    if dist.is_initialized():
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    return 1 if any("error" in r for r in out["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
