"""What the script prints of its progress: plain python's lines, from the chief only.

The chief's progress bars are left as the script asks for them (Keras' "auto" is a progress bar, into a file too:
one line an epoch instead would show other numbers, Keras 3.3's bar averaging differently from its logs); the
other ranks' fit, evaluate and predict are silent. (distrain's own lines start on a line of their own where the
script's progress bar left one unfinished: log.track_stdout.)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable


def from_the_chief_only(rank: int, arguments: dict) -> None:
    """fit's bound arguments: silent off the chief."""
    if rank != 0:
        arguments["verbose"] = 0


def hook_evaluate_and_predict(rank: Callable[[], int], model_cls: type) -> None:
    """evaluate and predict print their progress bars on the chief only, as fit does (`rank`: this process's now)."""

    def quiet_off_the_chief(original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def method(self, *args, **kwargs):  # noqa: ANN001, ANN202
            if rank() == 0:
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["verbose"] = 0
            return original(*bound.args, **bound.kwargs)

        return method

    for name in ("evaluate", "predict"):
        # patch: runner.model_hooks
        setattr(model_cls, name, quiet_off_the_chief(getattr(model_cls, name)))
