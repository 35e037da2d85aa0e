"""lockstep's built-in models written in PyTorch, with the parameter names
lockstep gives them: a job's `"export_format": "state_dict"` file loads
into them with load_state_dict (docs/MODELS.md, "Exports").

    import torch, lockstep.models
    model = lockstep.models.build("cnn")
    model.load_state_dict(torch.load("/exports/cnn.pt"))
    model.eval()
    assert lockstep.models.digest(model) == job.digest()

Inputs are normalized as lockstep normalizes them (FASHION_MNIST_MEAN and
_STD for IDX data: (pixels / 255 - mean) / std); classifiers return logits,
gpt logits [N, T, vocab]. Needs Debian's python3-torch.
"""
import hashlib
import math

import torch
from torch import nn

from lockstep.errors import InvalidArgument

# worker/data/task_layout.cc: the published statistics of Fashion-MNIST's
# training pixels in [0, 1].
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


def normalize_pixels(pixels):
    """uint8 pixels as lockstep feeds IDX images to the model: float32
    pixels * (1 / (255 std)) - mean / std, in float32."""
    mean = torch.tensor(FASHION_MNIST_MEAN, dtype=torch.float32)
    std = torch.tensor(FASHION_MNIST_STD, dtype=torch.float32)
    scale = torch.tensor(1.0, dtype=torch.float32) / (
        torch.tensor(255.0, dtype=torch.float32) * std)
    return pixels.to(torch.float32) * scale - mean / std


def _hidden(inputs, outputs, dropout):
    layers = [nn.Linear(inputs, outputs), nn.ReLU()]
    return layers + [nn.Dropout(dropout)] if dropout > 0 else layers


class MLP(nn.Module):
    """"mlp": flatten, 256 and 128 hidden units with ReLU (and dropout after
    each when the job set model.dropout), a linear output layer."""

    def __init__(self, inputs=784, outputs=10, dropout=0.0):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), *_hidden(inputs, 256, dropout),
                                  *_hidden(256, 128, dropout))
        self.head = nn.Linear(128, outputs)

    def forward(self, x):
        return self.head(self.body(x))


class CNN(nn.Module):
    """"cnn": two 3x3 convolutions (32, 64 channels) each with ReLU and 2x2
    max-pooling, 128 hidden units, a linear output layer."""

    def __init__(self, channels=1, height=28, width=28, outputs=10,
                 dropout=0.0):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            *_hidden(64 * (height // 4) * (width // 4), 128, dropout))
        self.head = nn.Linear(128, outputs)

    def forward(self, x):
        return self.head(self.body(x))


class ResidualBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = None
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                nn.BatchNorm2d(outputs))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """"resnet": a 3x3 stem with batch norm, residual blocks of 16, 32
    (stride 2) and 64 (stride 2) channels, global average pooling, dropout,
    a linear output layer."""

    def __init__(self, channels=1, outputs=10, dropout=0.0):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(ResidualBlock(16, 16, 1),
                                    ResidualBlock(16, 32, 2),
                                    ResidualBlock(32, 64, 2))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(64, outputs)

    def forward(self, x):
        x = self.blocks(self.stem(x)).mean((2, 3))
        return self.head(self.dropout(x))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        heads = lambda m: m.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q, k, v = (heads(m) for m in self.c_attn(x).split(c, 2))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.n_head))
        hidden = torch.ones(t, t, dtype=torch.bool, device=x.device).tril().logical_not()
        att = self.attn_dropout(torch.softmax(att.masked_fill(hidden, float("-inf")), -1))
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(torch.nn.functional.gelu(
            self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    """"gpt": nanoGPT's architecture as lockstep names it (wte, wpe, h.N,
    ln_f; the output layer is wte, transposed)."""

    def __init__(self, vocab_size, block_size, n_layer=4, n_head=4,
                 n_embd=128, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout)
                               for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())


def build(name, **sizes):
    """The PyTorch module of built-in model `name` ("mlp", "cnn", "resnet",
    "gpt") with the sizes the job used (Fashion-MNIST's by default; gpt
    needs vocab_size and block_size)."""
    models = {"mlp": MLP, "cnn": CNN, "resnet": ResNet, "gpt": GPT}
    if name not in models:
        raise InvalidArgument("no built-in model %r; choose %s"
                              % (name, ", ".join(sorted(models))))
    return models[name](**sizes)


def digest(module):
    """lockstep's model_digest of a module: SHA-256 of its parameters in
    float32, in registration order (worker/train/model.cc, ModelDigest)."""
    sha = hashlib.sha256()
    for param in module.parameters():
        sha.update(param.detach().to(torch.float32).contiguous().cpu()
                   .numpy().tobytes())
    return sha.hexdigest()
