"""The network model: what a sync method's step costs on a network of alpha-beta links.

    links.py        a link (alpha + beta·m), a network of them, rates as tc writes them
    families.py     the collective families (ring_allreduce, root, two_level, and the sharded methods' reduce_scatter,
                    layerwise_gather, ring_then_broadcast): bytes per rank, floor, time per message and per part
    memory.py       memory per rank: what a method keeps of parameters, gradients and optimizer state (its shards)
    prediction.py   a method's messages priced on a network; exposed time behind backward
    calibration.py  links timed inside a job (ping-pong), or read back from a bench JSON with the backend's
                    measured reduce-scatter and all-gather
    job.py          the prediction a training job logs beside its measured sync
"""

from .calibration import (
           calibrate,
           calibration_sizes,
           collective_costs,
           load_backward,
           load_calibration,
           network_problem,
           ping_pong,
           with_collective_costs,
)
from .families import FAMILIES, Family, bus_bandwidth, family_named, family_of, traffic_size
from .job import JobModel, bytes_sent_per_sync, job_model, layout_params
from .links import (
           ALL_GATHER,
           ALLREDUCE,
           LOOPBACK_LINK,
           REDUCE_SCATTER,
           RING_REDUCE_SCATTER,
           UNLIMITED,
           CollectiveCost,
           Link,
           Network,
           capped,
           describe_cost,
           describe_network,
           nominal_link,
           rate_bytes_per_s,
)
from .prediction import (
           ASSUMED_BACKWARD,
           Backward,
           Layout,
           PlannedMessage,
           Prediction,
           averaging_every,
           gathered_share,
           later_share,
           message_plan,
           overlapped_exposed,
           predict,
           tensor_sizes,
           tensor_units,
           wire_bytes,
           wire_ratio,
           with_codec,
)

__all__ = [
           "ALLREDUCE",
           "ALL_GATHER",
           "ASSUMED_BACKWARD",
           "FAMILIES",
           "LOOPBACK_LINK",
           "REDUCE_SCATTER",
           "RING_REDUCE_SCATTER",
           "UNLIMITED",
           "Backward",
           "CollectiveCost",
           "Family",
           "JobModel",
           "Layout",
           "Link",
           "Network",
           "PlannedMessage",
           "Prediction",
           "averaging_every",
           "bus_bandwidth",
           "bytes_sent_per_sync",
           "calibrate",
           "calibration_sizes",
           "capped",
           "collective_costs",
           "describe_cost",
           "describe_network",
           "exposed_time",
           "family_named",
           "family_of",
           "gathered_share",
           "job_model",
           "later_share",
           "layout_params",
           "load_backward",
           "load_calibration",
           "message_plan",
           "network_problem",
           "nominal_link",
           "overlapped_exposed",
           "ping_pong",
           "predict",
           "rate_bytes_per_s",
           "tensor_sizes",
           "tensor_units",
           "traffic_size",
           "wire_bytes",
           "wire_ratio",
           "with_codec",
           "with_collective_costs",
]
