"""mlcache.sim — replay traces through policies: readers, generators, the player, the CLI.

Never imported by the data path (DESIGN §1); ``mlcache simulate`` and the policy benchmark use it.
"""
from .generators import (concat, hotspot, loop, phase_change, scan, scrambled_zipf,
                         shifting_hot_set, zipf)
from .player import SimResult, make_policy, play
from .readers import FORMATS, Trace, TraceFormatError, read_trace

__all__ = [
    "Trace", "TraceFormatError", "read_trace", "FORMATS",
    "SimResult", "make_policy", "play",
    "zipf", "scrambled_zipf", "hotspot", "loop", "scan", "shifting_hot_set", "phase_change",
    "concat",
]
