"""One container fans every record out to every output, in order, and closes them all."""

from __future__ import annotations

from mpi_train.outputs import STEP, Metrics, Outputs


class Kept:
    """An output that keeps what it is given, under its own name."""

    def __init__(self, name: str, seen: list):
        self.name, self.seen = name, seen

    def log(self, metrics: Metrics, step: int) -> None:
        self.seen.append((self.name, metrics.kind, step))

    def close(self) -> None:
        self.seen.append((self.name, "closed", None))


def test_each_record_reaches_every_output_in_order_and_close_reaches_them_all():
    seen: list = []
    outputs = Outputs(Kept("console", seen), Kept("summary", seen))
    outputs.log(Metrics(kind=STEP, values={"loss": 1.0}), 3)
    outputs.close()
    assert seen == [("console", "step", 3), ("summary", "step", 3), ("console", "closed", None),
                    ("summary", "closed", None)]
