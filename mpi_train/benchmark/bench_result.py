"""The bench's JSON: every figure it measured, with the setting it measured them in (what `python -m mpi_train
predict --calibration` and a training job's --calibration read back)."""

from __future__ import annotations

import argparse

from .. import netmodel
from ..cluster import Cluster
from ..config import TrainConfig, model_flags
from ..devices import Placement
from .contenders import Contender, gradient_bytes
from .measure import pooled_backward
from .method_costs import ModelInputs, summarise


def model_inputs(calibration: dict, layout: netmodel.Layout, model, bucket_mb: float,
                 backward: netmodel.Backward) -> ModelInputs:
    """The alpha-beta model's inputs: the calibrated links with the sharded collectives priced as they ran here,
    and the model's tensors."""
    network = netmodel.with_collective_costs(netmodel.Network.from_dict(calibration["network"]), calibration, layout)
    return ModelInputs(network=network, layout=layout, tensor_bytes=tuple(netmodel.tensor_sizes(model)),
                       bucket_mb=bucket_mb, backward=backward, units=tuple(netmodel.tensor_units(model)))


def bench_result(args: argparse.Namespace, *, cluster: Cluster, placement: Placement, precision: str,
                 settings: TrainConfig, entries: list[Contender], unavailable: list, calibration: dict | None,
                 link: dict, traffic: tuple[dict, dict], per_rank: list[dict], order: tuple | None) -> dict:
    """Rank 0: the bench's figures; the backward profile of every rank's no-sync steps joins the calibration."""
    world, model = cluster.info.world_size, entries[0].model
    layout = netmodel.Layout.of_hosts(list(cluster.hosts))
    backward = pooled_backward(per_rank, order)
    inputs = None
    if calibration:
        calibration["backward"] = backward.as_dict()  # a training job's or predict's --calibration reads it
        inputs = model_inputs(calibration, layout, model, args.bucket_mb, backward)
    sent, later = traffic
    return {
        "world_size": world, "backend": placement.backend, "model": args.model,
        "model_described": settings.describe_model(), "precision": precision,
        "model_flags": model_flags(args), "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
        "threads": placement.threads, "gradient_bytes": gradient_bytes(model),
        "link": link, "hosts": list(cluster.hosts), "unavailable": unavailable,
        "layout": {"hosts": layout.hosts, "ranks_per_host": layout.ranks_per_host, "host_of_rank": list(cluster.hosts)},
        "network_link": args.link, "bucket_mb": args.bucket_mb, "calibration": calibration,
        "methods": summarise(per_rank, gradient_bytes(model), world, link["bandwidth_bytes_per_s"], sent,
                             cluster.hosts, inputs, later, precision),
        "per_rank_times": per_rank,
    }
