"""What a job's run records about the job besides its metrics: its params, and the environment it ran in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from ..config import JobInfo, TrainConfig, field_kinds

# environment variables whose name holds one of these are left out of environment.json
SECRET_WORDS = ("TOKEN", "PASSWORD", "SECRET", "KEY", "CREDENTIAL", "AUTH")
# TrainConfig's fields that are not params of a job's run, each a path or an output switch: none changes what the job
# computes, or how fast. Every other field is a param, so two runs that differ by any other option differ in MLflow.
NOT_PARAMS = (
    "summary_json", "timeline_dir", "checkpoint_dir",  # where the job writes its outputs
    "resume",  # the checkpoint it continues: tags resumed_from, resumed_from_checkpoint
    "calibration",  # a bench JSON, read only for the predicted sync time (metric time/predicted_sync_s)
    "tracking_uri", "experiment", "run_name",  # where and as what the run is recorded: MLflow shows them
    "no_tracking", "save_model", "tracking_spool",  # output switches (a recorded run has no_tracking off)
)
# what the job turned out to be (JobInfo), logged over the option where both name one (backend auto: the one chosen)
JOB_PARAMS = ("world_size", "batch_size_per_rank", "hosts", "rendezvous", "num_hosts", "ranks_per_host", "backend",
              "threads", "compression", "advice", "precision")
PARAMS = (*(name for name in field_kinds() if name not in NOT_PARAMS), *JOB_PARAMS)
PARAMS_PER_BATCH = 100  # the most params MLflow takes in one log_batch
CONFIG_FILE = "config.toml"  # the artifact holding the job as a job file: --config reruns it


def run_params(config: TrainConfig, job: JobInfo, hosts: list[str]) -> dict:
    """The job's run's params: each option in PARAMS as the job ran it (unset ones left out) and what the job turned
    out to be."""
    params = {**{k: v for k, v in config.as_dict().items() if k in PARAMS and v is not None},
              **{k: v for k, v in job.as_dict().items() if k in JOB_PARAMS}}
    params["hosts"] = ",".join(sorted(set(hosts)))
    return params


def git_commit() -> str | None:
    """The project's commit (with `-dirty` if tracked files changed), or None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5,
                                check=False)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5, check=False).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def describe_environment(cluster) -> dict:
    """Versions, the job's hosts as a hostfile, the MPI library and launcher settings (no secrets)."""
    import mlflow
    import torch

    try:
        # the package only: importing mpi4py.MPI would initialise MPI, which torchrun and srun jobs never do
        import mpi4py

        mpi4py_version = mpi4py.__version__
    except ImportError:
        mpi4py_version = ""
    library = ""
    if "mpi4py.MPI" in sys.modules:
        try:
            library = sys.modules["mpi4py.MPI"].Get_library_version().replace("\0", "").strip()
        except Exception:  # noqa: BLE001, S110 - the MPI library's version is only informative: left blank
            pass
    slots: dict[str, int] = {}
    for host in cluster.hosts:
        slots[host] = slots.get(host, 0) + 1
    launcher = {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_", "OMPI_COMM_WORLD_SIZE", "MASTER_ADDR",
                                 "MASTER_PORT", "GLOO_SOCKET_IFNAME", "WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                 "SLURM_JOB_ID", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NODELIST"))
                and not any(word in k.upper() for word in SECRET_WORDS)}
    return {
        "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
        "mpi4py": mpi4py_version, "launcher": cluster.environment.name, "mlflow": mlflow.__version__,
        "mpi_library": library,
        "git_commit": git_commit(), "world_size": cluster.info.world_size, "hosts_by_rank": list(cluster.hosts),
        "hostfile": "".join(f"{host} slots={n}\n" for host, n in slots.items()), "launcher_env": launcher,
    }
