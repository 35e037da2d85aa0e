#!/usr/bin/env python3
"""Models PyTorch loads (CTest: python_exports): jobs on a LocalCluster
export their final model as "torchscript" and "state_dict", and Python
without lockstep loads them.

For each built-in model, trained briefly on Fashion-MNIST:
- the state_dict loads (strict) into lockstep.models' module, whose
  lockstep digest is the job's model_digest;
- torch.jit.load of the TorchScript export gives that module's outputs on
  the test images within 1e-6;
- that module's test loss and accuracy over the 10,000 test images are the
  ones the job reported (lockstep's own evaluation);
- the exports come back through the coordinator (its --artifact-dir, which
  LocalCluster sets): the same bytes, Job.load_model() gives the job's test
  loss and digest, lockstep.aio downloads them too;
- a job's last checkpoint (checkpoint.upload_last) comes back as a
  backup_dir that another job resumes from, ending with the digest of a job
  run straight through.
gpt is checked the same way on a Markov chain's tokens (digest, outputs).
And a model written in plain PyTorch, wrapped by
lockstep.script_training_step, trains on 2 workers; its export is the
trained model (digest) and gives the plain module's outputs.
"""
import asyncio
import gzip
import hashlib
import os
import subprocess
import tempfile
import unittest

import numpy
import torch

import lockstep
import lockstep.aio
import lockstep.models
from lockstep.torchscript import script_training_step

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
FASHION = "/usr/share/datasets/fashion-mnist"
SHORT = {"max_steps": 20, "epochs": 1, "global_batch_size": 64,
         "num_workers": 1, "optimizer": {"type": "adam"}, "base_lr": 0.001}
WAIT_SECONDS = 300


def read_idx(name, offset):
    with gzip.open(os.path.join(FASHION, name)) as f:
        return numpy.frombuffer(f.read(), dtype=numpy.uint8, offset=offset)


def test_set():
    pixels = torch.from_numpy(read_idx("t10k-images-idx3-ubyte.gz", 16)
                              .reshape(-1, 1, 28, 28).copy())
    labels = torch.from_numpy(read_idx("t10k-labels-idx1-ubyte.gz", 8)
                              .astype(numpy.int64))
    return lockstep.models.normalize_pixels(pixels), labels


def per_sample_loss(outputs: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return outputs.sum(1)  # not the batch's mean: refused


class ExportTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="lockstep-export-test-")
        cls.cluster = lockstep.LocalCluster(
            workers=2, threads=1, data_roots=[cls.work],
            export_roots=[cls.work])
        cls.client = cls.cluster.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()
        subprocess.run(["rm", "-rf", cls.work], check=False)

    def export(self, name, form, spec=None, tag="", **fields):
        path = os.path.join(self.work, "%s-%s%s.pt" % (name, form, tag))
        job = self.client.submit(spec or {"model": name}, SHORT, export=path,
                                 export_format=form,
                                 name="%s-%s%s" % (name, form, tag), **fields)
        return job, path

    def test_built_in_models(self):
        jobs = {(name, form): self.export(name, form)
                for name in ("mlp", "cnn", "resnet")
                for form in ("torchscript", "state_dict")}
        images, labels = test_set()
        for name in ("mlp", "cnn", "resnet"):
            (ts_job, ts_path) = jobs[(name, "torchscript")]
            (sd_job, sd_path) = jobs[(name, "state_dict")]
            final = sd_job.wait(timeout=WAIT_SECONDS)
            ts_job.wait(timeout=WAIT_SECONDS)
            model = lockstep.models.build(name)
            model.load_state_dict(torch.load(sd_path))
            model.eval()
            self.assertEqual(lockstep.models.digest(model), final.ranks[0].model_digest)
            self.assertEqual(ts_job.digest(), final.ranks[0].model_digest)
            scripted = torch.jit.load(ts_path)
            with torch.no_grad():  # in chunks, as lockstep evaluates
                logits = torch.cat([model(chunk) for chunk in images.split(256)])
                gap = (scripted(images[:256]) - model(images[:256])).abs().max()
            self.assertLessEqual(gap.item(), 1e-6, name)
            loss = torch.nn.functional.cross_entropy(logits, labels).item()
            accuracy = (logits.argmax(1) == labels).double().mean().item()
            self.assertAlmostEqual(loss, final.test_loss, delta=1e-5, msg=name)
            self.assertAlmostEqual(accuracy, final.test_accuracy, delta=1e-4,
                                   msg=name)
            # The same models back through the coordinator (issue 53): kept
            # byte for byte, loaded without the workers' folders.
            (kept,) = ts_job.artifacts()
            with open(ts_path, "rb") as f:
                self.assertEqual(kept.sha256,
                                 hashlib.sha256(f.read()).hexdigest(), name)
            self.assertEqual((kept.name, kept.format, kept.step),
                             ("model", "torchscript", 20))
            back = ts_job.load_model()
            with torch.no_grad():
                back_logits = torch.cat([back(chunk)
                                         for chunk in images.split(256)])
            self.assertAlmostEqual(
                torch.nn.functional.cross_entropy(back_logits, labels).item(),
                final.test_loss, delta=1e-5, msg=name)
            self.assertEqual(lockstep.models.digest(sd_job.load_model()),
                             final.ranks[0].model_digest, name)

    def test_a_model_comes_back_through_lockstep_aio(self):
        job, path = self.export("mlp", "torchscript", tag="-aio")
        job.wait(timeout=WAIT_SECONDS)

        async def download(target):
            async with lockstep.aio.Client(self.cluster.address,
                                           self.cluster.cert, self.cluster.key,
                                           self.cluster.ca) as client:
                return await client.job(job.id).download_model(target)

        target = os.path.join(self.work, "back-aio.pt")
        self.assertEqual(asyncio.run(download(target)), target)
        with open(path, "rb") as a, open(target, "rb") as b:
            self.assertEqual(a.read(), b.read())
        # An archive (LibTorch's C++ format) is not Python's to load.
        archive, _ = self.export("mlp", "archive", tag="-aio")
        archive.wait(timeout=WAIT_SECONDS)
        with self.assertRaises(lockstep.FailedPrecondition):
            archive.load_model()

    def test_the_last_checkpoint_comes_back(self):
        # A job that asks for its checkpoint (checkpoint.upload_last): the
        # chief uploads its final state; unpacked, it is a backup_dir that
        # another job resumes from, ending where a job run straight through
        # would (the same model digest).
        backups = os.path.join(self.work, "backups-upload")
        base = dict(SHORT, num_workers=2, name="ckpt-upload")
        job = self.client.submit({"model": "mlp"}, base, checkpoint={
            "backup_dir": backups, "upload_last": True,
            "save_every_steps": 10})
        job.wait(timeout=WAIT_SECONDS)
        kept = {a.name: a for a in job.artifacts()}
        self.assertEqual((kept["checkpoint"].file_name,
                          kept["checkpoint"].format, kept["checkpoint"].step),
                         ("ckpt-000000020.tar", "checkpoint", 20))
        # Uploaded, the job's own checkpoints are gone (keep_backups unset).
        self.assertFalse(os.path.exists(os.path.join(backups, "LATEST")))
        resumed_dir = job.download_checkpoint(
            os.path.join(self.work, "resumed-backups"))
        with open(os.path.join(resumed_dir, "LATEST")) as f:
            self.assertEqual(f.read().strip(), "ckpt-000000020")
        with self.assertRaises(lockstep.FailedPrecondition):  # not empty
            job.download_checkpoint(resumed_dir)

        longer = dict(base, max_steps=30, name="ckpt-resumed")
        resumed = self.client.submit({"model": "mlp"}, longer, checkpoint={
            "backup_dir": resumed_dir})
        straight = self.client.submit({"model": "mlp"},
                                      dict(longer, name="ckpt-straight"))
        final = resumed.wait(timeout=WAIT_SECONDS)
        self.assertEqual(final.step, 30)
        self.assertTrue(any("after step 20" in e.message
                            for e in final.events if e.kind == "resumed"),
                        [e.message for e in final.events])
        self.assertEqual(final.ranks[0].model_digest,
                         straight.wait(timeout=WAIT_SECONDS)
                         .ranks[0].model_digest)

    def test_a_hostile_checkpoint_archive_is_not_unpacked(self):
        import io
        import tarfile
        from lockstep.client import unpack_checkpoint
        tar = os.path.join(self.work, "hostile.tar")
        with tarfile.open(tar, "w") as archive:
            info = tarfile.TarInfo("../escaped")
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
        target = os.path.join(self.work, "hostile-out")
        with self.assertRaisesRegex(lockstep.DataLoss, "escaped"):
            unpack_checkpoint(tar, target, "job-x")
        self.assertFalse(os.path.exists(os.path.join(self.work, "escaped")))
        # Nor a link, inside the folder or not.
        with tarfile.open(tar, "w") as archive:
            info = tarfile.TarInfo("ckpt-000000001/model.pt")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            archive.addfile(info)
        with self.assertRaisesRegex(lockstep.DataLoss, "model.pt"):
            unpack_checkpoint(tar, target, "job-x")

    def test_gpt(self):
        data = os.path.join(self.work, "markov")
        subprocess.run([os.path.join(os.environ["LOCKSTEP_BIN_DIR"],
                                     "lockstep-example-data"), "markov", data],
                       check=True, stdout=subprocess.DEVNULL)
        spec = {"task": {"type": "language_model"},
                "model": {"name": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32},
                "data": {"format": "tokens", "dir": data, "block_size": 16}}
        ts_job, ts_path = self.export("gpt", "torchscript", spec)
        sd_job, sd_path = self.export("gpt", "state_dict", spec)
        final = sd_job.wait(timeout=WAIT_SECONDS)
        ts_job.wait(timeout=WAIT_SECONDS)
        state = torch.load(sd_path)
        vocab, block = state["wte.weight"].shape[0], state["wpe.weight"].shape[0]
        model = lockstep.models.build("gpt", vocab_size=vocab, block_size=block,
                                      n_layer=2, n_head=2, n_embd=32)
        model.load_state_dict(state)
        model.eval()
        self.assertEqual(lockstep.models.digest(model), final.ranks[0].model_digest)
        self.assertEqual(ts_job.digest(), final.ranks[0].model_digest)
        tokens = torch.randint(0, vocab, (4, block), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            gap = (torch.jit.load(ts_path)(tokens) - model(tokens)).abs().max()
        self.assertLessEqual(gap.item(), 1e-6)

    def test_a_plain_pytorch_model(self):
        class Net(torch.nn.Module):  # not one of lockstep's
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(1, 8, 5, padding=2)
                self.out = torch.nn.Linear(8 * 14 * 14, 10)

            def forward(self, pixels):
                x = (pixels.float() / 255.0 - 0.5).view(-1, 1, 28, 28)
                x = torch.max_pool2d(torch.relu(self.conv(x)), 2)
                return self.out(x.flatten(1))

        torch.manual_seed(0)
        net = Net()
        example = {"image": torch.randint(0, 256, (4, 28, 28)),
                   "label": torch.randint(0, 10, (4,))}
        step_path = os.path.join(self.work, "step.pt")
        script_training_step(net, torch.nn.CrossEntropyLoss(), example,
                             step_path, accuracy=True)
        export = os.path.join(self.work, "plain-trained.pt")
        job = self.client.submit(
            {"model": {"torchscript": step_path}, "task": {"type": "custom"}},
            SHORT, num_workers=2, export=export, name="plain-pytorch")
        final = job.wait(timeout=WAIT_SECONDS)
        self.assertIn("test_accuracy", final.test_metrics)
        trained = torch.jit.load(export)
        self.assertEqual(lockstep.models.digest(trained), final.ranks[0].model_digest)
        self.assertNotEqual(lockstep.models.digest(net), final.ranks[0].model_digest)
        net.load_state_dict({k[len("model."):]: v for k, v in
                             trained.state_dict().items() if k.startswith("model.")})
        self.assertEqual(lockstep.models.digest(net), final.ranks[0].model_digest)
        batch = {"image": torch.from_numpy(read_idx("t10k-images-idx3-ubyte.gz", 16)
                                           [:64 * 784].reshape(64, 28, 28).astype(numpy.int64)),
                 "label": torch.zeros(64, dtype=torch.int64)}
        with torch.no_grad():
            gap = (trained.model(batch["image"]) - net(batch["image"])).abs().max()
        self.assertEqual(gap.item(), 0.0)

    def test_script_training_step_refuses_what_lockstep_would(self):
        frozen = torch.nn.Linear(4, 2)
        frozen.weight.requires_grad_(False)
        example = {"image": torch.zeros(2, 4), "label": torch.zeros(2, dtype=torch.int64)}
        with self.assertRaisesRegex(lockstep.InvalidArgument, "frozen"):
            script_training_step(frozen, torch.nn.CrossEntropyLoss(), example)
        with self.assertRaisesRegex(lockstep.InvalidArgument, "no column 'x'"):
            script_training_step(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(),
                                 example, input="x")
        with self.assertRaisesRegex(lockstep.InvalidArgument, "scalar"):
            script_training_step(torch.nn.Linear(4, 2), per_sample_loss, example)


if __name__ == "__main__":
    unittest.main()
