"""Which launcher started a process, read from its variables alone, and the guard against N separate jobs."""

import pytest

from mpi_train.environments import ENVIRONMENTS, check_world, choose, detect
from mpi_train.environments.slurm import SlurmEnvironment, first_host
from mpi_train.environments.torchrun import TorchrunEnvironment
from mpi_train.errors import UserError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
SRUN_TASK = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "slm[1-2]",
             "SLURM_JOB_NODELIST": "slm[1-2]"}
BATCH_SCRIPT = {"SLURM_JOB_ID": "1234", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "slm[1-2]"}  # no step: the script itself, not a task


@pytest.mark.parametrize("env, expected", [
    ({}, "mpi"),  # no launcher: an MPI singleton, one rank
    (OPEN_MPI, "mpi"),
    ({"PMIX_RANK": "0", **SRUN_TASK}, "mpi"),  # srun --mpi=pmix starts MPI ranks: MPI rules them
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "mpi"),  # mpiexec (MPICH, Intel MPI)
    (TORCHRUN, "torchrun"),
    ({**TORCHRUN, **SRUN_TASK}, "torchrun"),  # srun starting torchrun on each node: torchrun's ranks
    (SRUN_TASK, "slurm"),
    (BATCH_SCRIPT, "mpi"),  # python run straight in a batch script or salloc shell is no srun task
])
def test_detection_reads_the_launchers_variables(env, expected):
    assert detect(env) == expected


def test_torchrun_answers_from_its_variables():
    environment = TorchrunEnvironment(TORCHRUN)
    assert (environment.global_rank(), environment.world_size(), environment.local_rank()) == (3, 4, 1)
    assert (environment.main_address, environment.main_port) == ("node1", 29500)
    assert environment.node_key() == ("node", "1")


def test_slurm_answers_from_its_variables():
    environment = SlurmEnvironment(SRUN_TASK)
    assert (environment.global_rank(), environment.world_size(), environment.local_rank()) == (2, 4, 0)
    assert environment.main_address == "slm1"  # the step's first node hosts the rendezvous
    assert 15000 <= environment.main_port < 35000
    assert SlurmEnvironment({**SRUN_TASK, "SLURM_STEP_ID": "1"}).main_port != environment.main_port  # the next step
    assert SlurmEnvironment({**SRUN_TASK, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "4000"}).main_address == "10.0.0.9"
    assert SlurmEnvironment({**SRUN_TASK, "MASTER_PORT": "4000"}).main_port == 4000


@pytest.mark.parametrize("nodelist, first", [
    ("slm1", "slm1"), ("slm[1-2]", "slm1"), ("node[03-05,9],gpu1", "node03"), ("gpu1,node[1-4]", "gpu1"),
    ("rack[2-3]-n1", "rack2-n1"),
])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert first_host(nodelist) == first


def test_a_launcher_named_without_its_variables_says_how_to_start_it():
    with pytest.raises(UserError, match="torchrun --nproc-per-node"):
        choose("torchrun", {})
    with pytest.raises(UserError, match="srun"):
        choose("slurm", BATCH_SCRIPT)
    with pytest.raises(UserError, match="choose one of auto, mpi, torchrun, slurm"):
        choose("pbs", {})
    assert set(ENVIRONMENTS) == {"mpi", "torchrun", "slurm"}


@pytest.mark.parametrize("changed, said", [
    ({"RANK": "x"}, "RANK='x' is not a whole number"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "put this process at rank 5 of 2, which no job has"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "at rank 0 of 0"),
    ({"MASTER_ADDR": "no-such-host.invalid"}, "and no-such-host.invalid does not resolve on this host"),
])
def test_torchrun_variables_left_over_in_a_shell_are_named_before_any_wait(changed, said):
    """Left-over variables once hung for 300 s whatever --timeout said, then raised a traceback."""
    environment = TorchrunEnvironment({**TORCHRUN, **changed}, timeout_s=1)
    with pytest.raises(UserError) as refused:
        environment.connect()
    message = str(refused.value)
    assert said in message and "If torchrun did not start this process, its variables are left over" in message


def test_ranks_that_never_meet_wait_for_timeout_and_a_port_in_use_is_named(monkeypatch):
    import socket
    import time

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # torch's env:// reads the process's own variables
    monkeypatch.setenv("MASTER_PORT", "0")

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(UserError) as missed:
        TorchrunEnvironment({**TORCHRUN, "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"},
                            timeout_s=1).connect()  # rank 0 alone, on a free port: the other 3 never come
    said = str(missed.value)
    assert time.monotonic() - started < 10 and "within --timeout 1 s" in said and "clients joined" in said, said
    with pytest.raises(UserError) as taken:
        SlurmEnvironment({**SRUN_TASK, "SLURM_PROCID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                         timeout_s=1).connect()
    holder.close()
    assert f"and port {port} is in use by another program" in str(taken.value), taken.value


@pytest.mark.parametrize("env, variable", [
    (TORCHRUN, "WORLD_SIZE=4"), (OPEN_MPI, "OMPI_COMM_WORLD_SIZE=4"), (SRUN_TASK, "SLURM_STEP_NUM_TASKS=4"),
    ({"PMI_SIZE": "8"}, "PMI_SIZE=8"),
])
def test_fewer_ranks_than_the_launcher_started_is_refused(env, variable):
    with pytest.raises(UserError, match=f"{variable} says .* but the mpi launcher found 1 rank.*separate jobs"):
        check_world(1, "mpi", env)
    with pytest.raises(UserError, match="found 2 rank.*would leave out processes that launcher started"):
        check_world(2, "mpi", env)  # mpirun -np 2 with a launcher's count left over: not "separate jobs"
    check_world(int(variable.split("=")[1]), "mpi", env)  # as many as started: fine


def test_a_world_larger_than_a_launchers_count_is_fine():
    # mpirun inside a 2-node allocation: its daemons' srun step has 2 tasks, the job 8 ranks
    check_world(8, "mpi", {"SLURM_STEP_NUM_TASKS": "2", "OMPI_COMM_WORLD_SIZE": "8"})
    check_world(1, "mpi", {})


def test_store_collectives_between_two_ranks():
    """The object collectives of torchrun and srun jobs, over a real TCPStore, two ranks in two threads."""
    import datetime
    import threading

    from torch.distributed import TCPStore

    from mpi_train.environments.store import StoreChannel

    timeout = datetime.timedelta(seconds=20)
    server = TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timeout, wait_for_workers=False)
    results = {}

    def rank_body(rank: int) -> None:
        store = server if rank == 0 else TCPStore("127.0.0.1", server.port, 2, is_master=False, timeout=timeout)
        channel = StoreChannel(store, rank, 2)
        results[rank] = (channel.allgather(("host", rank)), channel.bcast(f"from {rank}"), channel.gather(rank * 10),
                         channel.scatter(["zero", "one"] if rank == 0 else None), channel.allgather(rank))

    threads = [threading.Thread(target=rank_body, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # plain data travels as JSON: tuples come back as lists
    assert results[0] == ([["host", 0], ["host", 1]], "from 0", [0, 10], "zero", [0, 1])
    assert results[1] == ([["host", 0], ["host", 1]], "from 0", None, "one", [0, 1])


def test_a_launch_daemon_knows_whether_mpirun_still_answers():
    import socket

    from mpi_train.environments.mpi import launcher_reachable

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    arguments = (f'prted --prtemca prte_hnp_uri "prterun-vm-1@0.0;tcp://192.0.2.2,127.0.0.1:{port}:64,24,24" '
                 f'--prtemca x y')
    assert launcher_reachable(arguments) is True  # the second address answers
    listener.close()
    assert launcher_reachable(arguments) is False  # nothing listens there any more
    assert launcher_reachable("prted --prtemca ess env") is None  # the command line does not say: leave it be


def test_master_addr_is_refused_under_a_launcher_that_says_where_ranks_meet(monkeypatch):
    from mpi_train.cluster import Cluster, RankInfo

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # torch's env:// reads the process's own variables
    monkeypatch.setenv("MASTER_PORT", "0")

    environment = TorchrunEnvironment({**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}, timeout_s=5)
    environment.connect()  # one rank: the store is up at once
    cluster = Cluster(environment, RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="h"), ("h",))
    with pytest.raises(UserError) as refused:
        cluster.open_process_group("gloo", "10.250.250.250", 10)
    assert "--master-addr 10.250.250.250 sets where rank 0 listens under mpirun, and this job was started by " \
           "torchrun" in str(refused.value)


def test_the_meeting_takes_launcher_and_timeout_from_the_flags_else_the_job_file(tmp_path):
    """Ranks meet before the flags are read; a job file's timeout once left them waiting the default 300 s."""
    from mpi_train.rankguard import MEETING_TIMEOUT_S, meeting_options

    job = tmp_path / "job.toml"
    job.write_text('timeout = 20\nlauncher = "torchrun"\nbatch_size = 64\n')
    assert meeting_options(["--config", str(job)]) == ("torchrun", 20.0)
    assert meeting_options(["--config", str(job), "--timeout", "7", "--launcher", "mpi"]) == ("mpi", 7.0)
    assert meeting_options([]) == ("auto", MEETING_TIMEOUT_S)
    job.write_text('timeout = "soon"\nlauncher = "pbs"\n')  # refused, with its line, once the flags are read
    assert meeting_options(["--config", str(job)]) == ("auto", MEETING_TIMEOUT_S)
    job.write_text("timeout = [\n")  # not TOML: the same
    assert meeting_options(["--config", str(job)]) == ("auto", MEETING_TIMEOUT_S)
    absent = str(tmp_path / "absent.toml")
    assert meeting_options(["--config", absent, "--timeout", "nan"]) == ("auto", MEETING_TIMEOUT_S)


def test_a_rank_whose_launcher_is_killed_hears_of_it_within_seconds(tmp_path):
    """mpirun killed by SIGKILL once left its ranks training unseen for an epoch; here a real parent process named as
    Open MPI's daemon is killed the same way."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    heard = tmp_path / "heard"
    child = (f"import time; from pathlib import Path; from mpi_train.environments.mpi import MpiEnvironment\n"
             f"MpiEnvironment().watch_launcher(lambda what: Path({str(heard)!r}).write_text(what))\n"
             f"Path({str(heard)!r} + '.ready').touch()\n"
             f"time.sleep(15)\n")
    daemon = tmp_path / "prted"
    shutil.copy("/bin/sh", daemon)
    launcher = subprocess.Popen([str(daemon), "-c", f'"{sys.executable}" -c "$0" & wait', child],
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "heard.ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not heard.exists()  # the daemon is alive: nothing heard yet
        killed = time.monotonic()
        launcher.kill()
        launcher.wait()
        while not heard.exists() and time.monotonic() < killed + 5:
            time.sleep(0.1)
        assert heard.read_text() == f"prted (pid {launcher.pid})" and time.monotonic() - killed < 3
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the orphaned child too
