"""The experiment runner's test hosts: brought up once, links reshaped between runs, always taken down.

A thin layer over scripts/testhosts.sh (network namespaces on one machine, tc-shaped links;
see docs/network-lab.md, "Test hosts"): `TestHosts` is a context manager, so every exit path of the
sweep (the end, a failure, Ctrl-C, SIGTERM turned into KeyboardInterrupt) removes them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from .network import NetworkPlan, NetworkSetting

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; the project supports 3.10

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "testhosts.sh"
AGENT = REPO / "scripts" / "netns-agent"
# capability bits (linux/capability.h): links, addresses and tc need the first; `ip netns add` mounts, the second
NEEDED_CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}


def check_can_run(network: NetworkPlan, source: Path) -> None:
    """What stops test hosts from coming up, said before anything starts (root, ip, tc, the script)."""
    if network.max_hosts <= 1:
        return  # loopback only: nothing to create
    asks = f"{source} asks for up to {network.max_hosts} hosts ([network] hosts)"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise UserError(f"{asks}, which are network namespaces with shaped links: creating them needs root. Run the "
                        f"experiment as root (e.g. sudo -E), or set [network] hosts = [1] to stay on loopback. "
                        f"Nothing was launched.")
    if lacking := missing_capabilities():
        raise UserError(f"{asks}, which are network namespaces with shaped links, and this root process lacks "
                        f"{' and '.join(lacking)} (as in a container started without them): `ip` would be refused "
                        f"with \"Operation not permitted\". Run where root holds them (a container started with "
                        f"--cap-add NET_ADMIN --cap-add SYS_ADMIN, or --privileged), or set [network] hosts = [1] to "
                        f"stay on loopback. Nothing was launched.")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UserError(f"{asks}, but the {' and '.join(missing)} command(s) are missing. Install iproute2 "
                        f"(apt-get install iproute2), or set [network] hosts = [1]. Nothing was launched.")
    if not SCRIPT.is_file() or not AGENT.is_file():
        raise UserError(f"{asks}, but {SCRIPT} or {AGENT} is missing: run from a complete checkout of the repository. "
                        f"Nothing was launched.")


def missing_capabilities(status: Path = Path("/proc/self/status")) -> list[str]:
    """The capabilities test hosts need that this process's effective set lacks: root in a container often holds
    neither. Empty where the kernel does not say (no /proc)."""
    try:
        effective = next(int(line.split()[1], 16) for line in status.read_text().splitlines()
                         if line.startswith("CapEff:"))
    except (OSError, StopIteration, IndexError, ValueError):
        return []
    return [name for name, bit in NEEDED_CAPABILITIES.items() if not effective >> bit & 1]


class TestHosts:
    """Up to N test hosts of one prefix and subnet; `hostfile(n)` names the first n of them."""

    __test__ = False  # not a pytest class

    def __init__(self, network: NetworkPlan, folder: Path):
        self.network, self.folder = network, folder
        self.env = {**os.environ, "TESTHOSTS_PREFIX": network.prefix, "TESTHOSTS_SUBNET": network.subnet,
                    "TESTHOSTS_SLOTS": str(max(network.ranks_per_host)),
                    "TESTHOSTS_HOSTFILE": str(folder / "hostfile.testhosts")}
        self.shaped: str | None = None
        self.is_up = False

    def _script(self, *args: str) -> None:
        result = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=120,
                                check=False)
        if result.returncode:
            raise UserError(f"scripts/testhosts.sh {' '.join(args)} failed (exit {result.returncode}): "
                            f"{(result.stderr or result.stdout).strip()}")

    def check_unclaimed(self) -> None:
        """Refuse test hosts whose names or subnet are taken already (a run beside this one, test hosts brought up by
        hand, or left by a killed run): `up` would take them over and `down` remove them from under their owner,
        and a second bridge on a subnet in use sends its traffic to the first."""
        prefix, subnet = self.network.prefix, self.network.subnet
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        taken = sorted(name for name in re.findall(r"^(\S+)", names, re.MULTILINE)
                       if re.fullmatch(rf"{re.escape(prefix)}\d+", name))
        addresses = subprocess.run(["ip", "-o", "-4", "address", "show"], capture_output=True, text=True,
                                   check=False).stdout
        used = re.search(rf"^\d+:\s+(\S+)\s+inet\s+({re.escape(subnet)}\.\d+)/", addresses, re.MULTILINE)
        if taken:
            raise UserError(f"test hosts named {prefix}* exist already ({', '.join(taken[:4])}"
                            f"{', ...' if len(taken) > 4 else ''}): another run's, or yours, which this run would "
                            f"take over and remove at its end. Give another prefix ([network] prefix, or --prefix), "
                            f"or if they are left over, take them down (TESTHOSTS_PREFIX={prefix} "
                            f"TESTHOSTS_SUBNET={subnet} scripts/testhosts.sh down). Nothing was launched.")
        if used and not used.group(1).startswith(prefix):
            raise UserError(f"the subnet {subnet}.0/24 is in use here ({used.group(1)} has {used.group(2)}), and test "
                            f"hosts on it would not be reached. Give another subnet ([network] subnet, or --subnet). "
                            f"Nothing was launched.")

    def __enter__(self) -> Self:
        if self.network.max_hosts > 1:
            self.check_unclaimed()
            self.folder.mkdir(parents=True, exist_ok=True)
            print(f"network: bringing up {self.network.max_hosts} test hosts ({self.network.prefix}1.., "
                  f"{self.network.subnet}.0/24)", flush=True)
            self.is_up = True  # a failed `up` removes what it made; `down` again is harmless
            self._script("up", str(self.network.max_hosts))
        return self

    def __exit__(self, *exc) -> None:
        if self.is_up:
            try:
                self._script("down")
                print(f"network: test hosts {self.network.prefix}* taken down", flush=True)
            except (UserError, subprocess.TimeoutExpired) as error:
                print(f"network: taking the test hosts down failed ({error}); remove them with "
                      f"TESTHOSTS_PREFIX={self.network.prefix} TESTHOSTS_SUBNET={self.network.subnet} "
                      f"scripts/testhosts.sh down", flush=True)
            self.is_up = False

    def hostfile(self, hosts: int, slots: int) -> Path:
        """A hostfile with the first `hosts` test hosts, `slots` ranks each (mpirun fills the first host's slots
        first)."""
        path = self.folder / f"hostfile-{hosts}x{slots}"
        lines = [f"{self.network.subnet}.{i + 1} slots={slots}" for i in range(1, hosts + 1)]
        path.write_text("# test hosts of scripts/testhosts.sh, written by python -m mpi_train experiment\n"
                        + "\n".join(lines) + "\n")
        return path

    def apply(self, setting: NetworkSetting) -> None:
        """Shape every host's link to the setting's rate (or remove the limits), if it is not so already."""
        if setting.hosts <= 1 or setting.link == self.shaped:
            return
        if setting.link == "unlimited":
            self._script("unshape")
        else:
            self._script("shape", setting.link)
        print(f"network: every test host's link now {setting.link}", flush=True)
        self.shaped = setting.link

    def link(self, host: str, state: str) -> None:
        """Take a test host's link down or bring it up (the bridge's end of its cable), as a pulled cable would."""
        subprocess.run(["ip", "link", "set", f"{host}v", state], check=True, timeout=10)

    @staticmethod
    def launch_env(setting: NetworkSetting | None) -> dict:
        """How mpirun reaches the test hosts: the namespace agent in place of ssh."""
        return {"PRTE_MCA_plm_ssh_agent": str(AGENT)} if setting and setting.hosts > 1 else {}
