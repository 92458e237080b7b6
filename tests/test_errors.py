"""Bad input under real mpirun: one clear paragraph, printed once, a non-zero exit, nothing written."""

import os
import shutil
import time

import pytest
from conftest import mpirun
from disk_formats import write_cifar10_folders

pytestmark = pytest.mark.e2e


def assert_clean_failure(result, *needles):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("mpi_train: error:") == 1, result.stderr  # rank 0 alone speaks
    text = " ".join(result.stderr.split())
    for needle in needles:
        assert needle in text, text


def test_indivisible_batch_fails_before_any_work(tmp_path, quick_args):
    summary = tmp_path / "s.json"
    result = mpirun(4, [*quick_args, "--batch-size", "50", "--summary-json", str(summary)])
    assert_clean_failure(result, "--batch-size 50", "4 ranks", "48", "52")
    assert not summary.exists()


def test_missing_data_explains_where_and_what_to_do(tmp_path):
    result = mpirun(2, ["--dataset", "mnist", "--data-dir", str(tmp_path / "none"), "--max-steps", "1",
                        "--no-tracking"])
    assert_clean_failure(result, str(tmp_path / "none"), "could not be downloaded", "--dataset synthetic")
    assert not (tmp_path / "none").exists()  # the folder made for the download is gone again


def without_permission_override() -> tuple[str, ...]:
    """A prefix under which ranks obey file permissions. Root ignores them, so as root the ranks run
    without the two capabilities that let it (setpriv, from util-linux)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): a folder cannot be made unreadable to root")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.parametrize("unreadable", ["folder", "files"])
def test_unreadable_data_says_so_and_how_to_fix_it(tmp_path, unreadable):
    data = write_cifar10_folders(tmp_path / "cifar", train=20, test=10)
    locked = [data] if unreadable == "folder" else list(data.rglob("*.png"))
    for path in locked:
        path.chmod(0)
    try:
        result = mpirun(2, ["--dataset", "cifar10", "--data-dir", str(data), "--max-steps", "1", "--no-tracking"],
                        rank_prefix=without_permission_override())
    finally:
        for path in locked:
            path.chmod(0o755 if path.is_dir() else 0o644)
    first_refused = data / "train" if unreadable == "folder" else data / "train" / "airplane" / "00000.png"
    assert f"{first_refused}'" in " ".join(result.stderr.split()), result.stderr
    assert_clean_failure(result, str(data), "cannot be read by this user", "Permission denied", "chmod -R a+rX")


def test_nccl_without_gpus_is_refused(quick_args):
    result = mpirun(2, [*quick_args, "--backend", "nccl"])
    assert_clean_failure(result, "--backend nccl", "CUDA", "--backend gloo")


def test_unknown_sync_method_lists_the_choices(quick_args):
    result = mpirun(2, [*quick_args, "--sync", "telepathy"])
    assert result.returncode != 0
    assert result.stderr.count("invalid choice: 'telepathy'") == 1
    assert "gather_scatter" in result.stderr and "Traceback" not in result.stderr
    # one paragraph: not argparse's usage of every flag above it
    assert "usage:" not in result.stderr and "`python -m mpi_train train --help` lists every flag." in " ".join(
        result.stderr.split())


@pytest.mark.parametrize("flag, value", [("--backend", "mpi"), ("--dataset", "imagenet")])
def test_unknown_names_list_the_choices(flag, value):
    result = mpirun(2, ["--dataset", "synthetic", "--no-tracking", flag, value])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert " ".join(result.stderr.split()).count(f"argument {flag}: invalid choice: '{value}' (choose from") == 1


def test_an_unknown_model_lists_the_three_ways_to_name_one():
    # --model is resolved by the model registry (torchvision's names and MODULE:CALLABLE too), not by argparse
    result = mpirun(2, ["--dataset", "synthetic", "--no-tracking", "--model", "resnet9000"])
    message = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message.count("--model resnet9000 is not a model this tool knows") == 1
    assert "vgg11" in message and "resnet18" in message and "MODULE:CALLABLE" in message


@pytest.mark.parametrize("flag, value", [("--max-steps", "0"), ("--lr", "-0.1"), ("--epochs", "-1")])
def test_zero_or_negative_numbers_are_refused(quick_args, flag, value):
    result = mpirun(2, [*quick_args, flag, value])
    assert_clean_failure(result, f"{flag} must be positive, got {value}")


def test_replicas_that_drift_apart_stop_the_job_naming_the_step_and_ranks(quick_args):
    """A sync method that leaves the last rank's gradient unaveraged: the weight check must catch it."""
    result = mpirun(2, [*quick_args, "--sync", "skip_last_rank", "--check-every", "3"],
                    module="tests.rank_programs.mpi_diverging_run")
    assert_clean_failure(result, "at step 3, rank(s) [1] hold different weights from rank 0")
    result = mpirun(2, [*quick_args, "--sync", "allreduce", "--check-every", "3", "--max-steps", "6"],
                    module="tests.rank_programs.mpi_diverging_run")
    assert result.returncode == 0, result.stderr  # the same check passes a correct method


def test_an_address_rank_0_cannot_listen_on_stops_every_rank_at_once(quick_args):
    """Rank 0 alone finds --master-addr is not its own, while the others wait for the address it would send: they are
    sent its refusal instead, and every rank stops together, not after --timeout."""
    started = time.monotonic()
    result = mpirun(2, [*quick_args, "--master-addr", "192.0.2.1", "--timeout", "60"], timeout=120)
    assert_clean_failure(result, "rank 0 cannot listen for the rendezvous on '192.0.2.1'", "Pass --master-addr")
    assert result.returncode == 2 and time.monotonic() - started < 30


def test_a_hostfile_with_too_few_slots_is_refused_by_mpirun_as_the_readme_says(tmp_path, quick_args):
    """Open MPI, not us, refuses this before any rank starts; the troubleshooting table quotes its message."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    result = mpirun(2, quick_args, hostfile=hostfile, timeout=60)
    assert result.returncode != 0
    assert "There are not enough slots available" in " ".join((result.stdout + result.stderr).split())
    assert "mpi_train:" not in result.stdout + result.stderr  # no rank ever ran


def test_system_error_finds_the_os_error_behind_a_wrapper():
    """torch.save on a full disk raises a RuntimeError chained from OSError ENOSPC: the reason is the OSError's."""
    import errno

    from mpi_train.errors import system_error

    def wrapped(cause: BaseException, explicit: bool) -> BaseException:
        try:
            try:
                raise cause
            except OSError as error:
                if explicit:
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from error
                raise RuntimeError("while writing")  # an implicit chain, as C++ bindings leave it
        except RuntimeError as outer:
            return outer

    full = OSError(errno.ENOSPC, "No space left on device")
    assert system_error(wrapped(full, explicit=True)) is full and system_error(wrapped(full, explicit=False)) is full
    assert system_error(full) is full and system_error(RuntimeError("no cause")) is None
