"""A sync method is one file and one registry entry: everything else learns about it from its traits."""

import importlib.util
import textwrap

import pytest

from mpi_train.analysis.predict import predict_rows, registered_methods
from mpi_train.commands.train import parse_config
from mpi_train.errors import UserError
from mpi_train.lab.experiment_file import parse
from mpi_train.models import build_model
from mpi_train.netmodel import Link, Network, tensor_sizes
from mpi_train.sync import SYNC_METHODS, every_label, parse_labels, tuned_by

THROWAWAY = '''
"""throwaway: every gradient in one buffer, reduced through rank 0 (a test's method, in a file of its own)."""

import torch.distributed as dist

from mpi_train.sync.base import EVERY_COMPRESSION, SyncMethod
from mpi_train.sync.messages import ONE_BUFFER
from mpi_train.sync.traits import ROOT, Traits


class Throwaway(SyncMethod):
    traits = Traits(family=ROOT, messages=ONE_BUFFER, compressions=EVERY_COMPRESSION)

    def sync(self, model):
        for p in model.parameters():
            dist.all_reduce(p.grad)
'''


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The method written to a file of its own and registered in one line."""
    path = tmp_path / "throwaway.py"
    path.write_text(textwrap.dedent(THROWAWAY))
    spec = importlib.util.spec_from_file_location("throwaway", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(SYNC_METHODS, "throwaway", module.Throwaway)  # the registry line
    return module.Throwaway


def test_a_method_in_one_file_and_one_registry_line_reaches_every_tool(throwaway, tmp_path):
    assert parse_config(["--sync", "throwaway", "--compression", "fp16"]).sync == "throwaway"  # training's --sync
    sweep = parse('[experiment]\nname = "x"\n[[sweep]]\nsync = "all"\nnp = [2]\n', tmp_path / "x.toml")
    assert "throwaway-np2-seed42" in [run.name for run in sweep.runs]  # sync = "all"
    assert {"throwaway", "throwaway+fp16", "throwaway+powersgd"} <= set(every_label())  # the bench's list
    assert parse_labels("throwaway+bf16") == ["throwaway+bf16"]
    model = build_model("mnist_cnn")
    sizes = tensor_sizes(model)
    methods = registered_methods()
    link = Link(100e-6, 1 / 125e6)
    rows = {row.method: row for row in predict_rows(sizes, 8, 2, Network(link, link), 0.1, methods,
                                                    {name: (1.0, 0.0) for name in methods})}
    assert "throwaway" in rows
    # modelled by its attributes: one buffer through rank 0, exactly gather_scatter's bytes in one message
    through_root = 2 * (8 - 1) * 100e-6 + 2 * (8 - 2) * sum(sizes) / 125e6 + 2 * (2 - 1) * sum(sizes) / 125e6
    assert rows["throwaway"].comm_s == pytest.approx(through_root)
    assert rows["throwaway"].comm_s < rows["gather_scatter"].comm_s  # the same bytes, one latency instead of L


def test_the_registry_lists_what_the_cli_offers():
    assert set(parse_labels(None)) == set(every_label())
    with pytest.raises(SystemExit):
        parse_config(["--sync", "throwaway"], quiet=True)  # not registered outside the fixture


def test_a_method_says_what_it_can_be_tuned_on():
    assert tuned_by("bucket_mb") == ["bucketed", "zero"]
    assert tuned_by("period") == ["localsgd", "diloco"] and tuned_by("outer_lr") == ["diloco"]
    with pytest.raises(UserError, match="--outer-lr is read by --sync diloco only"):
        parse_config(["--sync", "localsgd", "--outer-lr", "0.5"]).validate(world_size=2)
