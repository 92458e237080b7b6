"""The data: the sets torchvision reads (sets.py), an image folder of any classes and sizes (folders.py) and the
user's own (user.py), decoded once (cache.py), and served either resident on the rank's device with augmentation on
whole batches (resident.py, augment.py) or through torch's DataLoader (loaders.py picks), both in the seeded order
of sampler.py, once the ranks have found that they read the same data (same_everywhere.py)."""

from .loaders import Loaders, make_loaders
from .sampler import ResumableSampler
from .sets import NUM_CLASSES, SyntheticImages, load_datasets, synthetic_batch

__all__ = [
           "LOADERS",
           "NUM_CLASSES",
           "Loaders",
           "ResumableSampler",
           "SyntheticImages",
           "load_datasets",
           "make_loaders",
           "synthetic_batch",
]
