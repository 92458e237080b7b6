"""Run under mpirun: for each sync method, three training jobs one after another in the same ranks.

An uninterrupted job of TOTAL steps, a job stopped after RESUME_AT steps that writes
checkpoints, and a job resumed from those checkpoints (read back from disk) to TOTAL; the
last two with --resume auto, as a launch line that relaunches itself would run them.
Each writes its summary to OUT/<sync>-<job>.json for tests/test_checkpoint.py to compare.
One mpirun for all of them: starting a job's processes costs far more than its few steps.

    mpirun -np 2 python -m tests.rank_programs.resume_check OUT TOTAL RESUME_AT ARGS...
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpi_train.cluster import Cluster, exit_process
from mpi_train.commands.train import parse_config
from mpi_train.sync import SYNC_METHODS, backend_error, split_label

ON_GLOO = [name for name in SYNC_METHODS if not backend_error(name, "gloo")]  # the methods this check's backend runs
# and PowerSGD, whose warm-start Qs and residuals a checkpoint must carry, compressing from step 3 on
COMPRESSED = ["bucketed+powersgd", "flat+powersgd"]
CHECKED = ON_GLOO + COMPRESSED
from mpi_train.train import run


def main(out: str, total: str, resume_at: str, *args: str) -> None:
    cluster = Cluster.from_mpi()
    folder = Path(out)
    for sync in CHECKED:
        checkpoints = folder / f"{sync}-ck"
        jobs = {
            "whole": ["--max-steps", total],
            # --resume auto: a fresh start while the folder is empty, then the latest checkpoint in it
            "first": ["--max-steps", resume_at, "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3",
                      "--resume", "auto"],
            "resumed": ["--max-steps", total, "--checkpoint-dir", str(checkpoints), "--resume", "auto"],
            # relaunched once more: the folder's latest checkpoint is the job's end, so there is nothing to do
            "again": ["--max-steps", total, "--checkpoint-dir", str(checkpoints), "--resume", "auto"],
        }
        for name, extra in jobs.items():
            method, compression = split_label(sync)
            powersgd = ["--powersgd-start-step", "2"] if compression == "powersgd" else []  # read by PowerSGD alone
            argv = [*args, "--sync", method, "--compression", compression, *powersgd, *extra,
                    "--summary-json", str(folder / f"{sync}-{name}.json")]
            run(parse_config(argv, quiet=not cluster.info.is_main), cluster)


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_process(0)  # as `python -m mpi_train` does: interpreter teardown can abort under Gloo's threads
