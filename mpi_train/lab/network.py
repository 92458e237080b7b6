"""The lab's network settings: how many test hosts, how many ranks on each, and the rate of every host's link.

An experiment file's [network] table is a NetworkPlan (experiment_file.py reads it); each point of its
grid is a NetworkSetting, which the runner shapes the test hosts to (testhosts.py) before its runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..netmodel.links import rate_bytes_per_s

TC_RATE = re.compile(r"[0-9]+(bit|kbit|mbit|gbit)", re.IGNORECASE)  # what scripts/testhosts.sh passes on to tc
MAX_SHAPED_BYTES_S = 100e9 / 8  # 100gbit, the most it shapes


def link_error(link: str) -> str | None:
    """Why scripts/testhosts.sh cannot shape a host's link to `link` ("unlimited" leaves it be), else None."""
    try:
        rate = rate_bytes_per_s(link)
    except ValueError as error:
        return f"{error}."
    if rate is not None and (not TC_RATE.fullmatch(link) or rate > MAX_SHAPED_BYTES_S):
        return (f"{link!r} is not a rate scripts/testhosts.sh shapes: a whole number of bit, kbit, mbit or gbit per "
                f"second, up to 100gbit (1500mbit for 1.5gbit).")
    return None


def prefix_error(prefix: str) -> str | None:
    """Why test hosts cannot be named `prefix`1, `prefix`2, ..., else None."""
    if re.fullmatch(r"[a-z]([a-z0-9]{0,8}[a-z])?", prefix):
        return None
    return (f"{prefix!r} must be 1 to 10 lower-case letters and digits, beginning and ending with a letter (host i is "
            f"the prefix and i; interface names allow 15 characters).")


def subnet_error(subnet: str) -> str | None:
    """Why `subnet` names no /24 network for the test hosts, else None."""
    if re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) and all(int(x) <= 255 for x in subnet.split(".")):
        return None
    return f'{subnet!r} must be the first three numbers of a /24 network, e.g. "10.80.0".'


@dataclass(frozen=True)
class NetworkSetting:
    """One point of the [network] grid: how many hosts, ranks on each, and the rate of each host's link."""

    hosts: int
    link: str
    ranks_per_host: int

    @property
    def label(self) -> str:
        """h2x4-1gbit: 2 hosts of 4 ranks each, every link at 1 Gbit/s."""
        return f"h{self.hosts}x{self.ranks_per_host}-{self.link}"

    @property
    def slots(self) -> int:
        return self.hosts * self.ranks_per_host

    def fits(self, np: int) -> bool:
        """Whether np ranks fill exactly these hosts (mpirun fills a host's slots before the next); one host holds
        any number."""
        return (self.hosts - 1) * self.ranks_per_host < np <= self.slots if self.hosts > 1 else True


@dataclass(frozen=True)
class NetworkPlan:
    """The [network] table, checked."""

    hosts: tuple[int, ...]
    ranks_per_host: tuple[int, ...]
    links: tuple[str, ...]
    prefix: str = "mpilab"
    subnet: str = "10.80.0"

    @property
    def settings(self) -> tuple[NetworkSetting, ...]:
        """Loopback (no link to shape) for each number of ranks, then every number of test hosts with every number
        of ranks on each and every link."""
        one = tuple(NetworkSetting(1, "unlimited", r) for r in self.ranks_per_host) if 1 in self.hosts else ()
        return one + tuple(NetworkSetting(h, link, r) for h in self.hosts if h > 1 for r in self.ranks_per_host
                           for link in self.links)

    @property
    def max_hosts(self) -> int:
        return max(self.hosts)

    def holds(self, setting: NetworkSetting, np: int) -> bool:
        """Whether np ranks run on `setting`: it fits them, and no setting of the same hosts and link with fewer
        ranks per host does (np 4 on one host runs with 4 ranks per host, not with 8; on 2 hosts with 2 each)."""
        def fitting(s: NetworkSetting) -> bool:
            return s.fits(np) and (s.hosts > 1 or np <= s.slots or s.ranks_per_host == max(self.ranks_per_host))

        peers = [s for s in self.settings if (s.hosts, s.link) == (setting.hosts, setting.link) and fitting(s)]
        return bool(peers) and min(peers, key=lambda s: s.ranks_per_host) == setting
