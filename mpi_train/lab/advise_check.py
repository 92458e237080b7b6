"""`python -m mpi_train advise-check`: the advisor held against a full bench on test hosts, setting by setting.

For each number of test hosts and each link rate (2 ranks a host by default), it shapes the links
and runs `python -m mpi_train advise --fresh --full-bench STEPS` there: the advice as a user gets it
(its time is the speed target), then every lossless method, bucketed at a grid of bucket sizes,
measured side by side. It prints one row per setting: what was recommended, the fastest of the
full bench, the regret (the recommendation's measured step over the fastest's, less 1; target at
most 5%), Kendall's tau of predicted against measured over the methods (target at least 0.7) and
over every configuration, the recommended bucket size against the 25 MB default, and how long the
advice and the full bench took. Needs root, ip and tc (docs/network-lab.md, "Test hosts"); the
hosts are removed on every way out. Each advice JSON is kept in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArgumentParser, UserError, format_error
from ..sync import BASELINE
from . import mpirun
from .network import NetworkPlan, NetworkSetting
from .testhosts import TestHosts, check_can_run

REGRET_TARGET = 0.05
TAU_TARGET = 0.7
SPEED_TARGET_S = 180.0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train advise-check", description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="2,4", help="numbers of test hosts, comma-separated (default: 2,4)")
    parser.add_argument("--links", default="1gbit,100mbit", help="link rates, comma-separated (default: "
                                                                 "1gbit,100mbit)")
    parser.add_argument("--ranks-per-host", type=int, default=2, help="ranks on each host (default: 2)")
    parser.add_argument("--model", default="vgg11", help="model (default: vgg11)")
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (default: 256)")
    parser.add_argument("--full-steps", type=int, default=3, help="timed steps per configuration of the full bench "
                                                                  "(default: 3)")
    parser.add_argument("--out", default="advise-check", help="folder for the advice files (default: advise-check)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds one setting may take (default: 3600)")
    parser.add_argument("--prefix", default="mpiadv", help="test hosts' name prefix (default: mpiadv)")
    parser.add_argument("--subnet", default="10.83.0", help="test hosts' subnet (default: 10.83.0)")
    return parser


def advise_command(setting: NetworkSetting, hostfile: Path, args, json_path: Path, advice_dir: Path) -> list[str]:
    command = ["mpirun", "-np", str(setting.slots), "--hostfile", str(hostfile), "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command + [sys.executable, "-m", "mpi_train", "advise", "--model", args.model, "--batch-size",
                      str(args.batch_size), "--fresh", "--link", setting.link, "--full-bench", str(args.full_steps),
                      "--json", str(json_path), "--advice-dir", str(advice_dir), "--no-tracking"]


def row_of(setting: NetworkSetting, advice: dict, wall_s: float) -> dict:
    check = advice["full_bench"]
    steps = {row["label"]: row["measured_step_s"] for row in check["configurations"]}
    recommended = advice["recommended"]
    return {"setting": setting.label, "recommended": recommended["label"], "recommended_step_s": steps[
        recommended["label"]], "fastest": check["fastest"], "fastest_step_s": steps[check["fastest"]],
            "regret": check["regret"], "tau_methods": check["kendall_tau_methods"], "tau_all": check["kendall_tau"],
            "default_25mb_step_s": check["default_bucket_step_s"], "ddp_step_s": steps.get(BASELINE),
            "advise_s": advice["advise_s"], "full_bench_s": check["seconds"], "wall_s": wall_s,
            "advise_wall_s": wall_s - check["seconds"]}  # mpirun's start to its end, the full bench left out


def table(rows: Sequence[dict]) -> str:
    def ms(value):
        return "-" if value is None else f"{value * 1e3:,.0f}"

    header = ("setting", "recommended", "its step ms", "fastest", "fastest ms", "regret", "tau methods", "tau all",
              "25MB ms", "ddp ms", "advise s", "full bench s")  # advise s: mpirun's start to its end
    cells = [header] + [(r["setting"], r["recommended"], ms(r["recommended_step_s"]), r["fastest"],
                         ms(r["fastest_step_s"]), f"{r['regret']:+.1%}",
                         "-" if r["tau_methods"] is None else f"{r['tau_methods']:.2f}",
                         "-" if r["tau_all"] is None else f"{r['tau_all']:.2f}", ms(r["default_25mb_step_s"]),
                         ms(r["ddp_step_s"]), f"{r['advise_wall_s']:.0f}", f"{r['full_bench_s']:.0f}") for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) if i in (0, 1, 3) else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths)))
             for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdicts(rows: Sequence[dict]) -> list[str]:
    lines = []
    for r in rows:
        met = [f"regret {'met' if r['regret'] <= REGRET_TARGET else 'MISSED'}",
               f"tau {'met' if (r['tau_methods'] or -1) >= TAU_TARGET else 'MISSED'}"]
        if r["setting"].startswith("h2x") and r["setting"].endswith("100mbit"):
            met.append(f"speed {'met' if r['advise_wall_s'] <= SPEED_TARGET_S else 'MISSED'} "
                       f"({r['advise_wall_s']:.0f} s from mpirun's start to its end, {r['advise_s']:.0f} s of it "
                       f"after start-up; the full bench took {r['full_bench_s']:.0f} s more)")
        lines.append(f"{r['setting']}: " + ", ".join(met))
    return lines


def run(args) -> int:
    hosts = [int(h) for h in args.hosts.split(",")]
    links = [link.strip() for link in args.links.split(",")]
    if any(h < 2 for h in hosts):
        raise UserError(f"--hosts {args.hosts}: each setting needs at least 2 test hosts.")
    plan = NetworkPlan(tuple(hosts), (args.ranks_per_host,), tuple(links), prefix=args.prefix, subnet=args.subnet)
    check_can_run(plan, Path("python -m mpi_train advise-check"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with TestHosts(plan, out / "hosts") as testhosts:
        for setting in plan.settings:
            testhosts.apply(setting)
            hostfile = testhosts.hostfile(setting.hosts, setting.ranks_per_host)
            json_path = out / f"advice-{setting.label}.json"
            json_path.unlink(missing_ok=True)
            log = out / f"advise-{setting.label}.log"
            env = {**os.environ, **mpirun.OPEN_MPI_ENV, "PYTHONUNBUFFERED": "1", **TestHosts.launch_env(setting)}
            command = advise_command(setting, hostfile, args, json_path, out / "advice")
            print(f"advise_check: {setting.label}: {' '.join(command)}", flush=True)
            started = time.perf_counter()
            try:
                done = mpirun.run(command, env, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"advise_check: {setting.label} ran past {args.timeout} s and was stopped", flush=True)
                continue
            wall = time.perf_counter() - started
            log.write_text(done.stdout + done.stderr)
            if done.returncode or not json_path.is_file():
                print(f"advise_check: {setting.label} failed (exit {done.returncode}); its output is in {log}",
                      flush=True)
                continue
            print(done.stdout.split("\nadvice kept")[0].split("\nadvice for ")[-1][-3000:], flush=True)
            rows.append(row_of(setting, json.loads(json_path.read_text()), wall))
            print(f"\n{table(rows[-1:])}\n", flush=True)
    if rows:
        print(table(rows))
        print("\n".join(verdicts(rows)))
        (out / "summary.json").write_text(json.dumps(rows, indent=2))
    return 0 if len(rows) == len(plan.settings) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
