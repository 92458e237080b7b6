"""python -m mpi_train predict: the table, the winner, the scaling plot, and its refusals."""

import pytest

from mpi_train import netmodel
from mpi_train.analysis import predict
from mpi_train.models import build_model
from mpi_train.netmodel.families import NOT_YET_PRICED
from mpi_train.sync import SYNC_METHODS


def test_one_cluster_prints_each_method_and_the_winner(capsys):
    assert predict.main(["--model", "mnist_cnn", "--batch-size", "256", "--ranks", "64", "--ranks-per-host", "8",
                         "--link", "10gbit", "--compute-per-sample", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "64 ranks on 8 host(s), per-rank batch 4" in out and "between hosts: alpha 100 us, 1,250 MB/s" in out
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in SYNC_METHODS}
    # every method but those whose family the model does not price yet (netmodel/families.py)
    assert set(rows) == {name for name, method in SYNC_METHODS.items() if method.collective not in NOT_YET_PRICED}
    # the ring row by hand: compute 4 ms, one flat buffer over the 10 Gbit/s link
    size = sum(netmodel.tensor_sizes(build_model("mnist_cnn")))
    ring = 2 * 63 * 100e-6 + 2 * 63 / 64 * size / 1.25e9
    assert rows["ring"][0] == pytest.approx(4.0, abs=0.05) and rows["ring"][1] == pytest.approx(1e3 * ring, abs=0.05)
    # float16 halves the bytes; PowerSGD sends its factors, but in two rounds, each paying 2·63 latencies of 100 us
    flat_bandwidth = rows["flat"][1] - 1e3 * 2 * 63 * 100e-6
    assert rows["flat_fp16"][1] == pytest.approx(rows["flat"][1] - flat_bandwidth / 2, abs=0.05)
    # here the MNIST CNN's 4.8 MB are latency-bound: PowerSGD's second round costs more than its bytes save
    assert rows["ddp_powersgd"][1] > rows["ddp"][1] > rows["ddp_powersgd"][1] / 2
    winner = min(rows, key=lambda name: rows[name][3])
    assert f"winner: {winner} " in out


def test_a_scaling_table_writes_a_plot(tmp_path, capsys):
    plot = tmp_path / "scaling.png"
    assert predict.main(["--model", "mnist_cnn", "--ranks", "2,4,8,1024", "--link", "1gbit", "--compute-per-sample",
                         "0.001", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip().split(" ")[0] in ("2", "4", "8", "1024")]
    assert len(lines) == 4 and plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("args, words", [
    (["--ranks", "0"], "--ranks '0' must be a positive"),
    (["--ranks", "4", "--link", "fast"], "--link: link 'fast' is not a rate"),
    (["--ranks", "4"], "--link or --calibration is needed"),
])
def test_bad_input_is_one_paragraph_and_exit_2(args, words, capsys):
    assert predict.main(["--model", "mnist_cnn", "--compute-per-sample", "0.001", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpi_train predict: error:") and words in " ".join(err.split())
