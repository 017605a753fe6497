"""What a step dispatches, counted (tools/rehearse.py runs a launch's step under these modes): every
all-gather, reduce-scatter and all-reduce with its group's size and this rank's bytes (CollectiveBytes), the
operators that compute something (DispatchedOps), and this host's time to dispatch one (host_seconds_per_op).
"""
import math
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


class CollectiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Every all-gather, reduce-scatter and all-reduce dispatched, with its group's size and this rank's bytes."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []  # (kind, group size, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):  # DTensor's own dispatch comes first
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        c10d, name = torch.ops.c10d, func._overloadpacket
        size = lambda ts: sum(t.numel() * t.element_size() for t in (ts if isinstance(ts, (list, tuple)) else [ts]))
        group = lambda g: dist.ProcessGroup.unbox(g).size()
        if name in (c10d._allgather_base_, c10d.allgather_into_tensor_coalesced_):
            self.calls.append(("all-gather", group(args[2]), size(args[0])))
        elif name in (c10d._reduce_scatter_base_, c10d.reduce_scatter_tensor_coalesced_):
            self.calls.append(("reduce-scatter", group(args[2]), size(args[1])))
        elif name is c10d.allreduce_:
            self.calls.append(("all-reduce", group(args[1]), size(args[0])))
        return out


# Aliasing ops that are not marked as views (`func.is_view`): they launch no kernel either
ALIASING = {torch.ops.aten.detach, torch.ops.aten.alias, torch.ops.aten.lift_fresh, torch.ops.aten._unsafe_view}


class DispatchedOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the operators dispatched that launch a kernel (views, aliasing ops and `prim` queries excluded);
    `count` runs on across the mode's uses, so a caller reads differences."""
    count = 0  # the class's until this mode's first count: each mode counts its own

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):  # DTensor runs its local ops, which come back here
            return NotImplemented
        self.count += func.namespace != "prim" and not func.is_view and func._overloadpacket not in ALIASING
        return func(*args, **(kwargs or {}))


def host_seconds_per_op(repeats: int = 20_000) -> float:
    """This host's time to dispatch one operator on a one-element tensor (the best of five rounds)."""
    x = torch.zeros(1)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            x.add_(1.0)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best
