"""System metrics of one host (CPU, memory, network, disk), sampled by that host's first rank."""

from __future__ import annotations

import time


class HostSampler:
    """psutil numbers for one host, named like MLflow's system metrics; sampled at most every `every_s`."""

    def __init__(self, every_s: float):
        import psutil

        self.psutil, self.every_s, self.last = psutil, every_s, None
        self.net0 = psutil.net_io_counters()
        psutil.cpu_percent(interval=None)  # starts the CPU-time window

    def sample(self) -> dict:
        now = time.monotonic()
        if not self.every_s or (self.last is not None and now - self.last < self.every_s):
            return {}
        self.last = now
        memory, net, disk = self.psutil.virtual_memory(), self.psutil.net_io_counters(), self.psutil.disk_usage("/")
        return {"system": {
            "cpu_utilization_percentage": self.psutil.cpu_percent(interval=None),
            "system_memory_usage_megabytes": (memory.total - memory.available) / 1e6,
            "system_memory_usage_percentage": memory.percent,
            "network_receive_megabytes": (net.bytes_recv - self.net0.bytes_recv) / 1e6,
            "network_transmit_megabytes": (net.bytes_sent - self.net0.bytes_sent) / 1e6,
            "disk_usage_percentage": disk.percent,
            "disk_usage_megabytes": disk.used / 1e6,
            "disk_available_megabytes": disk.free / 1e6,
        }}
