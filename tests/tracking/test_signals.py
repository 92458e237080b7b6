"""The one module of signal handlers: a StopWatch hands SIGTERM to its callback off the main thread, and every
handler put in place is put back."""

import os
import signal
import threading

from mpi_train.tracking import signals


def test_a_stop_watch_hands_sigterm_to_its_callback_on_another_thread_and_puts_the_handlers_back():
    before = {number: signal.getsignal(number) for number in signals.STOPPING}
    heard, threads = [], []
    done = threading.Event()

    def on_signal(number):
        heard.append(number)
        threads.append(threading.current_thread())
        done.set()

    watch = signals.StopWatch(on_signal)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert done.wait(10)
    finally:
        watch.release()
    watch.thread.join(10)
    assert heard == [signal.SIGTERM] and threads[0] is not threading.main_thread()
    assert not watch.thread.is_alive()
    assert {number: signal.getsignal(number) for number in signals.STOPPING} == before


def test_install_returns_what_restore_puts_back():
    def noted(number, frame):
        received.append(number)

    received = []
    before = signal.getsignal(signals.REQUEUE)
    previous = signals.install((signals.REQUEUE,), noted)
    try:
        os.kill(os.getpid(), signals.REQUEUE)
        assert received == [signals.REQUEUE]
    finally:
        signals.restore(previous)
    assert signal.getsignal(signals.REQUEUE) == before
    assert signals.name(signals.TERMINATE) == "SIGTERM"
