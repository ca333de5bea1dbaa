"""`BackwardOrder`: the order of an offloaded step's backward uses, modelled and observed.

The dry run has no backward to watch: it models the backward of the offload units as the
forward's uses in reverse order, each complete before the next (`DryRunOffload.train_step`), and
its device-tier figures follow from that order. The simulation runs MindSpore's real backward,
whose use hooks (`UseHooks`) record which unit's backward began when; comparing the two says
whether the dry run's figures for the model rest on an order that really holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["BackwardOrder"]


@dataclass(frozen=True)
class BackwardOrder:
    """One step's forward uses of the offload units and, where a backward ran, the order its
    uses began in (unit names).

    Attributes:
        forward: the units' forward uses, in order.
        observed: the backward's uses in the order they began (MindSpore's backward, watched by
            the use hooks); None in a dry run, where no backward runs.
    """

    forward: Tuple[str, ...]
    observed: Optional[Tuple[str, ...]]

    @property
    def modelled(self) -> Tuple[str, ...]:
        """The dry run's backward: the forward's uses in reverse order."""
        return tuple(reversed(self.forward))

    @property
    def matches(self) -> Optional[bool]:
        """Whether the observed backward used the units in the modelled order (None: not observed)."""
        return None if self.observed is None else self.observed == self.modelled

    def first_difference(self) -> Optional[int]:
        """The first position at which observed and modelled differ (None: equal or not observed)."""
        if self.matches is not False:
            return None
        pairs = zip(self.observed, self.modelled)
        return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(self.observed), len(self.modelled)))

    def to_dict(self) -> Dict:
        """The report's form: the modelled order, the observed one (None in a dry run) and whether
        they match (None: the order is the dry run's assumption, not checked)."""
        return {"modelled": list(self.modelled), "observed": None if self.observed is None else list(self.observed),
                "matches": self.matches}

    def text(self) -> str:
        """One line for the report."""
        if self.observed is None:
            return ("backward order of the offload units: assumed, the forward's uses in reverse "
                    f"({', '.join(self.modelled) or 'none'}); a dry run does not run the backward to check it")
        if self.matches:
            return (f"backward order of the offload units: observed, {len(self.observed)} uses in the reverse order "
                    "of the forward's (the order a dry run assumes)")
        i = self.first_difference()
        got = self.observed[i] if i < len(self.observed) else "(none)"
        want = self.modelled[i] if i < len(self.modelled) else "(none)"
        return (f"backward order of the offload units: observed {', '.join(self.observed)}, NOT the reverse of the "
                f"forward's uses ({', '.join(self.modelled)}; use {i}: {got} instead of {want}): a dry run of this "
                "model would model another backward, its offload figures would differ from this run's")
