"""The network lab: [network] in experiment files, the plan it makes, the refusals, and a real sweep over test hosts."""

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MPI_ENV, REPO, why_no_namespaces

from mpi_train.lab import mpirun as launch
from mpi_train.lab.experiment import plan
from mpi_train.lab.experiment_file import SweepError, parse

PREFIX, SUBNET = "nettest", "10.84.0"  # apart from every other user of scripts/testhosts.sh

LAB = """\
[experiment]
name = "lab"
tracking = false
out = "{out}"

[train]
dataset = "synthetic"
batch_size = 32

[[sweep]]
sync = ["ring", "gather_scatter"]

[network]
hosts = [1, 2, 4]
ranks_per_host = 2
link = ["1gbit", "100mbit"]
prefix = "nettest"
subnet = "10.84.0"

[bench]
steps = 2
batch_size = 32
model = "mnist_cnn"
"""


def test_network_settings_cross_the_grid_with_a_bench_first_in_each(tmp_path):
    sweep = parse(LAB.format(out=tmp_path), Path("lab.toml"))
    settings = [(s.hosts, s.link) for s in sweep.network.settings]
    assert settings == [(1, "unlimited"), (2, "1gbit"), (2, "100mbit"), (4, "1gbit"), (4, "100mbit")]
    assert [(r.config.sync, r.np, r.network.hosts, r.config.link) for r in sweep.runs[:4]] == [
        ("ring", 2, 1, "unlimited"), ("ring", 4, 2, "1gbit"), ("ring", 4, 2, "100mbit"), ("ring", 8, 4, "1gbit")]
    launches = plan(sweep, None)
    names = [launch.name for launch in launches]
    assert len(names) == 5 * 3 and names[0] == "bench-np2-h1x2-unlimited" and names[3] == "bench-np4-h2x2-1gbit"
    run = launches[4]  # ring on 2 hosts at 1gbit: its setting's hostfile, the namespace agent, the bench's links
    assert run.name == "ring-np4-seed42-h2x2-1gbit" and "--link" in run.command and "1gbit" in run.command
    assert str(tmp_path / "network" / "hostfile-2x2") in run.command
    assert run.env["PRTE_MCA_plm_ssh_agent"].endswith("scripts/netns-agent")
    assert run.calibration == tmp_path / "bench-h2x2-1gbit.json"
    assert "PRTE_MCA_plm_ssh_agent" not in launches[1].env and "--hostfile" in launches[1].command  # loopback


def test_ranks_per_host_is_a_dimension_and_the_bench_np_picks_settings(tmp_path):
    text = LAB.format(out=tmp_path).replace("ranks_per_host = 2", "ranks_per_host = [1, 2, 4]").replace(
        "[[sweep]]\nsync = [\"ring\", \"gather_scatter\"]", "[[sweep]]\nsync = \"ring\"\nnp = [2, 4]").replace(
        "steps = 2", "steps = 2\nnp = [4, 8]").replace('link = ["1gbit", "100mbit"]', 'link = "1gbit"')
    sweep = parse(text, Path("lab.toml"))
    layouts = [(s.hosts, s.ranks_per_host) for s in sweep.network.settings]
    assert layouts == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (4, 4)]
    # a world size runs only where it fills the hosts: np 2 on 2 hosts of 1, np 4 on 2 hosts of 2 and 4 hosts of 1
    assert [(r.np, r.network.hosts, r.network.ranks_per_host) for r in sweep.runs] == [
        (2, 1, 2), (4, 1, 4), (2, 2, 1), (4, 2, 2), (4, 4, 1)]
    assert [(s.hosts, s.ranks_per_host) for s in sweep.bench.settings] == [(1, 4), (2, 2), (2, 4), (4, 1), (4, 2)]
    launches = plan(sweep, None)
    bench = next(l for l in launches if l.name == "bench-np8-h2x4-1gbit")
    assert str(tmp_path / "network" / "hostfile-2x4") in bench.command and bench.command[2] == "8"
    assert not any(l.name.startswith("bench-np2") for l in launches)  # np 2 is not in [bench] np


def test_a_lab_may_measure_with_the_bench_alone(tmp_path):
    text = LAB.format(out=tmp_path).replace("[[sweep]]\nsync = [\"ring\", \"gather_scatter\"]\n", "")
    sweep = parse(text, Path("lab.toml"))
    assert sweep.runs == ()
    assert [l.name for l in plan(sweep, None)] == ["bench-np2-h1x2-unlimited", "bench-np4-h2x2-1gbit",
                                                   "bench-np4-h2x2-100mbit", "bench-np8-h4x2-1gbit",
                                                   "bench-np8-h4x2-100mbit"]
    with pytest.raises(SweepError) as caught:  # without [network] an experiment still needs its runs
        parse(f'[experiment]\nname = "lab"\nout = "{tmp_path}"\n[bench]\nsteps = 2\n', Path("lab.toml"))
    assert caught.value.key == "sweep" and "at least one [[sweep]]" in str(caught.value)


@pytest.mark.parametrize("change, key, words", [
    (("steps = 2", "steps = 2\nnp = [3]"), "bench.np", "no [network] setting has 3 ranks"),
    (("ranks_per_host = 2", "ranks_per_host = [2, 0]"), "network.ranks_per_host", "at least 1"),
    (("link = [\"1gbit\", \"100mbit\"]", "link = [\"fast\"]"), "network.link", "not a rate"),
    (("link = [\"1gbit\", \"100mbit\"]", "link = [\"1.5gbit\"]"), "network.link", "not a rate scripts/testhosts"),
    (("link = [\"1gbit\", \"100mbit\"]", "link = [\"200gbit\"]"), "network.link", "up to 100gbit"),
    (("prefix = \"nettest\"", "prefix = \"lab1\""), "network.prefix", "ending with a letter"),
    (("hosts = [1, 2, 4]", "hosts = [0]"), "network.hosts", "1 to 250"),
    # each once merged without a word
    (("hosts = [1, 2, 4]", "hosts = [2, 2]"), "network.hosts", "lists 2 twice"),
    (("link = [\"1gbit\", \"100mbit\"]", "link = [\"1gbit\", \"1GBIT\"]"), "network.link", "lists '1GBIT' twice"),
    (("prefix = \"nettest\"", "prefix = \"NetTest-Too-Long\""), "network.prefix", "lower-case"),
    (("sync = [\"ring\", \"gather_scatter\"]\n\n[network]\nhosts = [1, 2, 4]",
      "sync = \"ring\"\nnp = 8\n\n[network]\nhosts = [2]"), "sweep[1].np", "fill them"),
])
def test_a_bad_network_table_is_named_by_key(tmp_path, change, key, words):
    with pytest.raises(SweepError) as caught:
        parse(LAB.format(out=tmp_path).replace(*change), Path("lab.toml"))
    assert caught.value.key == key and words in str(caught.value)


def test_hosts_are_refused_up_front_without_ip_and_tc(tmp_path):
    """No ip/tc on PATH: exit 2 with the reason and the fix, before anything starts or is written."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mpirun",):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    path = tmp_path / "lab.toml"
    path.write_text(LAB.format(out=tmp_path / "out"))
    result = subprocess.run([sys.executable, "-m", "mpi_train", "experiment", str(path)],
                            capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": str(bin_dir)}, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    message = " ".join(result.stderr.split())
    if os.geteuid() != 0:
        assert "needs root" in message
    else:
        assert "the ip and tc command(s) are missing" in message and "apt-get install iproute2" in message
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def _namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(PREFIX)]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_network_sweep_over_two_hosts_and_two_links_tracks_params_and_predicts_sync(tmp_path):
    from mlflow import MlflowClient

    reason = why_no_namespaces(PREFIX) or (None if shutil.which("tc")
                                           else "shaped links need the tc command (iproute2)")
    if reason:
        pytest.skip(reason)

    out, store = tmp_path / "out", f"sqlite:///{tmp_path}/mlflow.db"
    path = tmp_path / "net.toml"
    path.write_text(f"""
[experiment]
name = "nettest"
tracking_uri = "{store}"
out = "{out}"
[launch]
timeout = 240
[train]
dataset = "synthetic"
model = "mnist_cnn"
synthetic_size = 256
batch_size = 16
max_steps = 4
log_every = 1
system_metrics_every = 0
[[sweep]]
sync = ["ring"]
[network]
hosts = [2]
ranks_per_host = 2
link = ["1gbit", "100mbit"]
prefix = "{PREFIX}"
subnet = "{SUBNET}"
""")
    try:
        result = launch.run([sys.executable, "-m", "mpi_train", "experiment", str(path)], timeout=840, cwd=REPO,
                              env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)})  # stopped as a group past it
    finally:
        left = _namespaces()
        if left:
            subprocess.run([str(REPO / "scripts" / "testhosts.sh"), "down"],
                           env={**os.environ, "TESTHOSTS_PREFIX": PREFIX, "TESTHOSTS_SUBNET": SUBNET,
                                "TESTHOSTS_HOSTFILE": str(tmp_path / "h")}, timeout=60, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert left == [], f"the runner left test hosts behind: {left}"
    assert "network: every test host's link now 100mbit" in result.stdout

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("nettest")
    runs = client.search_runs([experiment.experiment_id], "tags.`mpi_train.role` = 'job'")
    assert len(runs) == 2
    measured = {}
    for run in runs:
        params, metrics = run.data.params, run.data.metrics
        assert (params["num_hosts"], params["ranks_per_host"], params["world_size"]) == ("2", "2", "4")
        assert params["link"] in ("1gbit", "100mbit") and run.info.run_name.endswith(params["link"])
        history = client.get_metric_history(run.info.run_id, "time/predicted_sync_s")
        assert len(history) >= 4 and metrics["summary/predicted_sync_s"] > 0
        summary = json.loads((out / "runs" / f"{run.info.run_name}.json").read_text())
        # step 1 opens connections
        after_first = statistics.median(step["sync_time_s"] for step in summary["steps"][1:])
        measured[params["sync"], params["link"]] = (after_first, metrics["summary/predicted_sync_s"])
    for (sync, link), (seconds, predicted) in measured.items():  # loose: the CPU is shared, the model is not that rough
        assert predicted / 4 < seconds < predicted * 4, (sync, link, seconds, predicted)
    for sync in ("ring",):  # the shaping is real: a tenth of the rate costs several times the time
        assert measured[sync, "100mbit"][0] > 3 * measured[sync, "1gbit"][0], measured
    report = (out / "report.txt").read_text()
    assert "against the alpha-beta model" in report and "100mbit" in report


def test_the_shipped_network_file_plans_what_the_lab_promises():
    import torch

    from mpi_train.lab.experiment_file import load
    from mpi_train.sync import SYNC_METHODS, backend_error

    HERE = "nccl" if torch.cuda.is_available() else "gloo"  # what backend "auto" becomes where the file is read

    sweep = load(REPO / "experiments/network.toml")
    assert sweep.network.hosts == (1, 2, 4) and sweep.network.links == ("1gbit", "100mbit")
    assert {(r.np, r.network.hosts) for r in sweep.runs} == {(2, 1), (4, 2), (8, 4)}
    for model in ("vgg11", "mnist_cnn"):
        mine = [r for r in sweep.runs if r.config.model == model]
        runnable = [name for name in SYNC_METHODS if not backend_error(name, HERE)]  # ddp_powersgd needs NCCL
        assert len(mine) == len(runnable) * 5 and all(r.config.dataset == "synthetic" for r in mine)
    assert sweep.bench and sweep.bench.model == "vgg11"


def test_the_shipped_bench_labs_plan_the_layouts_their_targets_name():
    from mpi_train.lab.experiment_file import load

    targets = load(REPO / "experiments/network_targets.toml")
    assert targets.runs == () and targets.bench.model == "vgg11" and targets.bench.batch_size == 256
    layouts = {(s.slots, s.hosts, s.link) for s in targets.bench.settings}
    for link in ("1gbit", "100mbit"):  # np 2, 4 and 8 over 2 and 4 test hosts, at both rates
        assert {(2, 2, link), (4, 2, link), (8, 2, link), (4, 4, link), (8, 4, link)} <= layouts
    assert ({(2, 1, "unlimited"), (4, 1, "unlimited")} <= layouts
            and all(s.slots in (2, 4, 8) for s in targets.bench.settings))
    beat = load(REPO / "experiments/beat_ddp.toml")
    assert [(s.hosts, s.ranks_per_host, s.link) for s in beat.bench.settings] == [(2, 2, "1gbit"), (2, 2, "100mbit")]
    assert {"ddp", "ddp_fp16", "ddp_powersgd", "bucketed"} <= set(beat.bench.methods) and beat.bench.batch_size == 256
