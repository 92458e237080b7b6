"""Job files (--config FILE.toml): read and checked as the flags are, logged back, and below the flags."""

import dataclasses

import pytest

from mpi_train.commands.train import parse_config
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError

# A job file (--config): the same keys as an experiment file's [train] table, logged by every tracked run -----------

def job_options(text: str) -> dict:
    from mpi_train.config import parse_job_file

    return parse_job_file(text, "job.toml")


def test_a_job_file_sets_options_by_name_an_integer_standing_for_a_float():
    options = job_options('sync = "bucketed"\nbucket_mb = 4\noverlap = false\nmodel = "gpt"  # a comment\n')
    assert options == {"sync": "bucketed", "bucket_mb": 4.0, "overlap": False, "model": "gpt"}
    assert isinstance(options["bucket_mb"], float)


def test_an_unknown_key_is_refused_naming_the_nearest_one():
    with pytest.raises(UserError) as refused:
        job_options('sync = "localsgd"\n\noverlapp = true\n')
    assert str(refused.value).startswith("job.toml, line 3, key overlapp: unknown key 'overlapp'. Did you mean "
                                         "'overlap'?")
    assert "train --help" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("text,message", [
    ('seed = 1\nbatch_size = "256"\n', "job.toml, line 2, key batch_size: must be an integer, got a string ('256')."),
    ("lr = true\n", "job.toml, line 1, key lr: must be a number, got a boolean (True)."),
    ("overlap = 1\n", "job.toml, line 1, key overlap: must be true or false, got an integer (1)."),
    ("[sync]\nname = 1\n", ("job.toml, line 1, key sync: [sync] is a table, and a job file holds no tables: write "
                           "its options at the top level, without the [sync] line")),
    ('seed = 1\n[train]\nlr = 0.1\n', "job.toml, line 2, key train: [train] is a table"),  # an experiment file's
    # a whole experiment file: once told to move its [experiment] options to the top level, which failed next
    ('[experiment]\nname = "e"\n[[sweep]]\nsync = "all"\n',
     ("job.toml, line 1, key experiment: [experiment] is an experiment file's table, and --config takes a job file")),
    ('sync = "bucketd"\n', "job.toml, line 1, key sync: 'bucketd' is not one of "),
])
def test_a_wrong_type_or_value_is_refused_naming_the_key(text, message):
    with pytest.raises(UserError) as refused:
        job_options(text)
    assert str(refused.value).startswith(message)
    if "bucketd" in text:  # a choice: the flag's own, --sync auto included, and the nearest
        assert "auto" in str(refused.value) and str(refused.value).endswith("Did you mean 'bucketed'?")


def test_a_number_out_of_range_in_a_job_file_is_refused_at_its_line_unless_a_flag_replaces_it(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('seed = 1\nbatch_size = -8\nlr = nan\n')  # once "--batch-size must be positive": no file, no line
    with pytest.raises(UserError, match=r"job\.toml, line 3, key lr: --lr must be a finite number, got nan"):
        parse_config(["--config", str(job)])
    with pytest.raises(UserError, match=r"job\.toml, line 2, key batch_size: --batch-size must be positive, got -8"):
        parse_config(["--config", str(job), "--lr", "0.1"])
    assert parse_config(["--config", str(job), "--batch-size", "64", "--lr", "0.1"]).batch_size == 64


def test_a_job_file_that_is_not_toml_names_its_line():
    with pytest.raises(UserError, match=r"^job\.toml, line 2: this is not valid TOML: .*https://toml\.io"):
        job_options("seed = 1\nsync = bucketed\n")


def test_an_unreadable_job_file_is_refused_with_the_reason(tmp_path):
    from mpi_train.config import read_job_file

    with pytest.raises(UserError, match=r"cannot read the job file .*missing\.toml \(--config\): No such file"):
        read_job_file(str(tmp_path / "missing.toml"))
    (tmp_path / "latin1.toml").write_bytes(b'run_name = "caf\xe9"\n')
    with pytest.raises(UserError, match="it is not UTF-8 text"):
        read_job_file(str(tmp_path / "latin1.toml"))
    # saved by an editor that starts UTF-8 with a byte-order mark, which TOML's parser calls an invalid statement
    (tmp_path / "bom.toml").write_bytes(b'\xef\xbb\xbfsync = "ddp"\n')
    assert job_options(read_job_file(str(tmp_path / "bom.toml"))) == {"sync": "ddp"}


def test_the_logged_job_file_reads_back_to_the_same_job_but_its_outputs_and_whereabouts():
    from mpi_train.config import JOB_FILE_LEAVES_OUT, job_file

    config = TrainConfig(sync="bucketed", bucket_mb=0.1 + 0.2, dataset="synthetic", lr=1 / 3, seed=7, overlap=False,
                         dropout=0.0, run_name='a "quoted" \\ name\x7f é', summary_json="out.json",
                         checkpoint_dir="ckpt", checkpoint_every=2, resume="auto",
                         tracking_uri="http://alice:pw@host:5000", master_addr="10.0.0.1", timeline_dir="t")
    text = job_file(config, 4)
    assert "mpirun -np 4 python -m mpi_train --config config.toml" in text and "pw" not in text
    read = TrainConfig(**job_options(text))
    assert read.bucket_mb == 0.1 + 0.2 and read.lr == 1 / 3 and read.run_name == config.run_name  # to the last bit
    # the model and its optimizer's settings as the job resolved them; paths and the rendezvous left out
    # (and the synthetic data set's size)
    resolved = (read.model, read.optimizer, read.momentum, read.warmup_steps, read.synthetic_size)
    assert resolved == ("mnist_cnn", "sgd", 0.9, 40, 4096)
    for name, value in dataclasses.asdict(TrainConfig()).items():
        if name in JOB_FILE_LEAVES_OUT:
            assert getattr(read, name) == value, name
        elif name not in ("model", "optimizer", "momentum", "weight_decay", "warmup_steps", "synthetic_size"):
            assert getattr(read, name) == getattr(config, name), name
    assert set(JOB_FILE_LEAVES_OUT) == {"summary_json", "timeline_dir", "checkpoint_dir", "checkpoint_every", "resume",
                                        "reshard", "advice", "tracking_uri", "master_addr"}


# The job file on the command line: flags > file > environment > defaults --------------------------------------------

@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('sync = "ring"\nbatch_size = 128\nseed = 7\ntracking_uri = "http://file:5000"\n')
    return str(path)


def test_flags_override_the_job_file_which_overrides_the_environment_and_the_defaults(job_file, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://environment:5000")
    config = parse_config(["--config", job_file, "--seed", "3"])
    assert (config.sync, config.batch_size) == ("ring", 128)  # the file's, over the defaults
    assert config.seed == 3  # the flag's, over the file's
    assert config.tracking_uri == "http://file:5000"  # the file's, over the environment's
    assert config.lr is TrainConfig.lr and config.epochs == TrainConfig.epochs  # neither says: the defaults
    flagged = parse_config(["--tracking-uri", "http://flag:5000", "--config", job_file])  # wherever the flag is
    assert flagged.tracking_uri == "http://flag:5000" and flagged.seed == 7
    assert parse_config(["--sync", "ring"]).tracking_uri == "http://environment:5000"  # no file: the environment


def test_a_flag_first_runs_train_with_the_job_file():
    from mpi_train.cli import split

    assert split(["--config", "job.toml"]) == ("train", ["--config", "job.toml"])


def test_a_mistake_in_the_job_file_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("batch_sise = 128\n")
    with pytest.raises(UserError, match=r"bad\.toml, line 1, key batch_sise: unknown key .* Did you mean 'batch_size'"):
        parse_config(["--config", str(bad)])
    with pytest.raises(UserError, match="cannot read the job file"):
        parse_config(["--config", str(tmp_path / "none.toml")])


def test_a_leading_tilde_in_a_path_is_the_home_folder_from_a_file_or_a_flag(tmp_path, monkeypatch):
    """A shell expands ~ in `--data-dir ~/x` but not in a job file, nor in `--checkpoint-dir=~/ck`: a folder named ~
    in the working folder was made, which `rm -rf ~` would then take for the home."""
    monkeypatch.setenv("HOME", str(tmp_path))
    job = tmp_path / "job.toml"
    job.write_text('checkpoint_dir = "~/ck"\ndata_dir = "~/data"\n')
    config = parse_config(["--config", str(job), "--summary-json=~/out/summary.json"])
    assert (config.checkpoint_dir, config.data_dir) == (f"{tmp_path}/ck", f"{tmp_path}/data")
    assert config.summary_json == f"{tmp_path}/out/summary.json" and config.timeline_folder == "timelines"
    assert parse_config(["--run-name", "~x"]).run_name == "~x"  # a name, not a path
    assert parse_config(["--config=~/job.toml"]).checkpoint_dir == f"{tmp_path}/ck"  # the file's own name too
