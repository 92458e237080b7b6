"""The options of the methods that sync less often (localsgd, diloco): their flags, defaults and checks.

A module apart from averaging.py, which runs them, so that TrainConfig (config/) and the
methods read one declaration.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from .flag_fields import option, option_names

STREAMED_COMPRESSIONS = ("none", "fp16", "bf16")  # what --overlap and --fragments carry: elementwise casts
MOMENTUM = ("keep", "average", "reset")  # --local-momentum: what an average does to the optimizer's state
DEFAULT_PERIOD = 8

# what each averaging flag left unset means
UNSET_AVERAGING = {"period": DEFAULT_PERIOD, "local_start_step": 0, "host_period": 0, "local_momentum": "keep",
                   "overlap": False, "fragments": 1}


@dataclass(frozen=True)
class AveragingOptions:
    """The flags of the methods that sync less often (localsgd, diloco; TrainConfig composes it). They default to
    None, so a job can tell a flag given from one left to the method's default (UNSET_AVERAGING)."""

    period: int | None = option(None, f"localsgd, diloco: optimizer steps between two averages of the ranks' models "
                                f"(default {DEFAULT_PERIOD})", metavar="H")
    local_start_step: int | None = option(None, "localsgd, diloco: steps of plain gradient averaging before the ranks "
                                          "step alone (post-local SGD; default 0)")
    host_period: int | None = option(None, "localsgd, diloco across hosts: also average the models of each host's "
                                     "ranks every this many steps, over their local link (two levels; default 0: off)")
    local_momentum: str | None = option(None, "localsgd, diloco: what an average does to each rank's optimizer "
                                        "state (SGD's momentum, AdamW's moments): keep it (default), average it too "
                                        "(as many bytes again) or reset it", choices=MOMENTUM)
    overlap: bool = option(False, "localsgd, diloco: send each average in the background while the next period "
                           "computes, and merge it one period late as a correction (the rank keeps its own progress "
                           "since); the job waits only for a sum not yet arrived at its merge, and at its end "
                           "(docs/sync-methods.md)")
    fragments: int | None = option(None, "localsgd, diloco: cut the model into F element-strided fragments and "
                                   "average one every --period/F steps, an even load on the link instead of a burst "
                                   "(default 1; F must divide --period)", metavar="F")

    def averaging_settings(self) -> dict:
        """Each averaging flag as the method runs it: given, or its default."""
        given = {name: getattr(self, name) for name in option_names(AveragingOptions)}
        return {name: UNSET_AVERAGING[name] if value is None else value for name, value in given.items()}

    def check_averaging(self, compression: str | None = None) -> None:
        """Values no averaging can run, refused before any work starts; `compression` is the job's --compression
        (by default the composing TrainConfig's own)."""
        compression = self.compression if compression is None else compression
        if self.period is not None and self.period < 1:
            raise UserError(f"--period must be at least 1 (average every step), got {self.period}.")
        for flag, value in {"--local-start-step": self.local_start_step, "--host-period": self.host_period}.items():
            if value is not None and value < 0:
                raise UserError(f"{flag} must not be negative, got {value}.")
        period = self.averaging_settings()["period"]
        if self.host_period and self.host_period >= period:
            raise UserError(f"--host-period {self.host_period} must be shorter than --period {period}: the ranks of a "
                            f"host average among themselves between the averages of all ranks. Use a smaller "
                            f"--host-period, or raise --period.")
        self.check_streaming(period, compression)

    def check_streaming(self, period: int, compression: str) -> None:
        """--fragments and --overlap: a fragment count that divides the period, and what their schedule carries."""
        fragments = self.averaging_settings()["fragments"]
        if fragments < 1:
            raise UserError(f"--fragments must be at least 1 (1: the whole model at once), got {fragments}.")
        if period % fragments:
            divisors = [d for d in range(1, period + 1) if period % d == 0]
            raise UserError(f"--fragments {fragments} must divide --period {period}: one fragment is averaged every "
                            f"period/F steps, and each once per period. Use one of {', '.join(map(str, divisors))}, "
                            f"or a --period that is a multiple of {fragments}.")
        if not (self.overlap or fragments > 1):
            return
        flags = " ".join(flag for flag, on in (("--overlap", self.overlap), (f"--fragments {fragments}", fragments > 1))
                         if on)
        if self.local_momentum not in (None, "keep"):
            raise UserError(f"--local-momentum {self.local_momentum} with {flags}: averaging or resetting the momentum "
                            f"happens at an average of the whole model, which {flags} no longer has. Drop "
                            f"--local-momentum (each rank keeps its own), or drop {flags}.")
        if compression not in STREAMED_COMPRESSIONS:
            raise UserError(f"--compression {compression} with {flags}: a fragment (element-strided) or a sum in "
                            f"the background carries elementwise casts only, not {compression}'s per-matrix "
                            f"rounds. "
                            f"Use --compression {', '.join(c for c in STREAMED_COMPRESSIONS if c != 'none')} or none "
                            f"with {flags}.")
