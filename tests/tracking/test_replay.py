"""`python -m mpi_train replay` on real spool files with damaged lines, sent to a real SQLite MLflow store, in one
process: every intact write arrives once, each damaged line is named, the exit status says something was lost."""

from __future__ import annotations

import json

import pytest

from mpi_train.tracking.replay import main as replay_main
from mpi_train.tracking.spool import Spool, batch_record, deliver
from mpi_train.tracking.store import mlflow_client

EXPERIMENT = "replayed"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real SQLite store (MLflow creates its tables once per module: seconds), its URI and client."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client = mlflow_client(uri)
    client.create_experiment(EXPERIMENT)
    return uri, client


def new_run(client) -> str:
    return client.create_run(client.get_experiment_by_name(EXPERIMENT).experiment_id).info.run_id


def loss_at(run_id: str, step: int) -> dict:
    from mlflow.entities import Metric

    return batch_record(run_id, [Metric("loss", 1.0 / step, 1000 * step, step)])


def losses(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "loss"))


def test_a_cut_last_line_is_named_and_every_intact_write_before_it_is_sent(store, tmp_path, capsys):
    uri, client = store
    run_id = new_run(client)
    spool = Spool(tmp_path / "job.jsonl")
    for step in (1, 2, 3):
        spool.add(loss_at(run_id, step), uri)
    intact_bytes = spool.path.stat().st_size
    with open(spool.path, "a") as handle:  # a crash (or a full disk) halfway through appending the fourth
        handle.write(json.dumps({"id": "cut", "uri": uri, **loss_at(run_id, 4)})[:60])
    assert replay_main([str(spool.path), "--tracking-uri", uri]) == 2
    assert losses(client, run_id) == [1, 2, 3]
    out, err = capsys.readouterr()
    error = " ".join(err.split())
    assert f"{spool.path}: sent 3 write(s)" in out and "Traceback" not in err and err.count("error:") == 1
    assert f"{spool.path}: line 4 (byte {intact_bytes}) is damaged" in error and "every intact write" in error
    assert f"kept as {spool.path}.damaged" in error
    assert not spool.path.exists() and not spool.acked_path.exists()
    assert (tmp_path / "job.jsonl.damaged").read_bytes()[intact_bytes:].startswith(b'{"id": "cut"')
    assert replay_main([str(tmp_path), "--tracking-uri", uri]) == 0  # set aside: not picked, nor sent, again
    assert losses(client, run_id) == [1, 2, 3]


def test_a_spool_of_another_version_is_refused_before_anything_is_sent(store, tmp_path, capsys):
    uri, client = store
    spool = Spool(tmp_path / "job.jsonl")
    spool.add({"kind": "create_run", "local_id": "offline-1", "experiment": EXPERIMENT, "start_time": 1,
               "tags": {"mpi_train.role": "job"}, "run_name": "another-version"}, uri)
    spool.add({**loss_at("offline-1", 1), "kind": "log_batch_v2"}, uri)  # once: a run left RUNNING, "run again"
    runs = len(client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id]))
    assert replay_main([str(spool.path), "--tracking-uri", uri]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert (f"{spool.path} holds a write this version cannot send: write 2 of 2 (its kind 'log_batch_v2' is none "
            f"this version writes)" in error and "Nothing was sent, and the spool is kept" in error)
    assert len(client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])) == runs
    lines = [json.loads(line) for line in spool.path.read_text().splitlines()]
    spool.path.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "local_id"}) + "\n"
                                  for line in lines[:1]))  # once: a KeyError traceback
    assert replay_main([str(spool.path), "--tracking-uri", uri]) == 2
    assert "write 1 of 1 (its create_run lacks local_id)" in " ".join(capsys.readouterr().err.split())


def test_a_cut_last_acknowledgement_sends_its_write_again_and_the_store_keeps_it_once(store, tmp_path):
    uri, client = store
    run_id = new_run(client)
    spool = Spool(tmp_path / "job.jsonl")
    for step in (1, 2):
        spool.add(loss_at(run_id, step), uri)
    first, second = spool.records()
    deliver(client, first)
    spool.acknowledge(first, None)
    deliver(client, second)  # taken by the store, and the job died writing its acknowledgement
    with open(spool.acked_path, "a") as handle:
        handle.write(json.dumps({"id": second["id"]})[:10])
    assert spool.acknowledged()[0] == {first["id"]}
    assert replay_main([str(spool.path), "--tracking-uri", uri]) == 0
    assert losses(client, run_id) == [1, 2]  # each once
    assert not spool.path.exists() and not spool.acked_path.exists()


def test_a_write_appended_after_a_cut_line_stays_whole_on_a_line_of_its_own(tmp_path):
    spool = Spool(tmp_path / "job.jsonl")
    spool.add(loss_at("run", 1), "http://127.0.0.1:5000")
    cut_at = spool.path.stat().st_size
    with open(spool.path, "a") as handle:
        handle.write('{"id": "half", "kind": "log_ba')
    spool.add(loss_at("run", 3), "http://127.0.0.1:5000")  # the guard appends the job's end after rank 0 died
    assert [record["metrics"][0]["step"] for record in spool.records()] == [1, 3]
    assert spool.damaged() == [(2, cut_at)]


def test_a_folder_where_no_job_spooled_has_nothing_to_send_but_a_named_spool_must_exist(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    assert replay_main([]) == 0
    assert capsys.readouterr().out.startswith(f"no spool to send: there is no mlruns/spool in {tmp_path}.")
    assert replay_main(["mlruns/spool"]) == 2  # named: a path that is not there is a mistake to say
    assert "mlruns/spool is neither a spool file (*.jsonl) nor a folder" in " ".join(capsys.readouterr().err.split())


def test_json_lines_that_no_job_spooled_are_left_as_they_are(tmp_path, capsys):
    """A folder named for the replay may hold a data set's .jsonl files: not sent, not set aside as damaged."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello", "label": 1}\n{"text": "world", "label": 0}\n')
    assert replay_main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{data}: not a spool (no line of it is a write a job spooled); left as it is.\n"
    assert [path.name for path in tmp_path.iterdir()] == ["train.jsonl"]


def test_a_server_that_is_down_is_named_with_the_command_that_starts_it_on_its_port(tmp_path, capsys, monkeypatch):
    import functools

    from conftest import free_port

    from mpi_train.tracking import replay

    monkeypatch.setattr(replay, "probe_server", functools.partial(replay.probe_server, timeout_s=0.5))  # not 5 s
    port = free_port()
    spool = Spool(tmp_path / "job.jsonl")
    spool.add(loss_at("some-run", 1), f"http://127.0.0.1:{port}")
    assert replay_main([str(spool.path)]) == 2  # the spool's own URI, where nothing listens
    error = " ".join(capsys.readouterr().err.split())
    assert f"No MLflow tracking server answers at http://127.0.0.1:{port}" in error
    # once `python -m mpi_train server`, which listens on 5000, not on the port the spool's job wrote to
    assert f"is kept (1 write(s) to send). Start the server (`python -m mpi_train server --host 127.0.0.1 --port " \
           f"{port}`)" in error
    assert spool.path.exists()
