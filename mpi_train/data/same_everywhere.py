"""Every rank must read the same data set, and each host reads its own copy (or runs the user's load()).

A rank's shard is its share of one seeded order of the training samples, so ranks whose copies differ in length take
different numbers of steps: the rank with more waits at a step's allreduce that the others never start, until
--timeout ends the job with an error about a slow rank. Copies of the same length whose files differ (or whose classes
do) would train silently on data no rank agrees on. So each rank says what it read (its splits' lengths, and for
an image folder its classes and files by name, for the user's data set its classes and image shape), and the job is
refused before any work when the ranks differ, naming who read what.
"""

from __future__ import annotations

import hashlib
import os

from torch.utils.data import Dataset

from ..cluster import Cluster, disagreement
from ..errors import UserError


def what_was_read(train: Dataset, test: Dataset) -> dict[str, object]:
    """What a rank compares with the others: each split's length, and what a split carries of its classes, files
    and shape (names relative to the split's folder, so that copies at other paths compare alike)."""
    read: dict[str, object] = {"training samples": len(train), "test samples": len(test)}
    for name, split in (("training", train), ("test", test)):
        if hasattr(split, "samples") and hasattr(split, "root"):  # an image folder: its paths begin with its root
            skip = len(os.path.join(split.root, ""))
            names = "\n".join(f"{path[skip:]}\0{label}" for path, label in split.samples)
            read[f"{name} file names (hashed)"] = hashlib.sha256(names.encode()).hexdigest()[:12]
    for attribute, name in (("classes", "classes"), ("num_classes", "classes"), ("shape", "image shape")):
        value = getattr(train, attribute, None)
        if value is not None:
            read[name] = len(value) if isinstance(value, list) else value
    return read


def check_same_everywhere(dataset: str, train: Dataset, test: Dataset, cluster: Cluster) -> None:
    """Refuse, on every rank alike, a job whose ranks read different data. Collective (one allgather)."""
    if cluster.info.world_size == 1:
        return
    differences = disagreement(cluster.allgather(what_was_read(train, test)), cluster.hosts)
    if differences is None:
        return
    fix = ("Make load() return the same data sets on every rank (each rank calls it; seed any randomness alike)"
           if ":" in dataset else
           "Give every host the same copy of --data-dir (copy it from one host to the others, rsync -a say), or point "
           "--data-dir at a folder every host shares")
    raise UserError(f"the ranks read different {dataset} data ({differences}). Every rank must train on the same "
                    f"data set: each takes its share of one order of the samples, and a rank with more steps than the "
                    f"others would wait for them until --timeout. {fix}, then run again.")
