"""The cyclic garbage collector while the agent loads what it keeps for good.

Twisted, the agent's modules and the engine live as long as the process. Collecting while they
load only walks the new objects again and again (importing Twisted and the agent ran about 120
young-generation passes, some 30 ms of a 270 ms start), and every later full pass would walk them
all once more. So the collector stays off while such a body of modules loads, and what loaded is
frozen (``gc.freeze``): left out of every later pass. The few hundred cyclic objects the imports
leave as garbage are frozen with it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def loadingForGood() -> Iterator[None]:
    """No collection while the body loads; then freeze everything tracked and collect again
    as before (a collector that was off stays off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
