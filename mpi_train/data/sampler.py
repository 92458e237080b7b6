"""Each rank's share of every pass over the training set, in the seeded order both data paths follow."""

from __future__ import annotations

from torch.utils.data import DistributedSampler


class ResumableSampler(DistributedSampler):
    """A DistributedSampler whose next pass can start part-way: a resumed job skips the batches it
    already trained on by index, without loading them (loading could draw from the random state)."""

    skip = 0

    def skip_next(self, samples: int) -> None:
        """Leave out the first `samples` indices of the next pass only."""
        self.skip = samples

    def next_pass(self) -> tuple[int, list[int]]:
        """The next pass's first position and all its indices, the skipped ones included (the resident path draws
        its augmentation per position); the skip is then used up."""
        start, self.skip = self.skip, 0
        return start, list(super().__iter__())

    def __iter__(self):
        start, indices = self.next_pass()
        return iter(indices[start:])
