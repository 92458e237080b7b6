"""The course's two convnets: VGG-11 for CIFAR-10 and the classic MNIST CNN, each also built for other images (an
image folder's): any channels, and a size their layers can take."""

from __future__ import annotations

from torch import nn

VGG11_LAYERS = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def vgg11(num_classes: int = 10, in_channels: int = 3, dropout: float | None = None,
          size: tuple[int, int] = (32, 32)) -> nn.Module:
    """VGG-11 with BatchNorm for 32x32 inputs: 9,231,114 parameters. It has no dropout. Other sizes (32 and larger)
    end in a global average pool, so its classifier stays 512 wide; 32x32 keeps the layers (and checkpoints) as they
    are, its features being 1x1 already."""
    layers: list[nn.Module] = []
    channels = in_channels
    for spec in VGG11_LAYERS:
        if spec == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, spec, 3, padding=1), nn.BatchNorm2d(spec), nn.ReLU(inplace=True)]
            channels = spec
    pool = [nn.AdaptiveAvgPool2d(1)] if tuple(size) != (32, 32) else []
    return nn.Sequential(*layers, *pool, nn.Flatten(), nn.Linear(512, num_classes))


class MnistCNN(nn.Module):
    """The classic PyTorch MNIST example net (two convs, two dropouts, two linears): 1,199,882 parameters at 28x28.
    Other sizes widen its first linear layer to what the convolutions leave (64 x (h - 4) / 2 x (w - 4) / 2)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, dropout: float | None = None,
                 size: tuple[int, int] = (28, 28)):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(0.25 if dropout is None else dropout), nn.Flatten(),
        )
        left = max(1, (size[0] - 4) // 2) * max(1, (size[1] - 4) // 2)  # below 6x6 its convolutions refuse the images
        self.classifier = nn.Sequential(
            nn.Linear(64 * left, 128), nn.ReLU(), nn.Dropout(0.5 if dropout is None else dropout),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


INPUT_SHAPES = {"vgg11": (3, 32, 32), "mnist_cnn": (1, 28, 28)}  # (channels, height, width) each model expects
