"""scripts/testhosts.sh refuses what it cannot do in one line, before it creates anything: a prefix that would take
another's hosts, no slots, a rate tc cannot take, a command it does not know."""

import os
import subprocess

import pytest
from conftest import REPO

SCRIPT = REPO / "scripts" / "testhosts.sh"


@pytest.mark.skipif(os.geteuid() != 0, reason="the script asks for root before anything else")
@pytest.mark.parametrize("env, args, said", [
    ({"TESTHOSTS_PREFIX": "lab1"}, ["status"], "TESTHOSTS_PREFIX 'lab1' must be 1 to 10 lower-case letters"),
    ({"TESTHOSTS_SLOTS": "0"}, ["up", "1"], "TESTHOSTS_SLOTS '0' must be a whole number of ranks per host, 1 or more"),
    ({}, ["shape", "99999999999gbit"], "rate '99999999999gbit' is above 100gbit"),
    ({}, ["shape", "1.5gbit"], "rate '1.5gbit' is not understood"),
    ({}, ["frob"], "unknown command 'frob'; the commands are:"),
])
def test_the_script_refuses_in_one_line_before_it_makes_anything(env, args, said):
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30, check=False,
                          env={**os.environ, "TESTHOSTS_PREFIX": "nohosts", **env})
    assert done.returncode in (1, 2) and said in done.stderr and done.stdout == "", done.stderr
