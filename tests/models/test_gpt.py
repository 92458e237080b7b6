"""The GPT (mpi_train/models/gpt.py): shapes, tied weights, causality, dropout, and its FLOPs against the 6N rule."""

import pytest
import torch

from mpi_train.models import build_model
from mpi_train.models.gpt import GPT_SIZES, VOCAB_SIZE, GptShape
from mpi_train.throughput import flops_per_sample

SHAPE = GptShape(layers=2, heads=2, width=32, context=16)


def test_logits_cover_every_position_flattened_for_the_loss():
    model = build_model("gpt", gpt_shape=SHAPE)
    tokens = torch.randint(0, VOCAB_SIZE, (3, SHAPE.context))
    logits = model(tokens)
    assert logits.shape == (3 * SHAPE.context, VOCAB_SIZE)
    loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, VOCAB_SIZE, (3 * SHAPE.context,)))
    assert abs(loss.item() - torch.log(torch.tensor(float(VOCAB_SIZE))).item()) < 0.1  # small init: near uniform
    assert model(tokens[:, :5]).shape == (3 * 5, VOCAB_SIZE)  # shorter sequences too


def test_the_output_layer_is_the_token_embedding():
    model = build_model("gpt", gpt_shape=SHAPE)
    assert model.head.weight is model.token_embedding.weight
    names = [name for name, _ in model.named_parameters()]
    assert "head.weight" not in names and "token_embedding.weight" in names  # one tensor, one gradient to sync
    params = sum(p.numel() for p in model.parameters())
    block = 12 * SHAPE.width**2 + 13 * SHAPE.width  # attention 4w^2+4w, MLP 8w^2+5w, two LayerNorms 4w
    assert params == VOCAB_SIZE * SHAPE.width + SHAPE.context * SHAPE.width + SHAPE.layers * block + 2 * SHAPE.width


def test_attention_is_causal():
    model = build_model("gpt", gpt_shape=SHAPE).eval()
    tokens = torch.randint(0, VOCAB_SIZE, (1, SHAPE.context))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % VOCAB_SIZE
    before, after = model(tokens).view(SHAPE.context, -1), model(changed).view(SHAPE.context, -1)
    assert torch.equal(before[:-1], after[:-1]) and not torch.equal(before[-1], after[-1])


def test_dropout_is_off_by_default_and_follows_the_flag():
    off = build_model("gpt", gpt_shape=SHAPE)
    assert {m.p for m in off.modules() if isinstance(m, torch.nn.Dropout)} == {0.0}
    on = build_model("gpt", dropout=0.1, gpt_shape=SHAPE)
    assert {m.p for m in on.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}


def test_the_named_sizes():
    assert GPT_SIZES["small"] == GptShape(6, 6, 384, 256)  # nanoGPT's shakespeare-char
    with torch.device("meta"):
        small = build_model("gpt", gpt_shape=GPT_SIZES["small"])
    assert sum(p.numel() for p in small.parameters()) == 10_844_160


def test_the_flop_counter_agrees_with_the_6n_rule_plus_attention():
    """Per token: 6 x the matmul parameters (the blocks' and the tied output layer's) + 12 x layers x context x width
    for attention's two matmuls, forward and backward (nanoGPT's estimate_mfu, on the full context)."""
    shape = GPT_SIZES["tiny"]
    counted = flops_per_sample(lambda: build_model("gpt", gpt_shape=shape), (shape.context,), tokens=True)
    matmul_params = shape.layers * 12 * shape.width**2 + VOCAB_SIZE * shape.width
    rule = 6 * matmul_params + 12 * shape.layers * shape.context * shape.width
    assert counted / shape.context == pytest.approx(rule, rel=0.02)


def test_powersgd_factors_every_matrix_of_the_gpt_the_tied_embedding_included():
    from mpi_train.config import TrainConfig
    from mpi_train.sync.compression.powersgd import PowerSGD

    model = TrainConfig(model="gpt", dataset="text").make_model()  # tiny: width 128
    compressor = PowerSGD(rank=2)
    matrices = {name: p for name, p in model.named_parameters() if p.dim() == 2}
    assert "token_embedding.weight" in matrices and "head.weight" not in matrices  # tied: one tensor, synced once
    assert all(compressor.compressible(p.shape) for p in matrices.values()), [
        name for name, p in matrices.items() if not compressor.compressible(p.shape)]
    assert {name.split(".")[-2] for name in matrices} >= {"qkv", "proj", "0", "2", "token_embedding"}
    factors = sum((p.shape[0] + p.shape[1]) * 2 * 4 for p in matrices.values())
    vectors = sum(p.numel() * 4 for p in model.parameters() if p.dim() < 2)
    assert compressor.wire_bytes(list(model.parameters())) == factors + vectors
    assert factors + vectors < 0.1 * sum(p.numel() * 4 for p in model.parameters())
