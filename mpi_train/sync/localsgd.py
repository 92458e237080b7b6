"""localsgd: post-local SGD; each rank steps alone and the models are averaged every --period steps."""

from __future__ import annotations

from dataclasses import replace

import torch

from .averaging import FRAGMENTED, OVERLAP, ModelAveraging, averaging_options
from .base import AccuracyCost, compressor_for

RESULTS = "docs/results.md#what-each-lossy-option-costs-in-accuracy"  # its accuracy, measured
TWO_EPOCHS = "docs/results.md#what-each-lossy-option-costs-in-accuracy"  # with its averages overlapped
TWO_LEVELS = (("host_period", 1),)  # each host's ranks averaged at every step too, as those costs were measured


class LocalSGD(ModelAveraging):
    """Local SGD (Lin, Stich, Patel, Jaggi: "Don't use large mini-batches, use local SGD", ICLR 2020), as torch's
    PostLocalSGDOptimizer with PeriodicModelAverager runs it: gradients averaged at every step for the first
    --local-start-step steps, then each rank takes its own optimizer steps and every --period H steps the ranks'
    parameters are replaced by their mean. One all-reduce of the model every H steps instead of one of the gradients
    every step: communication divided by H, at the price of the replicas drifting apart in between (logged as
    learning/drift). At H = 1 with plain SGD it is gradient averaging (`allreduce`), to float32 rounding.
    """

    traits = replace(ModelAveraging.traits, accuracy_costs={
        ("vgg11", "none"): AccuracyCost(-4.54, "localsgd --period 8, CIFAR-10, one epoch, 2 hosts x 2 ranks", RESULTS),
        ("vgg11", "fp16"): AccuracyCost(-1.39, "localsgd+fp16 --period 8 --host-period 1, CIFAR-10, one epoch, 2 hosts "
                                               "x 2 ranks", RESULTS, TWO_LEVELS),
        ("vgg11", "fp16" + OVERLAP): AccuracyCost(-3.03, "localsgd+fp16 --period 8 --host-period 1 --overlap, "
                                                         "CIFAR-10, two epochs, 2 hosts x 2 ranks", TWO_EPOCHS,
                                                  TWO_LEVELS),
        ("vgg11", "fp16" + FRAGMENTED): AccuracyCost(-1.33, "localsgd+fp16 --period 8 --host-period 1 --overlap "
                                                            "--fragments 4, CIFAR-10, two epochs, 2 hosts x 2 ranks",
                                                     TWO_EPOCHS, TWO_LEVELS),
        ("vgg11", "powersgd"): AccuracyCost(-16.88, "localsgd+powersgd --period 4, rank 2 from the first average, "
                                                    "CIFAR-10, one epoch, 2 hosts x 2 ranks", RESULTS,
                                            (("period", 4),)),
    })

    @classmethod
    def _from_config(cls, config) -> LocalSGD:
        return cls(compressor_for(cls, config), **averaging_options(config))

    def step_anchor(self, mean_change: torch.Tensor, where: slice = slice(None)) -> None:
        self.anchor[where].add_(mean_change)
