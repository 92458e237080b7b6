"""python -m mpi_train predict: the table, the winner, the scaling plot, and its refusals."""

import json
import re

import pytest
from conftest import filled

from mpi_train import netmodel
from mpi_train.analysis import predict
from mpi_train.models import build_model
from mpi_train.sync import SYNC_METHODS
from mpi_train.sync.base import REPLICATED


def test_one_cluster_prints_each_method_and_the_winner(capsys, tmp_path):
    assert predict.main(["--model", "mnist_cnn", "--batch-size", "256", "--ranks", "64", "--ranks-per-host", "8",
                         "--link", "10gbit", "--compute-per-sample", "0.001", "--plot", str(tmp_path / "p.png")]) == 0
    out, memory = capsys.readouterr().out.split("\nmemory per rank")
    assert memory.rstrip().endswith(f"plot: none written to {tmp_path / 'p.png'}: the plot draws the prediction "
                                    f"against several cluster sizes, and --ranks names one (e.g. --ranks 2,4,8,16)")
    assert not (tmp_path / "p.png").exists()
    assert "64 ranks on 8 host(s), per-rank batch 4" in out and "between hosts: alpha 100 us, 1,250 MB/s" in out
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in SYNC_METHODS}
    # every method: each declares a family the model prices (netmodel/families.py)
    assert set(rows) == set(SYNC_METHODS)
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
    # memory per rank: every method here keeps whole parameters, gradients and momentum buffers (the model's 0.9)
    held = {line.split()[0]: line.split() for line in memory.splitlines()
            if line.split()[:1] and line.split()[0] in SYNC_METHODS}
    assert set(held) == set(SYNC_METHODS) and "momentum 0.9" in memory
    assert [float(x) for x in held["ring"][1:5]] == pytest.approx([size / 2**20] * 3 + [3 * size / 2**20], abs=0.05)
    assert " ".join(held["ring"][5:]) == f"allreduce {1e3 * ring:.1f} ms"
    assert " ".join(held["gather_scatter"][5:]).startswith("gather and scatter ")


def test_memory_per_rank_leaves_out_the_state_sgd_without_momentum_does_not_keep(capsys):
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--link", "1gbit", "--compute-per-sample", "0.001",
                         "--methods", "ddp", "--momentum", "0"]) == 0
    line = capsys.readouterr().out.split("\nmemory per rank")[1].splitlines()[2].split()
    assert line[0] == "ddp" and float(line[3]) == 0.0 and float(line[4]) == pytest.approx(2 * float(line[1]))


def test_memory_per_rank_holds_adamws_two_moments_and_momentum_is_refused_with_it(capsys):
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--link", "1gbit", "--compute-per-sample", "0.001",
                         "--methods", "ddp", "--optimizer", "adamw"]) == 0
    memory = capsys.readouterr().out.split("\nmemory per rank")[1]
    line = memory.splitlines()[2].split()
    assert "adamw state (two moments)" in memory.splitlines()[0]
    assert line[0] == "ddp" and float(line[3]) == pytest.approx(2 * float(line[1]), abs=0.01)  # O = 2G
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--link", "1gbit", "--compute-per-sample", "0.001",
                         "--optimizer", "adamw", "--momentum", "0.9"]) != 0
    assert "--momentum 0.9 is SGD's" in capsys.readouterr().err


def test_a_scaling_table_writes_a_plot(tmp_path, capsys):
    plot = tmp_path / "scaling.png"
    assert predict.main(["--model", "mnist_cnn", "--ranks", "2,4,8,1024", "--batch-size", "1024", "--link", "1gbit",
                         "--compute-per-sample", "0.001", "--plot", str(plot)]) == 0
    out, memory = capsys.readouterr().out.split("\nmemory per rank")
    lines = [line for line in out.splitlines() if line.strip().split(" ")[0] in ("2", "4", "8", "1024")]
    assert len(lines) == 4 and plot.read_bytes().startswith(b"\x89PNG")
    header, *rows = [line.split() for line in memory.splitlines()[1:] if line.strip()][:5]
    columns = {name: [float(row[i]) for row in rows] for i, name in enumerate(header[1:], start=1)}
    assert [row[0] for row in rows] == ["2", "4", "8", "1024"]
    for name, held in columns.items():
        if SYNC_METHODS[name].traits.shards == REPLICATED:  # a whole replica on every count of ranks
            assert len(set(held)) == 1 and held[0] == columns["allreduce"][0], name
        else:  # a sharding method holds less on more ranks, and less than a replica
            assert held == sorted(held, reverse=True) and held[-1] < held[0] < columns["allreduce"][0], name


def test_a_plot_that_cannot_be_written_is_refused_first_or_said_after_the_tables(tmp_path, small_disk, capsys):
    scaling = ["--model", "mnist_cnn", "--ranks", "2,4", "--link", "1gbit", "--compute-per-sample", "0.001"]
    (tmp_path / "notes.txt").write_text("a file")
    assert predict.main([*scaling, "--plot", str(tmp_path / "notes.txt/p.png")]) == 2
    out, err = capsys.readouterr()
    said = " ".join(err.split())
    assert not out and f"--plot {tmp_path}/notes.txt/p.png lies under {tmp_path}/notes.txt, which is a file" in said
    for name, words in (("", "--plot '' names nothing"), (str(tmp_path / "p.pdf"), "the plot is drawn as a PNG image")):
        assert predict.main([*scaling, "--plot", name]) == 2  # once a traceback; a PNG written as p.pdf
        out, err = capsys.readouterr()
        assert not out and words in " ".join(err.split()) and not (tmp_path / "p.pdf").exists(), err
    disk = filled(small_disk)  # the check at the start passes: an empty file still fits
    assert predict.main([*scaling, "--plot", str(disk / "p.png")]) == 2
    out, err = capsys.readouterr()
    assert "\nmemory per rank" in out and sorted(path.name for path in disk.iterdir()) == ["filler"]
    assert (f"the tables above hold the prediction, but the plot {disk}/p.png could not be written (No space left on "
            f"device)") in " ".join(err.split())


@pytest.mark.parametrize("args, words", [
    (["--ranks", "0"], "--ranks '0' must be a positive"),
    (["--ranks", "4", "--link", "fast"], "--link: link 'fast' is not a rate"),
    (["--ranks", "4"], "--link or --calibration is needed"),
    (["--ranks", "4", "--link", "1gbit", "--momentum", "1.5"], "--momentum must be in [0, 1), got 1.5"),
    (["--ranks", "4", "--link", "1gbit", "--period", "0"], "--period must be at least 1 (the steps between two"),
    (["--ranks", "4", "--link", "1gbit", "--methods", "ddp", "--overlap"], "--overlap shape how localsgd and diloco"),
    (["--ranks", "4", "--link", "1gbit", "--methods", "ddp", "--steps-to-accuracy", "ddp=100,ddp=200"],
     "names ddp twice, with 100 and 200 steps"),
    # once a table for a per-rank batch of 33.3333
    (["--ranks", "2,3,6", "--link", "1gbit", "--batch-size", "100"], ("--batch-size 100 is the global batch and does "
     "not split evenly across 3, 6 ranks, as training requires. Use a multiple of 3 (e.g. 99 or 102)")),
    (["--ranks", "4", "--link", "1gbit", "--per-rank-batch", "33.3"], "--per-rank-batch 33.3 is not a whole number"),
])
def test_bad_input_is_one_paragraph_and_exit_2(args, words, capsys):
    assert predict.main(["--model", "mnist_cnn", "--compute-per-sample", "0.001", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpi_train predict: error:") and words in " ".join(err.split())


def test_a_calibration_that_is_no_bench_s_json_is_named_as_such(tmp_path, capsys):
    data = tmp_path / "train.json"
    data.write_text('[{"text": "hello", "label": 1}]')
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--calibration", str(data)]) == 2
    assert (f"the calibration file {data} is not a bench's JSON (it holds no \"calibration\" with fitted links)"
            in " ".join(capsys.readouterr().err.split()))


def test_any_model_is_predicted_from_its_own_tensors_built_on_the_meta_device(capsys):
    # resnet18 and gpt, as training names them: each gradient's bytes are the model's own parameters
    for argv, model in ((["--model", "resnet18"], build_model("resnet18")),
                        (["--model", "gpt", "--gpt-size", "tiny"], None)):
        assert predict.main([*argv, "--ranks", "4", "--ranks-per-host", "2", "--link", "100mbit",
                             "--compute-per-sample", "0.01", "--methods", "allreduce,ddp"]) == 0
        out = capsys.readouterr().out
        if model is None:
            from mpi_train.config import TrainConfig

            model = TrainConfig(model="gpt", dataset="text").make_model()
        sizes = netmodel.tensor_sizes(model)
        assert out.startswith(f"{argv[1]}") and f"{len(sizes)} gradient tensors, {sum(sizes) / 1e6:.1f} MB" in out
    assert "gpt (4 layers, 4 heads, width 128, context 128)" in out
    assert predict.main(["--model", "resnet19", "--ranks", "4", "--link", "1gbit"]) == 2
    assert "--model resnet19 is not a model this tool knows" in " ".join(capsys.readouterr().err.split())


def test_timed_here_the_model_says_when_each_gradient_is_ready():
    from mpi_train.config import TrainConfig

    workload = TrainConfig(model="gpt", dataset="text", gpt_layers=2, gpt_width=32, gpt_heads=2, context=16)
    per_sample, backward = predict.measured_compute(workload, batch=4, iters=2)
    tensors = [p for p in predict.meta_model(workload).parameters() if p.requires_grad]
    assert per_sample > 0 and 0 < backward.share < 1 and len(backward.ready) == len(tensors)
    assert all(0 <= share <= 1 for share in backward.ready) and sorted(backward.order) == list(range(len(tensors)))
    # backward runs from the output to the input: the last block's gradients come before the first block's
    names = [name for name, p in workload.make_model().named_parameters() if p.requires_grad]
    first, last = names.index("blocks.0.mlp.0.weight"), names.index("blocks.1.mlp.0.weight")
    assert backward.ready[last] < backward.ready[first]


def test_a_calibration_prices_the_sharded_collectives_as_the_backend_ran_them(tmp_path, capsys):
    # fitted on 4 ranks over 2 hosts at 100 Mbit/s (12.5 MB/s): a reduce-scatter at 3 ms a ring step and 2x a
    # ring's bytes, an all-gather at 1.5 ms and 1x
    link = netmodel.Link(100e-6, 1 / 12.5e6, source="ping-pong")  # the nominal link's latency: bucketed alike
    fits = {"reduce_scatter": {"alpha": 9e-3, "beta": 2 * 0.75 / 12.5e6},
            "all_gather": {"alpha": 4.5e-3, "beta": 0.75 / 12.5e6}}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"world_size": 4, "layout": {"hosts": 2, "ranks_per_host": 2}, "model": "mnist_cnn",
                                 "calibration": {"network": netmodel.Network(link, link).as_dict(), **fits}}))
    flags = ["--model", "mnist_cnn", "--ranks", "4", "--ranks-per-host", "2", "--link", "100mbit",
             "--compute-per-sample", "0.001", "--methods", "zero,fsdp,bucketed"]

    def communication(extra: list[str]) -> tuple[str, dict]:
        assert predict.main([*flags, *extra]) == 0
        out = capsys.readouterr().out
        return out, {line.split()[0]: float(line.split()[2]) for line in out.split("\nmemory per rank")[0].splitlines()
                     if line.split()[:1] and line.split()[0] in ("zero", "fsdp", "bucketed")}

    nominal_out, nominal = communication([])
    assert "priced at a ring's bytes and the link's latency" in nominal_out
    measured_out, measured = communication(["--calibration", str(bench)])
    assert "reduce_scatter as measured: 3.00 ms per ring step, 2.00x a ring's bytes" in measured_out
    assert "all_gather as measured: 1.50 ms per ring step, 1.00x a ring's bytes" in measured_out
    # zero by hand: each of its 2 buckets (DDP's rule: a 1 MB first one, then the rest of the 4.8 MB) pays 3 ring
    # steps of each collective's latency, and S its 3/4 at 2x (reduce-scatter) and 1x (all-gather) the link's beta
    size = sum(netmodel.tensor_sizes(build_model("mnist_cnn")))
    buckets = 2
    zero = buckets * 3 * (3e-3 + 1.5e-3) + (2 + 1) * 0.75 * size / 12.5e6
    assert measured["zero"] == pytest.approx(1e3 * zero, abs=0.05)
    assert measured["bucketed"] == nominal["bucketed"] and measured["fsdp"] > nominal["fsdp"]
    # FSDP2 overlaps only on CUDA streams: on CPU its step pays all of its communication, which predict says
    assert f"fsdp: exposed assumes CUDA; on CPU the step pays its comm, {measured['fsdp']:.1f} ms" in measured_out
    assert "zero: exposed assumes CUDA" not in measured_out


def test_the_compute_of_a_bench_is_taken_in_its_precision_and_another_precision_is_refused(tmp_path, capsys):
    link = netmodel.Link(100e-6, 1 / 12.5e6, source="ping-pong")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"world_size": 2, "batch_size": 64, "model": "mnist_cnn", "precision": "bf16-mixed",
                                 "calibration": {"network": netmodel.Network(link, link).as_dict()},
                                 "methods": [{"method": "no-sync", "compute_s": 0.064}]}))
    flags = ["--model", "mnist_cnn", "--ranks", "4", "--link", "1gbit", "--calibration", str(bench), "--methods", "ddp"]
    for precision in ([], ["--precision", "bf16-mixed"]):  # auto takes the bench's; the bench's own is taken alike
        assert predict.main([*flags, *precision]) == 0
        assert f"compute 2.00 ms per sample (in bf16-mixed, the no-sync baseline of {bench})" in capsys.readouterr().out
    assert predict.main([*flags, "--precision", "32-true"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"--calibration {bench} timed the model's forward and backward in bf16-mixed, and this prediction is for "
            f"--precision 32-true" in err and "python -m mpi_train bench --precision 32-true --json PATH" in err)
    assert predict.main([*flags, "--precision", "32-true", "--compute-per-sample", "0.001"]) == 0  # its own compute
    assert "compute 1.00 ms per sample (--compute-per-sample, 32-true)" in capsys.readouterr().out
    # fsdp's all-gathers carry the parameters in the bench's bfloat16, half 32-true's bytes
    gathers = {}
    for precision in (["--compute-per-sample", "0.002", "--precision", "32-true"], []):
        assert predict.main([*flags[:-1], "fsdp", *precision]) == 0
        out = capsys.readouterr().out
        gathers[len(precision)] = float(re.search(r"all-gather \(forward\) ([\d.]+) ms", out).group(1))
        assert re.search(r"reduce-scatter ([\d.]+) ms", out)
    assert 0.45 < gathers[0] / gathers[4] < 0.55  # half the bytes; the latencies alike
    older = tmp_path / "older.json"  # a bench JSON that names no precision timed float32
    older.write_text(bench.read_text().replace('"precision": "bf16-mixed", ', ""))
    assert predict.main([*flags[:-4], "--calibration", str(older), "--methods", "ddp", "--precision", "16-mixed"]) == 2
    assert "timed the model's forward and backward in 32-true" in " ".join(capsys.readouterr().err.split())


def test_timed_here_the_model_runs_in_the_precision_asked(capsys):
    tiny = ["--model", "gpt", "--gpt-layers", "1", "--gpt-width", "32", "--gpt-heads", "2", "--context", "16"]
    assert predict.main([*tiny, "--ranks", "4", "--link", "1gbit", "--methods", "ddp",
                         "--precision", "bf16-mixed"]) == 0
    assert "per sample (in bf16-mixed, timed here (batch 16, one process" in capsys.readouterr().out


@pytest.mark.parametrize("flag,value", [("--compute-per-sample", "inf"), ("--compute-per-sample", "nan"),
                                        ("--compute-per-sample", "1e300"), ("--bucket-mb", "0"),
                                        ("--per-rank-batch", "-2")])
def test_a_number_no_prediction_can_use_is_refused_in_one_line(flag, value, capsys):
    """1e300 seconds a sample once printed step times of inf and nan, and named a winner among them."""
    assert predict.main(["--ranks", "4", "--link", "1gbit", flag, value]) == 2
    said = capsys.readouterr().err.strip()
    assert said == f"mpi_train predict: error: {flag} must be a positive number up to 1e+09, got {float(value)}."


@pytest.mark.parametrize("edit, said", [
    (lambda bench: bench.pop("methods"), "holds no time of the model's step without sync"),  # an advice's form
    (lambda bench: bench["methods"][0].update(compute_s=-0.02), "holds no time of the model's step without sync"),
    (lambda bench: bench.update(batch_size=0), "holds no time of the model's step without sync"),
    (lambda bench: bench["calibration"]["network"]["inter"].update(beta=-1e-9), "inter-host link has alpha"),
    (lambda bench: bench["calibration"]["network"]["intra"].update(beta="fast"), "intra-host link has alpha"),
    (lambda bench: bench.update(precision="fp8"), "in precision 'fp8', which is none of 32-true"),
])
def test_a_calibration_edited_by_hand_or_of_another_kind_is_named_not_a_traceback(tmp_path, capsys, edit, said):
    """Each of these once ended in a traceback (KeyError, StopIteration, ZeroDivisionError, TypeError), or priced
    negative step times with exit 0."""
    link = netmodel.Link(100e-6, 1 / 12.5e6, source="ping-pong")
    bench = {"world_size": 2, "batch_size": 64, "model": "mnist_cnn", "precision": "32-true",
             "calibration": {"network": netmodel.Network(link, link).as_dict()},
             "methods": [{"method": "no-sync", "compute_s": 0.064}]}
    edit(bench)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--calibration", str(path), "--methods", "ddp"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and "Traceback" not in err, err
