"""The bad-input probe's faults of the commands around training: a calibration or an advice that no bench or advisor
wrote as it is, the cluster check's and the bench's numbers, an experiment's hostfile and link, a plot's name, the GPU
check's data, the supervisor's --min-ranks (bad_input.py runs them with the rest)."""

from __future__ import annotations

import json

from .bad_input_cases import SMALL
from .bad_input_workspace import Case, Workspace

LINK = {"alpha": 1e-4, "beta": 1e-8}
PREDICT = ("predict", "--model", "mnist_cnn", "--methods", "ddp")
EXPERIMENT = '[experiment]\nname = "probe"\ntracking = false\n[train]\ndataset = "synthetic"\nmax_steps = 2\n' \
             '[[sweep]]\nsync = "ddp"\nnp = 2\n'


def advice(created_s) -> dict:
    """An advice's fields as the advisor writes them, for one rank on this host, made at `created_s`."""
    return {"kind": "mpi_train.advice", "version": 1, "created": "then", "created_s": created_s, "hosts": ["h"],
            "world_size": 1, "model": "mnist_cnn", "batch_size": 64, "link": None,
            "calibration": {"network": {"intra": LINK, "inter": LINK}, "measured_at_s": 0.0},
            "recommended": {"label": "ddp", "flags": ["--sync", "ddp"], "why": "", "predicted_step_s": 0.1}}


def advice_as_calibration(ws: Workspace) -> list[list[str]]:
    """An advice given to predict's --calibration: its links read, and it times no step to price compute with."""
    (ws.folder / "advice.json").write_text(json.dumps(advice(1.0e9)))
    return [ws.command(*PREDICT, "--ranks", "4", "--calibration", "advice.json")]


def advice_edited(ws: Workspace) -> list[list[str]]:
    """An advice whose time was edited into words, followed by --sync auto."""
    (ws.folder / "advice.json").write_text(json.dumps(advice("yesterday")))
    return [ws.train(*SMALL, "--sync", "auto", "--advice", "advice.json", np=1)]


def experiment_hostfile(ws: Workspace) -> list[list[str]]:
    (ws.folder / "probe.toml").write_text(EXPERIMENT)
    (ws.folder / "hosts").write_text("localhost slots=two\n")
    return [ws.command("experiment", "probe.toml", "--hostfile", "hosts", "--dry-run")]


def gpu_check_data_file(ws: Workspace) -> list[list[str]]:
    """A tarball's name where the GPU check wants its unpacked folder: said before the check's minutes of work."""
    (ws.folder / "cifar.tar.gz").write_bytes(b"not unpacked")
    return [ws.command("gpu-check", "--backend", "gloo", "--data-dir", "cifar.tar.gz")]


def supervise_min_ranks(ws: Workspace) -> list[list[str]]:
    """--min-ranks above the ranks the launch line starts: no host could ever be left out."""
    (ws.folder / "hosts").write_text("a slots=2\nb slots=2\n")
    return [ws.command("supervise", "--min-ranks", "8", "--", "mpirun", "-np", "4", "--hostfile", "hosts",
                       "python", "-m", "mpi_train", "--checkpoint-dir", "ck")]


def experiment_link(ws: Workspace) -> list[list[str]]:
    """A link rate predict reads and tc does not (scripts/testhosts.sh): refused at its line, not at its run."""
    network = '[network]\nhosts = [2]\nranks_per_host = 1\nlink = ["1.5gbit"]\n'
    (ws.folder / "probe.toml").write_text(EXPERIMENT + network)
    return [ws.command("experiment", "probe.toml", "--dry-run")]


def experiment_seed_twice(ws: Workspace) -> list[list[str]]:
    """A seed listed twice: the same job run twice under two names."""
    (ws.folder / "probe.toml").write_text(EXPERIMENT + "seed = [1, 1]\n")
    return [ws.command("experiment", "probe.toml", "--dry-run")]


CASES = [
    Case("advice-as-calibration", advice_as_calibration, (r"holds no time of the model's step without sync",
                                                          r"--compute-per-sample")),
    Case("advice-edited", advice_edited, (r"advice\.json cannot be used: its created_s 'yesterday' is no time",)),
    Case("collectives-no-iterations", lambda ws: [ws.command("collectives", "--iters", "0")],
         (r"--iters is how many times each collective is timed",)),
    Case("bench-no-threads", lambda ws: [ws.command("bench", "--model", "mnist_cnn", "--batch-size", "16", "--steps",
                                                    "1", "--threads", "0", "--no-tracking")],
         (r"--threads must be positive, got 0",)),
    Case("experiment-slots-in-words", experiment_hostfile, (r"line 1 of hosts, 'localhost slots=two'",)),
    Case("predict-plot-not-png", lambda ws: [ws.command(*PREDICT, "--ranks", "2,4", "--link", "1gbit",
                                                        "--compute-per-sample", "0.001", "--plot", "p.pdf")],
         (r"drawn as a PNG image",)),
    Case("gpu-check-data-dir-file", gpu_check_data_file, (r"--data-dir cifar\.tar\.gz is a file, not a folder",)),
    Case("collectives-larger-than-memory", lambda ws: [ws.command("collectives", "--size-mb", "1000000", "--iters",
                                                                  "1")],
         (r"ran out of memory.{0,300}lower --size-mb",)),
    Case("supervise-min-ranks-above-line", supervise_min_ranks, (r"--min-ranks 8 is the fewest ranks",)),
    Case("experiment-link-not-tc", experiment_link, (r"'1\.5gbit' is not a rate scripts/testhosts\.sh shapes",)),
    Case("predict-link-below-1kbit", lambda ws: [ws.command(*PREDICT, "--ranks", "4", "--link", "0.000001bit",
                                                            "--compute-per-sample", "0.001")],
         (r"'0\.000001bit' is below 1kbit",)),
    # a million blocks: minutes of building in silence before the host ran out
    Case("gpt-beyond-host-memory", lambda ws: [ws.train("--model", "gpt", "--dataset", "synthetic", "--gpt-layers",
                                                        "1000000", "--no-tracking", np=1)],
         (r"has [\d,]+ parameters.{0,200}more than this host's [\d.]+ GiB of memory",)),
    Case("predict-batch-uneven", lambda ws: [ws.command(*PREDICT, "--ranks", "3", "--link", "1gbit",
                                                        "--compute-per-sample", "0.001", "--batch-size", "100")],
         (r"--batch-size 100 is the global batch and does not split evenly across 3 ranks",)),
    Case("experiment-seed-twice", experiment_seed_twice, (r"lists 1 twice, which would run the same job twice",)),
    Case("compare-databricks-unset", lambda ws: [ws.command("compare", "--tracking-uri", "databricks")],
         (r"names Databricks' hosted MLflow, and neither \$DATABRICKS_HOST nor",)),
]
