"""torchvision's classification models, by their registry names (resnet18, resnet50, mobilenet_v3_small, ...),
built untrained for the data set's classes."""

from __future__ import annotations

from torch import nn

AUX_LOGITS = ("googlenet", "inception_v3")  # built without their auxiliary heads, which return a tuple in training


def names() -> list[str]:
    """Every classification model torchvision knows (not its detection, segmentation or video models)."""
    from torchvision import models  # here, not at the top: a second of import that jobs on built-in models skip

    return models.list_models(module=models)


def build(name: str, num_classes: int) -> nn.Module:
    from torchvision import models  # here, not at the top: as in names()

    options = {"aux_logits": False, "init_weights": True} if name in AUX_LOGITS else {}
    return models.get_model(name, weights=None, num_classes=num_classes, **options)
