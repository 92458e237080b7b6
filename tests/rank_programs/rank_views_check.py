"""Run under mpirun: what each rank's random draws look like after the start-up seeding train.run does.

Each rank seeds as a job does (the shared --seed, the model built, then its (seed, rank)
stream), then records: its model's digest, hashes of three augmented views of training
image 0 (random crop and flip) on each data path (torchvision's transforms; the resident path's batch
augmentation from its (seed, rank, epoch) generator), the file that image comes from, and the MNIST CNN's
features of a fixed input in training mode (its dropout mask decides them). Rank 0 writes every rank's
record as JSON to OUT for tests/test_randomness.py.

    mpirun -np 2 python -m tests.rank_programs.rank_views_check DATA_DIR OUT SEED
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from mpi_train.cluster import Cluster, exit_process
from mpi_train.commands.train import parse_config
from mpi_train.data import load_datasets
from mpi_train.data.augment import draw
from mpi_train.data.loaders import resident_split
from mpi_train.data.resident import augmentation_seed
from mpi_train.models import build_model
from mpi_train.randomness import seed_rank_streams
from mpi_train.train import parameter_digest, seed_everything


def tensor_hash(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()[:16]


def main(data_dir: str, out: str, seed: str) -> None:
    cluster = Cluster.from_mpi()
    config = parse_config(["--data-dir", data_dir, "--seed", seed], quiet=not cluster.info.is_main)
    train_set, _ = load_datasets(config, cluster)
    seed_everything(config.seed)
    model = build_model("mnist_cnn")
    seed_rank_streams(config.seed, cluster.info.rank)
    views = [tensor_hash(train_set[0][0]) for _ in range(3)]  # the DataLoader path: torchvision's transforms
    resident = resident_split(config, train_set, cluster, torch.device("cpu"), train=True)
    draws = draw(3, torch.Generator().manual_seed(augmentation_seed(config.seed, cluster.info.rank, 0)),
                 torch.device("cpu"))
    resident_views = [tensor_hash(view) for view in resident.batch(torch.zeros(3, dtype=torch.int64), draws)[0]]
    with torch.no_grad():  # the model is in training mode: its dropout layers draw masks
        features = model.features(torch.ones(1, 1, 28, 28))
    record = {"digest": parameter_digest(model), "views": views, "resident_views": resident_views,
              "dropout": tensor_hash(features),
              "image": train_set.samples[0][0]}
    records = cluster.gather(record)
    if cluster.info.is_main:
        Path(out).write_text(json.dumps(records))


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_process(0)
