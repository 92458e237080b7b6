"""The faults of `python -m mpi_train soak --bad-input` (bad_input.py runs and judges them): each a fresh folder, as a
user would start from an empty one, set up with its fault, and the commands that meet it.

An np 2 job (`mpirun --bind-to none -np 2 --hostfile hostfile python -m mpi_train ...`, the hostfile
`localhost slots=2`) or the real command (replay, experiment), once its fault is set up: a
checkpoint of another optimizer, a full disk (a 22 MB tmpfs: as root), a corrupt image, a
flag naming a folder for a file or a file for a folder, a cut spool, a damaged MLflow store,
a loss that becomes non-finite, a model or an image folder with nothing to learn, a user's
data set with a label out of range or that differs from rank to rank, and smaller ones (CASES).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from ..errors import UserError
from ..files import CLAIM_FILE
from ..tracking.spool import OFFLINE_ID_TAG, OFFLINE_PREFIX, Spool, batch_record
from .bad_input_judge import Run, launch, message, paragraph
from .bad_input_workspace import CLASSES, RESUMABLE, Case, NotRunnable, Workspace, fill
from .mpirun import launched
from .soakparts import Server

# the smallest job: a few steps of a small model on generated images, each collective bounded; a later flag
# overrides an earlier one, so a case adds what it changes
TRACKED = ("--dataset", "synthetic", "--synthetic-size", "512", "--model", "mnist_cnn", "--batch-size", "64",
           "--log-every", "1", "--timeout", "30")
SMALL = (*TRACKED, "--no-tracking")
MEASURED = ("--model", "mnist_cnn", "--batch-size", "64", "--steps", "1", "--warmup", "0", "--link-iters", "1",
            "--timeout", "30", "--no-tracking")  # the bench's and the advisor's least
IMAGES = ("--dataset", "cifar10", "--data-dir", "cifar", "--model", "vgg11", "--batch-size", "16", "--log-every",
          "1", "--timeout", "30", "--no-tracking")


# ---------------------------------------------------------------------------------------------
# The cases: each sets its fault up in its folder and returns the commands that meet it.

def resume_other_optimizer(first: str, then: str) -> Callable[[Workspace], list[list[str]]]:
    def prepare(ws: Workspace) -> list[list[str]]:
        ws.checkpoints(first)
        return [ws.train(*RESUMABLE, "--max-steps", "5", "--resume", "auto", "--optimizer", then)]
    return prepare


def full_disk_checkpoint(ws: Workspace) -> list[list[str]]:
    disk = ws.disk()  # mnist_cnn's checkpoint takes 9.6 MB: the third does not fit
    return [ws.train(*SMALL, "--max-steps", "5", "--checkpoint-dir", str(disk.relative_to(ws.folder) / "ck"),
                     "--checkpoint-every", "1")]


def full_disk_cache(ws: Workspace) -> list[list[str]]:
    disk = ws.disk()
    ws.image_folder(disk / "cifar", 30, 10)  # decoded: 900 KB for training, 300 KB for testing
    fill(disk, 200 * 1024)
    return [ws.train(*IMAGES, "--data-dir", "disk/cifar", "--max-steps", "2")]


def full_disk_store(ws: Workspace) -> list[list[str]]:
    """The job's MLflow store on a disk that fills as it logs: a new store takes 936 KB, and each logged step more."""
    disk = ws.disk()
    fill(disk, 1100 * 1024)
    return [ws.train(*TRACKED, "--tracking-uri", "sqlite:///disk/mlflow.db", "--epochs", "100", "--max-steps", "300")]


def store_full_at_start(ws: Workspace) -> list[list[str]]:
    """The store was made (its experiment too) before its disk filled: the job finds it, and cannot add its runs."""
    from ..tracking.store import mlflow_client  # here, not at the top: the other cases need no MLflow

    disk = ws.disk()
    mlflow_client(f"sqlite:///{disk}/mlflow.db").create_experiment("mpi_train")
    fill(disk, 0)
    return [ws.train(*TRACKED, "--tracking-uri", "sqlite:///disk/mlflow.db", "--max-steps", "2")]


def full_disk_results(command: str, *flags: str) -> Callable[[Workspace], list[list[str]]]:
    """The bench's or the advisor's files on a disk that filled: the check at the start passes (an empty file still
    fits), the end cannot keep them."""
    def prepare(ws: Workspace) -> list[list[str]]:
        fill(ws.disk(), 0)
        return [ws.train(command, *MEASURED, *flags)]
    return prepare


def bench_json_under_file(ws: Workspace) -> list[list[str]]:
    (ws.folder / "notes.txt").write_text("a file\n")
    return [ws.train("bench", *MEASURED, "--json", "notes.txt/bench.json")]


def corrupt_image(loader: str | None) -> Callable[[Workspace], list[list[str]]]:
    def prepare(ws: Workspace) -> list[list[str]]:
        ws.image_folder(ws.folder / "cifar", 8, 2)
        ws.garbage(ws.folder / "cifar/train/cat/0003.jpg", 2048)
        return [ws.train(*IMAGES, "--max-steps", "5", *(["--loader", loader] if loader else []))]
    return prepare


def summary_json_folder(ws: Workspace) -> list[list[str]]:
    (ws.folder / "results").mkdir()
    return [ws.train(*SMALL, "--max-steps", "2", "--summary-json", "results")]


def timeline_dir_file(ws: Workspace) -> list[list[str]]:
    (ws.folder / "traces").write_text("not a folder\n")
    return [ws.train(*SMALL, "--max-steps", "2", "--timeline", "--timeline-dir", "traces")]


SPOOL_NAME = "job-20260101-120000-1.jsonl"  # as a job names its spool; pid 1 is never a job's


def cut_spool(ws: Workspace) -> list[list[str]]:
    """A job's spool, written as the job writes it, its last record cut halfway (a job killed while writing), and an
    MLflow server that answers (outside the case's folder: it is not the case's leftover)."""
    server = started_server(ws)
    spool, run_id, now = Spool(ws.folder / "mlruns" / "spool" / SPOOL_NAME), OFFLINE_PREFIX + "0" * 32, 1767268800000
    spool.add({"kind": "create_run", "local_id": run_id, "experiment": "bad-input", "run_name": "cut-spool",
               "tags": {OFFLINE_ID_TAG: run_id}, "start_time": now}, server.uri)
    for step in range(1, 4):
        loss = SimpleNamespace(key="loss", value=2.3 - 0.1 * step, timestamp=now + step, step=step)
        spool.add(batch_record(run_id, [loss]), server.uri)
    spool.add({"kind": "set_terminated", "run_id": run_id, "status": "FINISHED", "end_time": now + 9}, server.uri)
    data = spool.path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    ws.kept = data[:last + (len(data) - last) // 2]
    spool.path.write_bytes(ws.kept)
    return [ws.command("replay", "mlruns/spool")]


def started_server(ws: Workspace) -> Server:
    """An MLflow server that answers, outside the case's folder (it is not the case's leftover), stopped at its end."""
    server = Server("127.0.0.1", ws.aside / "server")
    ws.stack.callback(server.stop)
    try:
        server.start()
    except UserError as error:
        raise NotRunnable(f"the MLflow server did not start: {str(error)[:100]}") from None
    return server


def server_hangs_mid_job(ws: Workspace) -> list[list[str]]:
    """A tracking server that hangs (stopped: it takes connections and answers none) once the job's first figures
    reached it. The end's writes wait out their timeouts, longer than --timeout: the other ranks must not wait."""
    from ..tracking.store import mlflow_client  # here, not at the top: the other cases need no MLflow

    server = started_server(ws)
    ws.stack.callback(lambda: os.killpg(server.process.pid, signal.SIGCONT))  # before the server is stopped

    def hang_once_logged() -> None:
        client, deadline = mlflow_client(server.uri), time.monotonic() + 120
        while time.monotonic() < deadline:
            found = client.get_experiment_by_name("mpi_train")
            runs = client.search_runs([found.experiment_id]) if found else []
            if any("learning/loss" in run.data.metrics for run in runs):
                os.killpg(server.process.pid, signal.SIGSTOP)
                return
            time.sleep(0.5)

    threading.Thread(target=hang_once_logged, daemon=True).start()
    return [ws.train(*TRACKED, "--tracking-uri", server.uri, "--max-steps", "150", "--epochs", "100", "--timeout",
                     "10")]


def spool_kept(ws: Workspace, runs: list[Run]) -> list[str]:
    """The cut record cannot be sent: the spool that holds it must stay (under any name) for the user to see."""
    spools = [path for path in (ws.folder / "mlruns" / "spool").glob(f"{SPOOL_NAME}*") if path.is_file()]
    return [] if any(ws.kept in path.read_bytes() for path in spools) else ["SPOOL DELETED"]


def damaged_store(ws: Workspace) -> list[list[str]]:
    ws.garbage(ws.folder / "mlruns" / "mlflow.db", 64 * 1024)
    return [ws.train(*TRACKED, "--max-steps", "2")]  # tracking on, to the default store


def store_kept(ws: Workspace, runs: list[Run]) -> list[str]:
    """The damaged store is the user's: nothing may replace or delete it."""
    store = ws.folder / "mlruns" / "mlflow.db"
    intact = store.is_file() and hashlib.sha256(store.read_bytes()).digest() == ws.damaged[store]
    return [] if intact else ["STORE CHANGED"]


def lr(value: str, steps: str) -> Callable[[Workspace], list[list[str]]]:
    return lambda ws: [ws.train(*SMALL, "--max-steps", steps, "--lr", value)]


def reshard_np3(ws: Workspace) -> list[list[str]]:
    ws.checkpoints("sgd")
    return [ws.train(*RESUMABLE, "--max-steps", "5", "--resume", "auto", "--reshard", np=3)]


def binary_as_text(ws: Workspace) -> list[list[str]]:
    ws.garbage(ws.folder / "blob.bin", 64 * 1024)
    return [ws.train("--dataset", "text", "--data-dir", "blob.bin", "--model", "gpt", "--context", "32",
                     "--batch-size", "8", "--max-steps", "1", "--timeout", "30", "--no-tracking")]


def data_dir_file(ws: Workspace) -> list[list[str]]:
    (ws.folder / "notes.txt").write_text("not a data set\n")
    return [ws.train(*IMAGES, "--data-dir", "notes.txt", "--max-steps", "2")]


def mnist_download(ws: Workspace) -> list[list[str]]:
    line = ws.train(*SMALL[4:], "--dataset", "mnist", "--data-dir", "mnist-data", "--max-steps", "2")  # no synthetic
    return [line, line]


def nothing_measured(ws: Workspace, runs: list[Run]) -> list[str]:
    """A limit that no method fits is known from the model alone: the advisor must not time the links first."""
    return ["MEASURED FIRST"] if any("calibrat" in run.output or "timing" in run.output for run in runs) else []


def same_message(ws: Workspace, runs: list[Run]) -> list[str]:
    """The second attempt must meet the same clear message, not a trace of the first."""
    return [] if len(runs) < 2 or paragraph(runs[0].output) == paragraph(runs[1].output) else ["MESSAGE CHANGED"]


EXPERIMENT = """[experiment]
name = "bad-input"
[launch]
hostfile = "hostfile"
mpirun_args = ["--bind-to", "none"]
timeout = 60
[train]
dataset = "synthetic"
synthetic_size = 256
batch_size = {batch}
max_steps = 2
model = "mnist_cnn"
[[sweep]]
sync = "allreduce"
np = 2
"""


def experiment_unknown_host(ws: Workspace) -> list[list[str]]:
    (ws.folder / "experiment.toml").write_text(EXPERIMENT.format(batch="32"))
    (ws.folder / "hosts").write_text("nohost.invalid slots=2\n")
    return [ws.command("experiment", "experiment.toml", "--hostfile", "hosts", "--no-tracking", "--out", "out")]


def experiment_out_file(ws: Workspace) -> list[list[str]]:
    (ws.folder / "experiment.toml").write_text(EXPERIMENT.format(batch="32"))
    (ws.folder / "notes.txt").write_text("a file\n")
    return [ws.command("experiment", "experiment.toml", "--hostfile", "", "--no-tracking", "--out", "notes.txt")]


def predict_plot_full_disk(ws: Workspace) -> list[list[str]]:
    fill(ws.disk(), 0)
    return [ws.command("predict", "--model", "mnist_cnn", "--ranks", "2,4", "--link", "1gbit", "--plot", "disk/p.png")]


def compare_out_full_disk(ws: Workspace) -> list[list[str]]:
    """A finished job to compare (run here: its own exit is not the case's), then plots for a disk that filled."""
    setup = launch(ws.train(*TRACKED, "--max-steps", "2"), ws.folder, 120)
    if setup.exit != 0:
        raise NotRunnable(f"its setup job failed (exit {setup.exit}): {message(setup.output)[:100]}")
    fill(ws.disk(), 0)
    return [ws.command("compare", "--out", "disk/plots")]


def experiment_bad_value(ws: Workspace) -> list[list[str]]:
    (ws.folder / "experiment.toml").write_text(EXPERIMENT.format(batch='"lots"'))
    return [ws.command("experiment", "experiment.toml", "--dry-run")]


def damaged_latest(ws: Workspace) -> list[list[str]]:
    ck = ws.checkpoints("sgd")
    ws.garbage(ck / "step-00000003.pt", 1 << 20)
    return [ws.train(*RESUMABLE, "--max-steps", "5", "--resume", "auto")]


def not_a_checkpoint(ws: Workspace) -> list[list[str]]:
    (ws.folder / "notes.txt").write_text("not a checkpoint\n")
    return [ws.train(*SMALL, "--max-steps", "2", "--resume", "notes.txt")]


USERS_MODELS = """import os

from torch import nn


class WithSpare(nn.Module):
    def __init__(self, num_classes, input_shape):
        super().__init__()
        channels, height, width = input_shape
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, num_classes))
        self.spare = nn.Linear(16, 16)  # left from an experiment: the forward never calls it

    def forward(self, images):
        return self.body(images)


class Gated(WithSpare):
    def forward(self, images):  # a branch taken on some steps only: the start's check sees it used
        self.calls = getattr(self, "calls", 0) + 1
        return self.body(images) + (self.spare(images[:, 0, 0, :16]).sum() * 0 if self.calls % 3 else 0)


def gated(num_classes, input_shape):
    return Gated(num_classes, input_shape)


def by_process(num_classes, input_shape):  # a bias drawn from the process id, which differs from rank to rank
    model = WithSpare(num_classes, input_shape)
    model.body[1].bias.data.fill_(os.getpid() % 1000 / 1000)
    return model


def frozen(num_classes, input_shape):
    return WithSpare(num_classes, input_shape).requires_grad_(False)


def doubled(num_classes, input_shape):  # float64 weights, as a numerical-methods habit writes them
    return WithSpare(num_classes, input_shape).body.double()


def magnified(num_classes, input_shape):  # each image enlarged 32768 times a side: terabytes a batch
    return nn.Sequential(nn.Upsample(scale_factor=32768), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(input_shape[0], num_classes))
"""


def users_model(name: str, sync: str) -> Callable[[Workspace], list[list[str]]]:
    def prepare(ws: Workspace) -> list[list[str]]:
        (ws.folder / "my_models.py").write_text(USERS_MODELS)  # importable: `python -m` runs from the folder
        return [ws.train(*SMALL, "--model", f"my_models:{name}", "--sync", sync, "--max-steps", "3")]
    return prepare


USERS_DATA = """import torch
from torch.utils.data import TensorDataset


def load():
    def split(count):
        labels = torch.arange(count) % 10
        labels[-1] = 12  # a typo in a label file: kept out of item 0, which the job checks before it starts
        return TensorDataset(torch.rand(count, 3, 32, 32), labels)
    return split(64), split(16), 10


def with_nan():  # a sensor's dropout, stored as NaN: no step's loss survives it
    images = torch.rand(64, 3, 32, 32)
    images[37, 0, 4, 4] = float("nan")
    return TensorDataset(images, torch.arange(64) % 10), TensorDataset(torch.rand(16, 3, 32, 32),
                                                                       torch.arange(16) % 10), 10
"""


def users_data(function: str) -> Callable[[Workspace], list[list[str]]]:
    def prepare(ws: Workspace) -> list[list[str]]:
        (ws.folder / "my_data.py").write_text(USERS_DATA)
        return [ws.train(*IMAGES, "--dataset", f"my_data:{function}", "--model", "resnet18", "--epochs", "1")]
    return prepare


USERS_DATA_PER_RANK = """import os

import torch
from torch.utils.data import TensorDataset


def load():  # each host's copy a little longer than the last one's
    count = 64 + 16 * int(os.environ["OMPI_COMM_WORLD_RANK"])
    return TensorDataset(torch.rand(count, 3, 32, 32), torch.arange(count) % 10), TensorDataset(
        torch.rand(16, 3, 32, 32), torch.arange(16) % 10), 10
"""


def data_per_rank(ws: Workspace) -> list[list[str]]:
    (ws.folder / "my_data.py").write_text(USERS_DATA_PER_RANK)
    return [ws.train(*IMAGES, "--dataset", "my_data:load", "--model", "resnet18", "--epochs", "1")]


def code_per_host(ws: Workspace) -> list[list[str]]:
    """Rank 1 runs a copy of this package with one file changed, as a host whose copy was not updated would: its
    working folder holds the copy, which `python -m` imports first."""
    other = ws.folder / "other-host"
    shutil.copytree(Path(__file__).resolve().parents[1], other / "mpi_train",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with (other / "mpi_train" / "clock.py").open("a") as changed:
        changed.write("# the version of this file on another host\n")
    rank_1 = ["-np", "1", "--wdir", str(other), sys.executable, "-m", "mpi_train", *SMALL]
    return [[*ws.train(*SMALL, np=1), ":", *rank_1]]


def one_class(ws: Workspace) -> list[list[str]]:
    ws.image_folder(ws.folder / "cifar", 4, 2)
    for split in ("train", "test"):
        for name in CLASSES[1:]:
            shutil.rmtree(ws.folder / "cifar" / split / name)
    return [ws.train(*IMAGES, "--dataset", "imagefolder", "--model", "resnet18", "--max-steps", "2")]


def batch_of_one(ws: Workspace) -> list[list[str]]:
    """10 images over 2 ranks, 4 a batch: each rank's pass is 4 and 1, and resnet18's BatchNorm cannot train on one
    value per channel (a 32-pixel image is 1x1 by its last block)."""
    ws.image_folder(ws.folder / "cifar", 1, 1)
    return [ws.train(*IMAGES, "--dataset", "imagefolder", "--model", "resnet18", "--image-size", "32",
                     "--batch-size", "8", "--epochs", "2")]


def checkpoint_dir_in_use(ws: Workspace) -> list[list[str]]:
    """A job (one rank, started from the folder beside) trains into ck while this one starts on it, as a launch line
    run twice does."""
    ws.stack.enter_context(launched(ws.command(*SMALL, "--epochs", "1000", "--threads", "1", "--checkpoint-dir", "ck"),
                                    os.environ, cwd=ws.aside, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    claim = ws.aside / "ck" / CLAIM_FILE
    for _ in range(1200):  # its start: imports, the data, the claim
        if claim.exists() and claim.read_text():
            return [ws.train(*SMALL, "--checkpoint-dir", str(claim.parent))]
        time.sleep(0.1)
    raise NotRunnable("the first job never claimed its checkpoint folder")


def too_few_for_a_step(ws: Workspace) -> list[list[str]]:
    return [ws.train(*SMALL, "--synthetic-size", "4", "--batch-size", "8", "--accumulate", "2")]


BOTH_OPTIMIZERS = r"\bsgd\b.{0,300}\badamw\b|\badamw\b.{0,300}\bsgd\b"
NON_FINITE = r"\b(nan|inf|non-finite|not finite)\b"
CASES = [
    Case("resume-sgd-as-adamw", resume_other_optimizer("sgd", "adamw"), (BOTH_OPTIMIZERS,)),
    Case("resume-adamw-as-sgd", resume_other_optimizer("adamw", "sgd"), (BOTH_OPTIMIZERS,)),
    Case("full-disk-checkpoint", full_disk_checkpoint, (r"no space left",)),
    Case("full-disk-cache", full_disk_cache, (r"no space left",)),
    # 300 logged steps until the disk fills: 70 to 90 s here, beside another case
    Case("full-disk-store", full_disk_store, (r"\brefused \d+ of its writes \(database or disk is full\)",),
         timeout_s=150),
    Case("store-full-at-start", store_full_at_start,
         (r"could not create the job's runs \(database or disk is full\)",)),
    Case("bench-json-full-disk", full_disk_results("bench", "--methods", "ddp", "--json", "disk/bench.json"),
         (r"--json disk/bench\.json could not be written \(no space left",)),
    Case("advice-full-disk", full_disk_results("advise", "--measure", "1", "--advice-dir", "disk"),
         (r"the advice disk/\S+\.json could not be written \(no space left",)),
    Case("advice-memory-limit-1KiB", lambda ws: [ws.train("advise", *MEASURED, "--memory-limit", "1KiB")],
         (r"no sync method fits --memory-limit 1\.00 KiB per rank on 2 ranks",), check=nothing_measured),
    Case("bench-json-under-file", bench_json_under_file,
         (r"--json notes\.txt/bench\.json lies under \S+, which is a file",)),
    Case("corrupt-image", corrupt_image(None), (r"train/cat/0003\.jpg",)),
    Case("corrupt-image-dataloader", corrupt_image("dataloader"), (r"train/cat/0003\.jpg",)),
    Case("summary-json-folder", summary_json_folder, (r"--summary-json\b.{0,200}\b(folder|directory)\b",)),
    Case("timeline-dir-file", timeline_dir_file, (r"--timeline-dir\b.{0,200}\b(file|not a (folder|directory))\b",)),
    Case("replay-cut-spool", cut_spool, (re.escape(SPOOL_NAME), r"\b(cut|truncated|incomplete|unfinished|partial)\b"),
         check=spool_kept),
    Case("server-hangs-mid-job", server_hangs_mid_job, (r"\bstopped answering\b", r"still unreachable; \d+ write"),
         warning=True, timeout_s=180),
    Case("damaged-store", damaged_store, (r"mlflow\.db", r"\b(damaged|corrupt|not a database)\b"), check=store_kept),
    Case("lr-inf", lr("inf", "2"), (rf"(--lr|learning rate)\b.{{0,200}}{NON_FINITE}",)),
    Case("lr-1e6", lr("1e6", "6"), (rf"\bloss\b.{{0,200}}{NON_FINITE}|{NON_FINITE}.{{0,200}}\bloss\b",)),
    Case("reshard-np3-batch256", reshard_np3, (r"\b256\b.{0,200}\b3 ranks\b",)),
    Case("binary-as-text", binary_as_text, (r"\bwarning\b.{0,300}\b(utf-8|binary|not (a )?text)\b",), warning=True),
    Case("data-dir-file", data_dir_file, (r"notes\.txt", r"\b(is a file|not a (folder|directory))\b")),
    Case("mnist-download-twice", mnist_download, (r"\bmnist\b.{0,300}\bdownload", ), check=same_message),
    Case("experiment-unknown-host", experiment_unknown_host, (r"nohost\.invalid",), timeout_s=120),
    # auto is what unattended relaunches use: it goes on from the newest intact checkpoint and says so
    Case("damaged-latest-checkpoint", damaged_latest, (r"step-00000003\.pt.{0,300}\bdamaged\b", r"step-00000002\.pt"),
         warning=True),
    Case("resume-not-a-checkpoint", not_a_checkpoint, (r"notes\.txt.{0,200}\bcheckpoint",)),
    Case("experiment-out-file", experiment_out_file, (r"notes\.txt is a file, not a folder",)),
    Case("predict-plot-full-disk", predict_plot_full_disk, (r"the plot disk/p\.png could not be written \(no space",)),
    Case("compare-out-full-disk", compare_out_full_disk, (r"the plots in --out disk/plots could not be written",)),
    Case("experiment-bad-value", experiment_bad_value, (r"\bbatch_size\b", r"\blots\b")),
    # a model's layer that no logit depends on: DDP would wait at every step for its gradient
    Case("unused-layer-ddp", users_model("WithSpare", "ddp"), (r"spare\.weight", r"find_unused_parameters"),
         warning=True),
    Case("branch-on-some-steps-ddp", users_model("gated", "ddp"),
         (r"\bparameters got no gradient in a step \(spare\.weight, spare\.bias on rank \d\)", r"--sync bucketed\b")),
    Case("model-built-apart", users_model("by_process", "allreduce"),
         (r"\bat start, rank\(s\) \[1\] hold different weights from rank 0 \(the first that differs: body\.1\.bias\)",
          r"\bdraw its first weights from torch's random generator\b")),
    Case("frozen-model", users_model("frozen", "allreduce"), (r"my_models:frozen\b.{0,100}\bno parameter",)),
    Case("float64-model", users_model("doubled", "allreduce"), (r"my_models:doubled\b.{0,100}\bfloat64 parameters",)),
    Case("batch-out-of-memory", users_model("magnified", "allreduce"),
         (r"\bran out of memory in step 1: one allocation asked for\b", r"--accumulate 2 takes 16 at once\b")),
    Case("users-label-out-of-range", users_data("load"), (r"my_data:load\b.{0,100}\bitem \d+ has the label 12\b",)),
    Case("users-nan-image", users_data("with_nan"), (r"my_data:with_nan\b.{0,100}\bitem 37 has an image holding NaN",)),
    Case("data-differs-per-rank", data_per_rank, (r"\branks read different\b", r"\brank 0\b[^;]{0,100}\b64\b",
                                                  r"\brank 1\b[^;]{0,100}\b80\b")),
    Case("code-differs-per-host", code_per_host, (r"\branks run different software\b",
                                                  r"\brank 0\b[^;]{0,100}\bmpi_train's code\b")),
    Case("one-class-folder", one_class, (r"cifar/train\b.{0,100}\bone class folder",)),
    Case("batch-of-one", batch_of_one, (r"\b1 sample per rank\b.{0,200}\bleft out\b",), warning=True),
    Case("checkpoint-dir-in-use", checkpoint_dir_in_use, (r"--checkpoint-dir \S+/ck is in use by another job",
                                                         r"\(process \d+ on host ")),
    Case("too-few-for-a-step", too_few_for_a_step, (r"\b2 sample\(s\) a pass\b.{0,100}\btoo few for one step\b",)),
]
