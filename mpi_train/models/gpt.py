"""A decoder-only transformer on bytes, in nanoGPT's shape: token and position embeddings, pre-norm blocks of causal
self-attention and an MLP, a final LayerNorm and an output layer tied to the token embedding.

Its vocabulary is the 256 byte values (no tokenizer). It returns the logits of every position flattened to
(batch x context, 256), so the training step's `F.cross_entropy(net(tokens), targets)` against the flattened next
bytes is the mean loss over every position, as a language model is trained and scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

VOCAB_SIZE = 256  # bytes


@dataclass(frozen=True)
class GptShape:
    """The size of a GPT: layers, attention heads, width (embedding size) and context (tokens per sequence)."""

    layers: int
    heads: int
    width: int
    context: int

    def describe(self) -> str:
        return f"{self.layers} layers, {self.heads} heads, width {self.width}, context {self.context}"

    @property
    def parameters(self) -> int:
        """The GPT's parameter count, without building it: the embeddings, per block two LayerNorms, the attention's
        qkv and projection and the MLP's two layers (12·w² + 13·w), and the final LayerNorm; the head is tied."""
        w = self.width
        return (VOCAB_SIZE + self.context) * w + self.layers * (12 * w * w + 13 * w) + 2 * w


# The named sizes of --gpt-size. tiny trains a few hundred steps on a 2-core machine in minutes; small is nanoGPT's
# shakespeare-char shape (10.8M parameters on bytes); medium has GPT-2 small's shape (85M parameters on bytes).
GPT_SIZES = {
    "tiny": GptShape(layers=4, heads=4, width=128, context=128),
    "small": GptShape(layers=6, heads=6, width=384, context=256),
    "medium": GptShape(layers=12, heads=12, width=768, context=1024),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GptShape, dropout: float):
        super().__init__()
        self.heads = shape.heads
        self.qkv = nn.Linear(shape.width, 3 * shape.width)  # queries, keys and values of every head in one matmul
        self.proj = nn.Linear(shape.width, shape.width)
        self.attention_dropout, self.residual_dropout = dropout, nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        # torch's fused attention (flash attention on a GPU, as nanoGPT runs it): the T x T scores never reach memory;
        # torch's FLOP counter counts its kernels as the two matmuls they fuse
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attention_dropout if self.training else 0.0,
                                           is_causal=True)
        return self.residual_dropout(self.proj(y.transpose(1, 2).contiguous().view(batch, length, width)))


class Block(nn.Module):
    def __init__(self, shape: GptShape, dropout: float):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(shape.width), CausalSelfAttention(shape, dropout)
        self.norm2 = nn.LayerNorm(shape.width)
        self.mlp = nn.Sequential(nn.Linear(shape.width, 4 * shape.width), nn.GELU(),
                                 nn.Linear(4 * shape.width, shape.width), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))  # pre-norm: each sublayer reads a normalised copy of the residual
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, shape: GptShape, dropout: float = 0.0):
        super().__init__()
        if shape.width % shape.heads:
            raise ValueError(f"the width {shape.width} must split evenly across {shape.heads} heads")
        self.shape = shape
        self.token_embedding = nn.Embedding(VOCAB_SIZE, shape.width)
        self.position_embedding = nn.Embedding(shape.context, shape.width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(shape, dropout) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, VOCAB_SIZE, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix reads bytes in and writes them out
        self.apply(self._init)
        for name, parameter in self.named_parameters():  # GPT-2's scaled init of the layers that add to the residual
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * shape.layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the next byte at every position of `tokens` (batch, length), as (batch x length, 256)."""
        length = tokens.size(1)
        if length > self.shape.context:
            raise ValueError(f"a sequence of {length} tokens is longer than the context {self.shape.context}")
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        # the head takes the positions flattened, so that its output is a tensor of its own, not a view (FSDP2 warns
        # of a wrapped module that returns one)
        return self.head(self.norm(x).flatten(0, 1))


def gpt(shape: GptShape, dropout: float | None = None) -> GPT:
    """A GPT of `shape`; dropout 0 unless given (nanoGPT's default for pretraining)."""
    return GPT(shape, 0.0 if dropout is None else dropout)
