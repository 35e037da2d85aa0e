"""Bring a PyTorch model to lockstep: script_training_step wraps an
nn.Module and its loss into the training-step contract the workers run
(docs/MODELS.md, "Training-step modules") and checks it with a dry run.
Needs Debian's python3-torch."""
import re
from typing import Dict

import torch
from torch import nn

from lockstep.errors import InvalidArgument

# What the worker accepts as an evaluation's sums (worker/train/model.cc).
_SUM_NAME = re.compile("[a-z0-9_]{1,27}")
_MAX_SUMS = 15


def _as_module(loss_fn):
    if isinstance(loss_fn, nn.Module):
        return loss_fn

    class Loss(nn.Module):  # a function: scripted through the closure
        def forward(self, outputs: torch.Tensor,
                    target: torch.Tensor) -> torch.Tensor:
            return loss_fn(outputs, target)

    return Loss()


class _TrainingStep(nn.Module):
    """forward(batch) -> {"loss"}; eval_step(batch) -> {"loss"} and, for a
    classifier, the correct predictions and the count."""

    def __init__(self, model, loss, input_column, target_column, accuracy):
        super().__init__()
        self.model = model
        self.loss = loss
        self.input_column = input_column
        self.target_column = target_column
        self.accuracy = accuracy

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        outputs = self.model(batch[self.input_column])
        return {"loss": self.loss(outputs, batch[self.target_column])}

    @torch.jit.export
    def eval_step(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        outputs = self.model(batch[self.input_column])
        target = batch[self.target_column]
        out = {"loss": self.loss(outputs, target)}
        if self.accuracy:
            out["accuracy"] = (outputs.argmax(1) == target).sum().float()
            out["count"] = torch.tensor(float(target.size(0)))
        return out


def script_training_step(module, loss_fn, example_batch, path=None, *,
                         input="image", target="label", accuracy=False):
    """The training-step module of `module` and `loss_fn`, scripted.

    module: an nn.Module that takes the batch's `input` column as lockstep
        hands it to a training-step module (float32 for float columns, int64
        for integer ones such as IDX pixels, not normalized) and returns
        what loss_fn takes.
    loss_fn: loss_fn(outputs, batch[target]) -> the batch's mean loss, a
        scalar; an nn.Module (nn.CrossEntropyLoss()) or a scriptable
        function.
    example_batch: {column: tensor [N, ...]} like the job's batches: the
        dry run calls forward and eval_step on it.
    accuracy: eval_step also counts correct argmax predictions, so the job
        reports test_accuracy.
    path: where to write it (torch.jit.save); the job's model.torchscript
        names it, with "task": {"type": "custom"}.

    Raises InvalidArgument when the module cannot be scripted, fails on the
    example batch, returns a loss that is not a scalar, or has parameters
    lockstep would refuse (not float32, or frozen).
    """
    for name, param in module.named_parameters():
        if param.dtype != torch.float32:
            raise InvalidArgument(
                "parameter %s is %s: lockstep trains float32 parameters "
                "(choose bf16 with the job's precision)" % (name, param.dtype))
        if not param.requires_grad:
            raise InvalidArgument(
                "parameter %s is frozen: lockstep trains every parameter "
                "(make it a buffer with register_buffer)" % name)
    for column in (input, target):
        if column not in example_batch:
            raise InvalidArgument("the example batch has no column %r (it has "
                                  "%s)" % (column, ", ".join(example_batch)))
    step = _TrainingStep(module, _as_module(loss_fn), input, target, accuracy)
    try:
        scripted = torch.jit.script(step)
    except Exception as error:  # pylint: disable=broad-except
        raise InvalidArgument("the module or the loss cannot be scripted "
                              "(torch.jit.script): %s" % error) from None
    # The dry run leaves the module as it was (batch norm's statistics).
    saved = {name: value.clone() for name, value in scripted.state_dict().items()}
    was_training = scripted.training
    try:
        with torch.no_grad():
            loss = scripted(example_batch)["loss"]
            scripted.eval()
            sums = scripted.eval_step(example_batch)
    except Exception as error:  # pylint: disable=broad-except
        raise InvalidArgument("the dry run on the example batch failed: %s"
                              % error) from None
    finally:
        scripted.train(was_training)
        scripted.load_state_dict(saved)
    if loss.numel() != 1:
        raise InvalidArgument("the loss has shape %s; it must be a scalar (the "
                              "batch's mean)" % list(loss.shape))
    for name, value in sums.items():
        if value.numel() != 1 or not _SUM_NAME.fullmatch(name):
            raise InvalidArgument(
                "eval_step returns %r of shape %s; every output must be a "
                "scalar named by 1 to 27 lower-case letters, digits or '_'"
                % (name[:64], list(value.shape)))
    if len(sums) > _MAX_SUMS + 1:
        raise InvalidArgument("eval_step returns %d sums besides the loss; at "
                              "most %d" % (len(sums) - 1, _MAX_SUMS))
    if path is not None:
        torch.jit.save(scripted, path)
    return scripted
