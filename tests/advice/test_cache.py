"""Advice files and --sync auto: the newest advice that fits a job, its reused calibration, the flags it sets, and
the errors that say what to run when none fits."""

import json
from types import SimpleNamespace

import pytest

from mpi_train.advice import cache
from mpi_train.advice.cache import Setting
from mpi_train.commands.train import parse_config
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError

HOSTS = ("h1", "h1", "h2", "h2")
LINK = {"alpha": 1e-4, "beta": 1e-8}


def advice(setting: Setting, created_s: float, flags=("--sync", "bucketed", "--bucket-mb", "8"), link=None) -> dict:
    """The fields an advice holds that --sync auto and a later advise read."""
    return {"kind": cache.KIND, "version": cache.VERSION, "created": "then", "created_s": created_s,
            "hosts": list(setting.hosts), "world_size": setting.world_size, "model": setting.model,
            "batch_size": setting.batch_size, "link": link,
            "calibration": {"network": {"intra": LINK, "inter": LINK}, "measured_at_s": created_s - 5},
            "recommended": {"label": "x", "flags": list(flags), "why": "because", "predicted_step_s": 1.0,
                            "measured_step_s": 1.1}}


def keep(folder, setting: Setting, created_s: float, **options):
    return cache.write(setting.path(folder, created_s), advice(setting, created_s, **options))


def job(*args: str) -> TrainConfig:
    return parse_config(["--dataset", "synthetic", "--batch-size", "64", *args], quiet=True)


def test_the_newest_advice_for_the_same_setting_is_followed(tmp_path):
    mine = Setting(HOSTS, "mnist_cnn", 64)
    keep(tmp_path, mine, 1000.0, flags=("--sync", "flat"))
    newest = keep(tmp_path, mine, 2000.0)
    keep(tmp_path, Setting(HOSTS, "mnist_cnn", 128), 3000.0, flags=("--sync", "ring"))  # another batch
    keep(tmp_path, Setting(("h1", "h2", "h3", "h4"), "mnist_cnn", 64), 4000.0, flags=("--sync", "ring"))  # other hosts
    (tmp_path / "notes.json").write_text(json.dumps({"kind": "something else"}))  # a stray file is no advice
    pick = cache.follow(job("--sync", "auto", "--advice", str(tmp_path)), HOSTS, now=2600.0)
    assert pick["file"] == str(newest) and pick["age_s"] == 600.0 and pick["note"] is None
    config = cache.applied(job("--sync", "auto"), pick)
    assert (config.sync, config.bucket_mb, config.advice) == ("bucketed", 8.0, str(newest))
    assert "--sync auto runs --sync bucketed --bucket-mb 8, as the advice" in cache.described(pick)
    assert "(10 min old) recommends: predicted 1,000 ms, measured 1,100 ms per step. because" in cache.described(pick)


def test_a_later_advise_reuses_the_calibration_of_the_same_hosts_and_link(tmp_path):
    keep(tmp_path, Setting(HOSTS, "vgg11", 256), 1000.0, link="100mbit")
    reused = keep(tmp_path, Setting(HOSTS, "mnist_cnn", 64), 2000.0, link="100mbit")  # any model and batch
    keep(tmp_path, Setting(HOSTS, "vgg11", 256), 3000.0, link="1gbit")
    assert cache.reusable_calibration(tmp_path, HOSTS, "100mbit")[0] == reused
    assert cache.reusable_calibration(tmp_path, HOSTS, None) is None
    assert cache.reusable_calibration(tmp_path, ("h1",) * 4, "100mbit") is None
    assert cache.age(45) == "45 s" and cache.age(3 * 3600 + 12 * 60) == "3 h 12 min" and cache.age(2 * 86400) == \
        "2 days 0 h"


def test_no_fitting_advice_says_what_to_run(tmp_path):
    keep(tmp_path, Setting(HOSTS, "vgg11", 256), 1000.0)
    with pytest.raises(UserError) as error:
        cache.follow(job("--sync", "auto", "--advice", str(tmp_path)), HOSTS)
    message = str(error.value)
    assert f"no advice for this job (mnist_cnn, batch 64, 4 rank(s) on h1 (2), h2 (2)) in {tmp_path}/" in message
    assert "it holds advice for: vgg11, batch 256, 4 rank(s) on h1 (2), h2 (2)" in message
    assert ("mpirun -np 4 --hostfile HOSTFILE python -m mpi_train advise --model mnist_cnn --batch-size 64"
            in message) and "--sync ddp" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty/, which holds none"):
        cache.follow(job("--sync", "auto", "--advice", str(tmp_path / "empty")), HOSTS)


@pytest.mark.parametrize("args, words", [
    (["--compression", "fp16"], "--sync auto picks a lossless method"),
    (["--advice", "/nonexistent/advice.json"], "--advice /nonexistent/advice.json does not exist"),
])
def test_auto_refuses_what_it_cannot_follow(tmp_path, args, words):
    with pytest.raises(UserError, match=words):
        cache.follow(job("--sync", "auto", *args), HOSTS)


def test_an_advice_named_for_another_setting_is_refused_and_other_hosts_only_noted(tmp_path):
    other_model = keep(tmp_path, Setting(HOSTS, "vgg11", 64), 1000.0)
    with pytest.raises(UserError, match=r"made for another setting: model vgg11 \(this job: mnist_cnn\)"):
        cache.follow(job("--sync", "auto", "--advice", str(other_model)), HOSTS)
    other_hosts = keep(tmp_path, Setting(("a", "a", "b", "b"), "mnist_cnn", 64), 1000.0)
    pick = cache.follow(job("--sync", "auto", "--advice", str(other_hosts)), HOSTS, now=1000.0)
    assert pick["note"] == "made for hosts a, b (this job: h1, h2): followed as --advice asks"
    (tmp_path / "bad.json").write_text(json.dumps(advice(Setting(HOSTS, "mnist_cnn", 64), 1.0,
                                                         flags=("--sink", "flat"))))
    with pytest.raises(UserError, match="recommends --sink 'flat', and an advice sets --sync and --bucket-mb only"):
        cache.applied(job("--sync", "auto"), cache.follow(job("--sync", "auto", "--advice", str(tmp_path / "bad.json")),
                                                          HOSTS))


@pytest.mark.parametrize("flags, said", [
    (("--sync", "ddp", "--max-steps", "1", "--lr", "5"), "recommends --max-steps '1', and an advice sets --sync and"),
    (("--sync", "localsgd"), "recommends --sync 'localsgd', which is not one of this version's lossless methods"),
    (("--sync", "bucketed", "--bucket-mb", "0"), "recommends --bucket-mb '0', which is not a size in MB above 0"),
])
def test_an_advice_sets_a_lossless_method_and_its_bucket_size_and_nothing_else(tmp_path, flags, said):
    """An edited advice once set any option (--lr 5, --max-steps 1) over the user's own flags, and a lossy method."""
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(advice(Setting(HOSTS, "mnist_cnn", 64), 1.0, flags=flags)))
    with pytest.raises(UserError, match=said):
        cache.applied(job("--sync", "auto"), cache.follow(job("--sync", "auto", "--advice", str(path)), HOSTS))


@pytest.mark.parametrize("edit, said", [
    ({"created_s": "yesterday"}, "its created_s 'yesterday' is no time"),
    ({"batch_size": "64"}, "its batch_size '64' is not a whole number above 0"),
    ({"world_size": "4"}, "its world_size '4' does not count its hosts"),
    ({"hosts": None}, "its hosts None are not a list of host names"),
    ({"version": 99}, "its version 99 is newer than this one's"),
    ({"calibration": {"network": {"intra": LINK, "inter": {"alpha": 0, "beta": "x"}}}},
     "its inter-host link has alpha"),
])
def test_a_damaged_advice_is_named_when_given_and_passed_over_in_a_folder(tmp_path, edit, said):
    """Each once broke --sync auto or advise with a traceback, for the whole folder it lay in, or compared '64' with
    64 and called them different."""
    mine = Setting(HOSTS, "mnist_cnn", 64)
    good = keep(tmp_path, mine, 1000.0)
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps({**advice(mine, 2000.0), **edit}))
    with pytest.raises(UserError, match=f"the advice {damaged} cannot be used: {said}"):
        cache.follow(job("--sync", "auto", "--advice", str(damaged)), HOSTS)
    assert cache.follow(job("--sync", "auto", "--advice", str(tmp_path)), HOSTS)["file"] == str(good)
    assert cache.reusable_calibration(tmp_path, HOSTS, None)[0] == good


def test_an_advice_fits_a_jobs_precision_as_given_or_as_it_ran(tmp_path):
    def made(precision_flag: str, ran: str, created_s: float, sync: str):
        data = advice(Setting(HOSTS, "mnist_cnn", 64, precision_flag), created_s, flags=("--sync", sync))
        kept = cache.write(Setting(HOSTS, "mnist_cnn", 64, precision_flag).path(tmp_path, created_s),
                           {**data, "precision_flag": precision_flag, "precision": ran})
        return str(kept)

    auto = made("auto", "bf16-mixed", 1000.0, "flat")  # auto ran bf16-mixed on these hosts' GPUs
    full = made("32-true", "32-true", 2000.0, "ring")
    assert cache.follow(job("--sync", "auto", "--advice", str(tmp_path)), HOSTS)["file"] == auto  # auto: auto's
    assert cache.follow(job("--sync", "auto", "--advice", str(tmp_path), "--precision", "bf16-mixed"),
                        HOSTS)["file"] == auto  # what auto ran
    assert cache.follow(job("--sync", "auto", "--advice", str(tmp_path), "--precision", "32-true"),
                        HOSTS)["file"] == full
    with pytest.raises(UserError) as error:
        cache.follow(job("--sync", "auto", "--advice", str(tmp_path), "--precision", "16-mixed"), HOSTS)
    assert ("no advice for this job (mnist_cnn, batch 64, --precision 16-mixed, 4 rank(s) on h1 (2), h2 (2))"
            in str(error.value) and "--batch-size 64 --precision 16-mixed (with --advice-dir" in str(error.value))
    assert "mnist_cnn, batch 64, --precision 32-true, 4 rank(s)" in str(error.value)  # what the folder holds
    with pytest.raises(UserError, match=r"another setting: --precision auto, which ran bf16-mixed \(this job: "
                                        r"--precision 32-true\)"):
        cache.follow(job("--sync", "auto", "--advice", auto, "--precision", "32-true"), HOSTS)


def test_resolve_takes_rank_0s_pick_and_leaves_other_jobs_alone(tmp_path):
    cluster = SimpleNamespace(info=SimpleNamespace(is_main=True), hosts=HOSTS, bcast=lambda value: value)
    kept = keep(tmp_path, Setting(HOSTS, "mnist_cnn", 64), 1000.0)
    config, pick = cache.resolve(job("--sync", "auto", "--advice", str(tmp_path)), cluster)
    assert config.sync == "bucketed" and pick["file"] == str(kept)
    assert cache.resolve(job("--sync", "ring"), cluster) == (job("--sync", "ring"), None)
    with pytest.raises(UserError, match="--advice is read by --sync auto only"):
        cache.resolve(job("--sync", "ring", "--advice", str(kept)), cluster)
    with pytest.raises(UserError, match="no advice for this job"):  # every rank raises rank 0's error
        cache.resolve(job("--sync", "auto", "--advice", str(tmp_path), "--batch-size", "32"), cluster)


def test_the_command_line_takes_auto_and_no_other_word():
    assert job("--sync", "auto").sync == "auto"
    with pytest.raises(SystemExit):
        job("--sync", "automatic")
