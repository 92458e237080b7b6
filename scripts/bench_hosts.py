"""Sync methods across hosts: measured sync time next to the cost models' prediction.

Runs one short training job per sync method on the hosts of a hostfile (the test hosts of
scripts/testhosts.sh, shaped to a known rate, or a real cluster) and prints, per method,
the median per-step times and the time the method's traffic needs on the links between
hosts. Run it where mpirun runs, e.g. on shaped test hosts:

    scripts/testhosts.sh up 2 && scripts/testhosts.sh shape 1gbit
    PRTE_MCA_plm_ssh_agent=$PWD/scripts/netns-agent python scripts/bench_hosts.py \\
        --hostfile hostfile.testhosts --np 4 --gbit 1

The model: S bytes of fp32 gradients, link rate B each way per host. A ring allreduce sends
2(N-1)/N·S per rank; with ranks numbered host by host, one ring edge leaves and one enters
each host, so each host's link carries the same 2(N-1)/N·S each way. gather_scatter sends
everything through rank 0: the textbook bound is rank 0's link carrying (N-1)·S in and then
(N-1)·S out; here the ranks on rank 0's host use memory, so the link carries (N-L)·S each way,
one way after the other (L = ranks per host). ddp moves allreduce's bytes, overlapped with
backward, so its cost shows in compute time rather than sync time (so does bucketed's); flat and
ring move allreduce's bytes in one buffer, flat_fp16 half of them (S is what a method sends).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mpi_train import launcher  # noqa: E402 - after the path is set
from mpi_train.costs import wire_bytes  # noqa: E402
from mpi_train.sync import SYNC_METHODS  # noqa: E402

METHODS = tuple(name for name, method in SYNC_METHODS.items() if "gloo" not in method.unsupported_backends)  # test hosts run Gloo


def gradient_bytes(model: str) -> int:
    from mpi_train.models import build_model

    return 4 * sum(p.numel() for p in build_model(model).parameters())


def predictions(size: int, ranks_per_host: int, S: float, B: float) -> dict:
    """Seconds per step the sync traffic needs on the links, by cost model: (textbook, this placement)."""
    N, L = size, ranks_per_host
    ring = 2 * (N - 1) / N * S / B
    H = N // L  # hosts; hierarchical sends only between their leaders
    hierarchical = 2 * (H - 1) / H * S / B if 1 < H < N else ring
    return {"root": (2 * (N - 1) * S / B, 2 * (N - L) * S / B), "ring": (ring, ring), "hierarchical": (hierarchical, hierarchical)}


def run(method: str, args, workdir: Path) -> dict:
    summary = workdir / f"{method}.json"
    command = ["mpirun", "-np", str(args.np), "--hostfile", args.hostfile, sys.executable, "-m", "mpi_train",
               "--sync", method, "--dataset", "synthetic", "--model", args.model, "--batch-size", str(args.batch_size),
               "--synthetic-size", str(args.batch_size * args.steps), "--max-steps", str(args.steps),
               "--log-every", "1", "--no-tracking", "--summary-json", str(summary)]
    result = launcher.run(command, env={**os.environ, **launcher.OPEN_MPI_ENV, "PYTHONPATH": str(REPO)}, timeout=900)
    if result.returncode:
        sys.exit(f"{method} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return json.loads(summary.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hostfile", required=True, help="hosts to run on (slots = ranks per host)")
    parser.add_argument("--np", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--gbit", type=float, required=True, help="link rate between hosts, Gbit/s each way, for the prediction")
    parser.add_argument("--model", default="vgg11", help="model (default vgg11, on CIFAR-shaped synthetic data)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch (default 64)")
    parser.add_argument("--steps", type=int, default=15, help="steps per method; the first is left out as warm-up (default 15)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()

    S, B = gradient_bytes(args.model), args.gbit * 1e9 / 8
    with tempfile.TemporaryDirectory() as tmp:
        summaries = {method: run(method, args, Path(tmp)) for method in args.methods}
    first = next(iter(summaries.values()))
    hosts = first["hosts"]
    ranks_per_host = hosts.count(hosts[0])
    print(f"{args.model}: S = {S / 4:,.0f} params x 4 B = {S / 1e6:.2f} MB; {len(hosts)} ranks on {len(set(hosts))} hosts "
          f"({ranks_per_host} on rank 0's host); links {args.gbit:g} Gbit/s; steps 2..{args.steps}, median over steps "
          f"of the mean over ranks")
    print(f"{'method':<15}{'sync s':>9}{'(mean)':>9}{'compute s':>11}{'step s':>9}{'model: textbook':>17}{'this placement':>16}")
    for method, summary in summaries.items():
        steps = summary["steps"][1:]
        median = {key: statistics.median(s[key] for s in steps) for key in ("sync_time_s", "compute_time_s", "step_time_s")}
        mean_sync = statistics.mean(s["sync_time_s"] for s in steps)
        method_class = SYNC_METHODS[method]
        textbook, placed = predictions(len(hosts), ranks_per_host, wire_bytes(method_class, S), B)[method_class.cost_model]
        print(f"{method:<15}{median['sync_time_s']:>9.3f}{mean_sync:>9.3f}{median['compute_time_s']:>11.3f}"
              f"{median['step_time_s']:>9.3f}{textbook:>17.3f}{placed:>16.3f}")


if __name__ == "__main__":
    main()
