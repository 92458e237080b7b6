"""Experiment files: good files become the planned runs; each mistake is named by file, line and key."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

from mpi_train.errors import UserError
from mpi_train.lab.experiment import main
from mpi_train.lab.experiment_file import SweepError, load, parse
from mpi_train.lab.sweep_plan import bench_command, train_flags
from mpi_train.sync import SYNC_METHODS, backend_error

HERE = "nccl" if torch.cuda.is_available() else "gloo"  # what backend "auto" becomes where the sweep is read
RUNNABLE_HERE = [name for name in SYNC_METHODS if not backend_error(name, HERE)]

GOOD = """\
[experiment]
name = "grid"
tracking = false

[train]
dataset = "synthetic"
batch_size = 64
lr = 1                       # an integer where a float is expected is fine

[[sweep]]
sync = ["allreduce", "gather_scatter"]
np = [1, 2]
seed = [7, 8]

[[sweep]]
sync = "all"
np = 4
max_steps = 5
env = { MY_VAR = "x" }
"""


def test_a_good_file_becomes_the_grid_of_runs_in_file_order():
    sweep = parse(GOOD, Path("grid.toml"))
    first = [(r.config.sync, r.np, r.config.seed) for r in sweep.runs[:8]]
    assert first == [(s, n, seed) for s in ("allreduce", "gather_scatter") for n in (1, 2) for seed in (7, 8)]
    rest = sweep.runs[8:]
    assert [r.config.sync for r in rest] == RUNNABLE_HERE  # "all" follows the registry...
    # ...and says what it left out
    assert [name for name, _ in sweep.unavailable] == [n for n in SYNC_METHODS if n not in RUNNABLE_HERE]
    assert all(r.np == 4 and r.config.max_steps == 5 and r.env == {"MY_VAR": "x"} for r in rest)
    assert all(r.config.batch_size == 64 and r.config.lr == 1.0 and isinstance(r.config.lr, float) for r in sweep.runs)
    assert sweep.runs[0].config.max_steps is None  # a grid's options stay in that grid
    assert [r.index for r in sweep.runs] == list(range(1, len(sweep.runs) + 1))
    assert sweep.tracking is False and sweep.hostfile == "hostfile" and sweep.bench is None
    assert str(sweep.out) == "results/grid"


def test_compression_is_swept_like_sync_and_impossible_pairs_are_left_out_of_all_or_refused():
    text = (GOOD.split("[[sweep]]")[0]
            + '[[sweep]]\nsync = "all"\ncompression = ["none", "powersgd"]\nnp = 2\npowersgd_rank = 4\n')
    sweep = parse(text, Path("grid.toml"))
    labels = [r.name.split("-np")[0] for r in sweep.runs]
    assert "bucketed+powersgd" in labels and "hierarchical+powersgd" in labels and "flat_fp16" in labels
    assert "gather_scatter+powersgd" not in labels and "ddp+powersgd" not in labels and labels.count("flat_fp16") == 1
    assert dict(sweep.unavailable)["gather_scatter+powersgd"].startswith("--sync gather_scatter cannot carry")
    # a method's flag in a grid of several methods tunes the runs that read it; the others run without it
    assert {r.config.powersgd_rank for r in sweep.runs if r.config.compression == "powersgd"} == {4}
    assert {r.config.powersgd_rank for r in sweep.runs if r.config.compression == "none"} == {None}
    with pytest.raises(SweepError, match=r"key sweep\[1\]\.powersgd_rank: .* --powersgd-rank is read by --compression "
                                         r"powersgd \(and --sync ddp_powersgd\) only"):  # no run of the grid reads it
        parse(text.replace('sync = "all"', 'sync = ["ring", "bucketed"]').replace('"powersgd"]', '"fp16"]'),
              Path("grid.toml"))
    assert {r.config.compression for r in sweep.runs if r.config.sync == "ring"} == {"none", "powersgd"}
    named = text.replace('sync = "all"', 'sync = ["ring", "gather_scatter"]')
    with pytest.raises(SweepError, match=r"line \d+, key sweep\[1\]\.compression: --sync gather_scatter cannot carry"):
        parse(named, Path("grid.toml"))
    with pytest.raises(SweepError, match=r"key sweep\[1\]\.compression: unknown compression 'fp8'"):
        parse(text.replace('"powersgd"]', '"fp8"]'), Path("grid.toml"))


def test_the_same_run_in_two_grids_is_named_by_what_its_grid_changes_and_the_very_same_run_is_refused():
    text = GOOD.split("[[sweep]]")[0] + ('[[sweep]]\nsync = "ring"\nnp = 2\n\n'
                                        '[[sweep]]\nsync = "ring"\nnp = 2\nmodel = "mnist_cnn"\n'
                                        '\n[[sweep]]\nsync = "ring"\nnp = 2\nmodel = "mnist_cnn"\nenv = {A = "1"}\n')
    names = [r.name for r in parse(text, Path("grid.toml")).runs]
    assert names == ["ring-np2-seed42", "ring-np2-seed42-mnist_cnn", "ring-np2-seed42-run3"]
    # once run twice under two names
    with pytest.raises(SweepError, match=r"key sweep\[4\]: gives the run ring-np2-seed42 a second time \(run 1 of the "
                                         r"sweep\) with the same options"):
        parse(text + '\n[[sweep]]\nsync = "ring"\nnp = 2\n', Path("grid.toml"))
    with pytest.raises(SweepError, match=r"key sweep\[1\]\.seed: lists 1 twice, which would run the same job twice"):
        parse(text.replace('np = 2\n', 'np = 2\nseed = [1, 2, 1]\n', 1), Path("grid.toml"))


def test_the_shipped_files_plan_what_they_promise():
    compare = load(REPO / "experiments/compare_sync.toml")
    assert (compare.runs[0].np, compare.runs[0].config.batch_size) == (1, 256)
    assert [(r.config.sync, r.np) for r in compare.runs[1:]] == [(m, 4) for m in RUNNABLE_HERE]
    assert all(r.config.dataset == "cifar10" and r.config.epochs == 1 and r.config.max_steps is None
               for r in compare.runs)
    assert (compare.bench.np, compare.bench.model, compare.bench.steps >= 20) == (4, "vgg11", True)
    assert {r.np for r in load(REPO / "experiments/scaling.toml").runs} == {1, 2, 4}
    smoke = load(REPO / "experiments/smoke.toml")
    assert smoke.runs and all(r.config.dataset == "synthetic" and r.config.max_steps <= 10 for r in smoke.runs)


def test_an_experiment_file_in_another_encoding_is_one_paragraph_and_a_byte_order_mark_is_read(tmp_path):
    (tmp_path / "latin1.toml").write_bytes(b'[experiment]\nname = "caf\xe9"\n')
    with pytest.raises(UserError, match=r"^cannot read the experiment file \S+latin1\.toml: it is not UTF-8 text\."):
        load(tmp_path / "latin1.toml")
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load(tmp_path / "bom.toml").runs == parse(GOOD, Path("grid.toml")).runs


def test_the_report_s_target_accuracy_is_read_from_the_file():
    assert parse(GOOD, Path("grid.toml")).target_accuracy is None  # the best final accuracy minus 2 points
    text = GOOD.replace('name = "grid"', 'name = "grid"\ntarget_accuracy = 0.6')
    assert parse(text, Path("grid.toml")).target_accuracy == 0.6


def test_a_language_model_s_report_races_to_a_validation_loss():
    text = GOOD.replace('name = "grid"', 'name = "grid"\ntarget_loss = 2')
    sweep = parse(text, Path("grid.toml"))
    assert sweep.target_loss == 2.0 and sweep.target_accuracy is None


def test_a_sweep_over_models_plans_one_run_per_model_named_by_it():
    text = GOOD.replace('seed = [7, 8]', 'seed = [7, 8]\nmodel = ["mnist_cnn", "resnet18"]')
    runs = parse(text, Path("grid.toml")).runs
    first = runs[:2 * 2 * 2 * 2]  # sync x np x seed x model; the second grid (sync = "all") runs the default model
    assert {run.config.model_name for run in first} == {"mnist_cnn", "resnet18"}
    assert {run.config.model_name for run in runs[len(first):]} == {"mnist_cnn"}  # synthetic's default
    assert "allreduce-np1-seed7-resnet18" in {run.name for run in first}
    assert first[-1].config.model_name == "resnet18" and first[-1].config.input_shape == (3, 32, 32)
    flags = train_flags(first[-1].config)
    assert flags[flags.index("--model") + 1] == "resnet18"
    # a single model in the grid, or in [train], names no run
    one = parse(GOOD.replace('seed = [7, 8]', 'seed = [7, 8]\nmodel = "resnet18"'), Path("grid.toml")).runs
    assert one[0].name == "allreduce-np1-seed7" and one[0].config.model_name == "resnet18"
    bench = parse(GOOD + '\n[bench]\nmodel = "gpt"\ngpt_size = "small"\n', Path("grid.toml")).bench
    assert (bench.model, bench.gpt_size) == ("gpt", "small")
    command = bench_command(parse(GOOD, Path("grid.toml")), bench, None, Path("b.json"))
    assert command[command.index("--model") + 1] == "gpt" and command[command.index("--gpt-size") + 1] == "small"


BAD = [  # (file text, key named in the error, line, words the message must hold)
    ('[experiment]\nname = "x\n', "(syntax)", 2, "not valid TOML"),
    ('[experiment]\nname = "x"\n[trian]\nbatch_size = 1\n', "trian", 3, "unknown key"),
    ('[experiment]\nname = "x"\n[train]\nlr = 0.1\nbatchsize = 256\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "train.batchsize", 5, "Did you mean 'batch_size'"),
    ('[experiment]\nname = "x"\n[train]\nbatch_size = "256"\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "train.batch_size", 4, "must be an integer"),
    ('[experiment]\nname = "x"\n[train]\nmax_steps = true\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "train.max_steps", 4, "a boolean"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = 2\n\n[[sweep]]\nnp = 4\nsync = ["ddp", "alreduce"]\n',
     "sweep[2].sync", 9, "unknown sync method 'alreduce'"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = [2, "4"]\n', "sweep[1].np", 5, "a string ('4')"),
    ('[experiment]\ndescription = "no name"\n[[sweep]]\nsync = "ddp"\nnp = 2\n', "experiment.name", 1, "is required"),
    ('[experiment]\nname = "x"\n[train]\nbatch_size = 250\n[[sweep]]\nsync = "ddp"\nnp = [2, 4]\n',
     "sweep[1].np", 7, "at np 4"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = 2\nenv = { A = 1 }\n',
     "sweep[1].env.A", 6, "must be a string"),
    ('[experiment]\nname = "x"\n[train]\nseed = 3\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "train.seed", 4, "set by the sweep"),
    ('[experiment]\nname = "x"\n[train]\ndataset = "imagenet"\n', "train.dataset", 4, "not one of"),
    ('[experiment]\nname = "x"\n[train]\noptimizer = "lamb"\n', "train.optimizer", 4, "not one of"),
    ('[experiment]\nname = "x"\n[train]\nepochs = 1\n', "sweep", None, "at least one [[sweep]]"),
    ('[experiment]\nname = "x"\ntarget_accuracy = 60\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "experiment.target_accuracy", 3, "a fraction in (0, 1], e.g. 0.6"),
    ('[experiment]\nname = "x"\ntarget_accuracy = 0.6\ntarget_loss = 2.0\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "experiment.target_loss", 4, "races to one target, and target_accuracy = 0.6 is set too"),
    ('[experiment]\nname = "x"\ntarget_loss = -1\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "experiment.target_loss", 3, "a positive validation loss"),
    ('[experiment]\nname = "x"\ntarget_loss = inf\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "experiment.target_loss", 3, "a positive validation loss"),
    ('[experiment]\nname = "x"\n[launch]\ntimeout = nan\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "launch.timeout", 4, "is how many seconds one run may take before it is stopped, a number above 0"),
    ('[experiment]\nname = "x"\n[launch]\ntimeout = -5\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "launch.timeout", 4, "got -5"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = 2\nmodel = ["vgg11", "resnet19"]\n',
     "sweep[1].model", 6, "model resnet19 is not a model this tool knows"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = 2\nmodel = [1]\n',
     "sweep[1].model", 6, "a model name or a list of them"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = 2\n[bench]\nmodel = "vgg12"\n',
     "bench.model", 7, "model vgg12 is not a model this tool knows"),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nnp = 2\n[bench]\ngpt_size = "small"\n',
     "bench.gpt_size", 7, "is gpt's size, one of tiny, small, medium, with model = \"gpt\""),
    ('[experiment]\nname = "x"\n[[sweep]]\nsync = "ddp"\nperiod = 4\nnp = 2\n',
     "sweep[1].period", 5, "the run ddp at np 2 cannot start: --period is read by --sync localsgd and diloco only"),
    ('[experiment]\nname = "x"\n[train]\noverlap = true\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "train.overlap", 4, "the run ddp at np 2 cannot start: --overlap is read by --sync localsgd and diloco only"),
    ('[experiment]\nname = "x"\n[launch]\nmpirun_args = "--oversubscribe"\n[[sweep]]\nsync = "ddp"\nnp = 2\n',
     "launch.mpirun_args", 4, "a list of strings"),
]


@pytest.mark.parametrize("text, key, line, words", BAD, ids=[case[1] for case in BAD])
def test_each_mistake_names_its_key_and_line(text, key, line, words):
    with pytest.raises(SweepError) as caught:
        parse(text, Path("bad.toml"))
    message = str(caught.value)
    assert caught.value.key == key and caught.value.line == line
    assert message.startswith(f"bad.toml, line {line}, key {key}:" if line else f"bad.toml, key {key}:")
    assert words in message and message.endswith("Nothing was launched.")


def test_the_cli_rejects_a_bad_file_with_one_paragraph_and_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    out = tmp_path / "out"
    bad.write_text(f'[experiment]\nname = "x"\nout = "{out}"\n[[sweep]]\nsync = "ddp"\nnp = 2\nbatch_sise = 8\n')
    result = subprocess.run([sys.executable, "-m", "mpi_train", "experiment", str(bad)], capture_output=True, text=True,
                            timeout=120, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=False)
    assert result.returncode == 2
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.startswith("mpi_train experiment: error:") and "\n\n" not in result.stderr.strip()
    paragraph = " ".join(result.stderr.split())
    assert f"{bad}, line 7, key sweep[1].batch_sise: unknown key" in paragraph and "'batch_size'" in paragraph
    assert not out.exists()  # nothing launched, nothing written


def test_test_hosts_without_the_capabilities_to_make_them_are_refused_before_any_run(tmp_path):
    """Root in a container without CAP_NET_ADMIN and CAP_SYS_ADMIN (dropped here with setpriv): `ip` would refuse the
    test hosts once the runner had started; it is said first, and nothing is made."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("root's capabilities are dropped with setpriv (util-linux): this is not root, or it is missing")
    grid, out = tmp_path / "hosts.toml", tmp_path / "out"
    grid.write_text(f'[experiment]\nname = "x"\nout = "{out}"\ntracking = false\n[[sweep]]\nsync = "ddp"\nnp = 4\n'
                    f'[network]\nhosts = [2]\nlink = ["100mbit"]\n')
    result = subprocess.run(["setpriv", "--bounding-set=-net_admin,-sys_admin", sys.executable, "-m", "mpi_train",
                             "experiment", str(grid), "--hostfile", ""], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    paragraph = " ".join(result.stderr.split())
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert "lacks CAP_NET_ADMIN and CAP_SYS_ADMIN" in paragraph and "--cap-add NET_ADMIN" in paragraph
    assert not out.exists()


def test_dry_run_lists_every_planned_command(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text(GOOD)
    assert main([str(path), "--dry-run", "--hostfile", ""]) == 0
    printed = capsys.readouterr().out
    runs = parse(GOOD, path).runs
    assert f"{len(runs)} run(s)" in printed and f"[{len(runs)}/{len(runs)}]" in printed
    assert printed.count("-m mpi_train --sync") == len(runs) and "--hostfile" not in printed
    assert "MY_VAR=x mpirun -np 4" in printed and "--no-tracking" in printed
    assert not (tmp_path / "results").exists()
    (tmp_path / "notes.txt").write_text("a file\n")  # once listed as fine, and refused only by the real run
    assert main([str(path), "--dry-run", "--hostfile", "", "--out", str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt is a file, not a folder" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("change, hostfile, words", [
    ("save_model = true\n", "", ("save_model = true keeps each trained model in its MLflow run, and this experiment "
                                "tracks nothing")),
    ("", "localhost slots=2\n", "ask for more ranks than the hostfile hosts offers (2 slot(s)), the first "),
    ("", "# mine\nlocalhost slots=two\n", "line 2 of hosts, 'localhost slots=two': slots= takes a whole number"),
    ("", "folder", "the hostfile 'hosts' (--hostfile, or [launch] hostfile in"),  # once a pass, then a failed run
])
def test_runs_that_would_fail_as_they_start_are_refused_before_the_dry_run_lists_them(tmp_path, capsys, change,
                                                                                       hostfile, words):
    path = tmp_path / "grid.toml"
    path.write_text(GOOD.replace("max_steps = 5\n", f"max_steps = 5\n{change}"))
    hosts = tmp_path / "hosts"
    hosts.mkdir() if hostfile == "folder" else hosts.write_text(hostfile)
    assert main([str(path), "--dry-run", "--hostfile", str(hosts) if hostfile else ""]) == 2
    out, err = capsys.readouterr()
    said = " ".join(err.split())  # as one line: where the paragraph wraps depends on the length of tmp_path
    assert not out and words in said.replace(str(hosts), "hosts") and "Nothing was launched." in said


def test_a_second_runner_on_the_same_output_folder_is_refused_while_the_first_runs(tmp_path, capsys):
    """Two runners on one --out once both ended "2 of 2 run(s) succeeded", each report holding the other's figures."""
    path, out = tmp_path / "grid.toml", tmp_path / "out"
    path.write_text(GOOD)
    hold = ("import sys, time; from pathlib import Path; from mpi_train.files import claim_folder; "
            "claim_folder(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([str(path), "--out", str(out), "--hostfile", "", "--no-tracking"]) == 2
    finally:
        holder.kill()
        holder.wait()
    out_text, err = capsys.readouterr()
    said = " ".join(err.split())
    assert f"the output folder {out} (--out, or out in {path}) is in use by another experiment runner (process " \
           f"{holder.pid} on host" in said and "Nothing was launched." in said and "[1/" not in out_text, said
    assert sorted(entry.name for entry in out.iterdir()) == [".mpi_train.lock"]  # no log, summary or report


def test_the_default_output_folder_neither_nests_nor_climbs_out_of_results(tmp_path):
    """An experiment named "a/../../b" once wrote its output outside results/."""
    path = tmp_path / "grid.toml"
    for name, folder in (("a/../../b", "a_.._.._b"), ("team/run 1", "team_run_1"), ("..", "experiment"),
                         ("compare_sync", "compare_sync")):
        path.write_text(GOOD.replace('name = "grid"', f'name = "{name}"'))
        assert load(path).out == Path("results") / folder


def test_a_job_file_given_as_an_experiment_is_told_to_run_with_config():
    # once "unknown key 'dataset' in []"
    with pytest.raises(SweepError, match=r"job\.toml, line 1, key dataset: is a training option at the file's top "
                                         r"level.*this looks like a job file\. Run it with python -m mpi_train "
                                         r"--config job\.toml"):
        parse('dataset = "synthetic"\nbatch_size = 64\n', Path("job.toml"))
