"""Fields that are also command-line flags: the option dataclasses of the methods and TrainConfig declare theirs here.

A small module of its own because both sides import it: config/ composes the methods' option
classes, and a method's file must not import config/ (config/ imports the methods' registry).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field


def option(default, help, **extra):
    """A field with its CLI help attached (`choices`, `also`: choices beyond a registry's, `metavar` may be added)."""
    return field(default=default, metadata={"help": help, **extra})


def option_names(options_class) -> tuple[str, ...]:
    """The flags (field names) an option class declares, in order: the TrainConfig fields a method reads."""
    return tuple(one.name for one in dataclasses.fields(options_class))
