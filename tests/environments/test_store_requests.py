"""Asking a torch store whose server has died, as a rank does after rank 0 (the server, under mpirun) failed: no
answer, no wait, and none of the C++ stack trace torch prints then."""

import contextlib
import datetime
import multiprocessing
import os
import sys

import torch.distributed as dist

from mpi_train.environments.store import asked, server_answers, stderr_without_cpp_stacks


def serve(port_out) -> None:
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    port_out.put(store.port)
    port_out.get()  # until told to die; then killed


def client_of_a_server_that_dies():
    """A store client whose server's process has been killed (SIGKILL, as an injected fault does)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    server = context.Process(target=serve, args=(queue,))
    server.start()
    client = dist.TCPStore("127.0.0.1", queue.get(timeout=60), 2, is_master=False,
                           timeout=datetime.timedelta(seconds=5))
    client.set("said", "1")
    server.kill()
    server.join()
    return client


def test_a_request_to_a_dead_server_prints_a_cpp_stack_which_the_filter_keeps_off_and_lets_the_rest_through(capfd):
    client = client_of_a_server_that_dies()
    with contextlib.suppress(Exception):  # it fails: what it printed is the point
        client.get("said")
    assert "frame #" in capfd.readouterr().err  # what the job's output used to hold
    with stderr_without_cpp_stacks():
        with contextlib.suppress(Exception):
            client.get("said")
        os.write(2, b"a line of the rank's own\n")
        print("and one from Python", file=sys.stderr)
    err = capfd.readouterr().err
    assert "frame #" not in err and "c10d" not in err
    assert "a line of the rank's own\n" in err and "and one from Python\n" in err


def test_asking_a_dead_server_answers_none_at_once_and_prints_nothing(capfd):
    client = client_of_a_server_that_dies()
    assert not server_answers(client)
    assert asked(client, lambda: client.get("said")) is None
    assert capfd.readouterr().err == ""


def test_asking_a_live_server_answers(capfd):
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=5))
    store.set("step", "7")
    assert server_answers(store) and server_answers(dist.PrefixStore("attempt", store))
    assert asked(store, lambda: store.get("step")) == b"7"
