"""Each rank's share of every pass over the training set, in the seeded order both data paths follow."""

from __future__ import annotations

from torch.utils.data import DistributedSampler


class ResumableSampler(DistributedSampler):
    """A DistributedSampler whose next pass can start part-way: a resumed job skips the batches it
    already trained on by index, without loading them (loading could draw from the random state).

    Given the rank's `batch_size`, a pass whose last batch would hold a single sample leaves that sample out: a
    BatchNorm layer cannot train on one value per channel (resnet18 on 32-pixel images stops there), and every
    rank's pass is the same length, so every rank leaves it out alike."""

    skip = 0

    def __init__(self, *args, batch_size: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.left_out = int(bool(batch_size and batch_size > 1 and self.num_samples % batch_size == 1))

    def __len__(self) -> int:
        return self.num_samples - self.left_out

    def skip_next(self, samples: int) -> None:
        """Leave out the first `samples` indices of the next pass only."""
        self.skip = samples

    def next_pass(self) -> tuple[int, list[int]]:
        """The next pass's first position and all its indices, the skipped ones included (the resident path draws
        its augmentation per position); the skip is then used up."""
        start, self.skip = self.skip, 0
        return start, list(super().__iter__())[:len(self)]

    def __iter__(self):
        start, indices = self.next_pass()
        return iter(indices[start:])
