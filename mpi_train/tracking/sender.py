"""The batching sender: rank 0's metrics leave in one log_batch per run every few seconds, from a thread of their
own."""

from __future__ import annotations

import queue
import sys
import threading

FLUSH_EVERY_S = 2.0  # the background sender's batching period
END_TIMEOUT_S = 20.0  # how long the final flush may take before it is given up


class BatchSender:
    """A thread that sends queued metrics every few seconds with one log_batch per run (≤1000 per call).

    After each flush it calls `on_handled(n)` with the number of `put` calls handled so far, so
    the run guard can forget what no longer needs its copy.
    """

    def __init__(self, client, every_s: float = FLUSH_EVERY_S, on_handled=lambda handled: None):
        self.client, self.every_s, self.on_handled = client, every_s, on_handled
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.handled = 0
        self.stopping = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="mlflow-batch-sender", daemon=True)
        self.thread.start()

    def put(self, run_id: str, metrics: list) -> None:
        self.queue.put((run_id, metrics))  # never blocks

    def _run(self) -> None:
        while not self.stopping.wait(self.every_s):
            self.flush()
        self.flush()

    def flush(self) -> None:
        if hasattr(self.client, "retry"):  # re-send a spool once the server is back, even with nothing new to send
            self.client.retry()
        by_run: dict[str, list] = {}
        taken = 0
        while True:
            try:
                run_id, metrics = self.queue.get_nowait()
            except queue.Empty:
                break
            by_run.setdefault(run_id, []).extend(metrics)
            taken += 1
        for run_id, metrics in by_run.items():
            for start in range(0, len(metrics), 1000):
                try:
                    self.client.log_batch(run_id, metrics=metrics[start:start + 1000], synchronous=True)
                except Exception as error:  # noqa: BLE001 - tracking must never stop training
                    if self.error is None:
                        self.error = f"{type(error).__name__}: {error}"
                        print(f"mpi_train: warning: MLflow did not accept metrics ({self.error}); "
                              f"training continues.", file=sys.stderr)
        if taken:
            self.handled += taken
            self.on_handled(self.handled)

    def stop(self, timeout_s: float = END_TIMEOUT_S) -> None:
        self.stopping.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)
