"""The bench's table: a method that declares no collective family shows n/a, and the notes say how to fix it."""

from mpi_train.benchmark.bench_report import describe
from mpi_train.benchmark.contenders import NO_SYNC
from mpi_train.benchmark.method_costs import summarise
from mpi_train.sync import SYNC_METHODS, SyncMethod


def test_a_method_without_a_collective_family_shows_na_and_says_how_to_fix_it(monkeypatch):
    class Unmodelled(SyncMethod):
        def sync(self, model):
            pass

    monkeypatch.setitem(SYNC_METHODS, "unmodelled", Unmodelled)
    times = {name: {"compute": [1.0, 1.1, 1.0, 1.2], "sync": [0.1, 0.2, 0.1, 0.1], "step": [1.1, 1.3, 1.1, 1.3]}
             for name in (NO_SYNC, "allreduce", "unmodelled")}
    rows = summarise([times, times], 1000, 2, 1e6)
    by_name = {row["method"]: row for row in rows}
    assert by_name["unmodelled"]["sent_bytes"] is None and by_name["allreduce"]["sent_bytes"] == [1000, 1000]
    text = describe({"world_size": 2, "backend": "gloo", "model": "m", "gradient_bytes": 1000, "batch_size": 8,
                     "steps": 4, "link": {"bandwidth_bytes_per_s": 1e6, "allreduce_busbw_bytes_per_s": 1e6},
                     "methods": rows})
    line = next(l for l in text.splitlines() if l.startswith("unmodelled"))
    assert line.split()[1] == "n/a" and "unmodelled declare(s) no collective family" in text
