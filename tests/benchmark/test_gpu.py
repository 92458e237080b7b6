"""The GPU check's measuring code, run on CPUs (the GPU figures themselves are in docs/results.md)."""

import pytest

from mpi_train.benchmark.gpu import bare_step, combinations, machine, method_names, rate, table
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.sync import SYNC_METHODS, every_label, label


def test_every_method_and_compression_is_checked_that_the_backend_runs():
    nccl = {label(*pair) for pair in combinations("nccl", list(SYNC_METHODS))}
    assert nccl == set(every_label())  # all of them under NCCL
    gloo = {label(*pair) for pair in combinations("gloo", list(SYNC_METHODS))}
    assert "ddp_powersgd" in nccl and "ddp_powersgd" not in gloo and "bucketed+powersgd" in gloo


def test_the_table_counts_what_failed():
    text = table([{"check": "a", "ok": True, "figure": "1"}, {"check": "bb", "ok": False, "figure": "2"}], "cpu")
    assert text.splitlines()[-1] == "1 passed, 1 failed" and "FAIL" in text.splitlines()[3]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_the_bare_loop_trains_in_the_precision_asked(precision):
    import torch

    workload = TrainConfig(model="gpt", dataset="text", gpt_layers=1, gpt_width=16, gpt_heads=2, context=8)
    models, computed = [], []

    def wrap(model):  # the bare loop's own model, its output layer's dtype noted at each forward
        model.head.register_forward_hook(lambda module, inputs, output: computed.append(output.dtype))
        models.append(model)
        return model

    step = bare_step(workload, 4, torch.device("cpu"), wrap=wrap, precision=precision)
    before = [p.detach().clone() for p in models[0].parameters()]
    step()
    step()
    expected = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]
    assert computed == [expected] * 2
    after = list(models[0].parameters())  # stepped (16-mixed's first steps too: no overflow here), still float32
    assert all(p.dtype == torch.float32 for p in after) and all(not torch.equal(p, b) for p, b in zip(after, before))


def test_a_job_rate_is_tokens_for_a_language_model_and_samples_else():
    assert rate({"throughput": {"samples_per_s_per_rank": 80.0, "tokens_per_s_per_rank": 640.0}}) == (640.0, "tokens/s")
    assert rate({"throughput": {"samples_per_s_per_rank": 80.0}}) == (80.0, "samples/s")
    assert method_names("ddp, zero", "--methods") == ["ddp", "zero"] and method_names("", "--x") == []
    with pytest.raises(UserError, match="--float16-methods names dpp, which is no sync method"):
        method_names("ddp,dpp", "--float16-methods")



def test_the_machine_line_names_the_device_the_ranks_and_torch():
    import torch

    assert machine(torch.device("cpu"), 2) == f"cpu x 2, torch {torch.__version__}"
