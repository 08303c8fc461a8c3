"""The ranks' process groups (torch.distributed, no transport of our own) and rank 0's control channel.

Two groups over one TCPStore hosted by rank 0:
- `compute`: the layers' all-reduces (gloo on the CPU, NCCL on CUDA), with a bounded timeout
  (`SPECFOLD_COLLECTIVE_TIMEOUT`, seconds, default 120) on every rank: a rank that dies or hangs
  ends the request set with one line instead of a hang;
- `control` (gloo, host memory, as vLLM's CPU group): `Channel`, rank 0's broadcast of each step's
  message. Rank 0 waits on it for the bounded timeout; the other ranks idle on it between requests,
  so theirs is unbounded (a server may sit idle for days). A rank whose peer died gets an error
  from its socket at once.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

IDLE = timedelta(days=3650)


def collective_timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get("SPECFOLD_COLLECTIVE_TIMEOUT", "120")))


def store(addr: str, port: int, size: int, master: bool) -> dist.TCPStore:
    """The rendezvous store (rank 0 hosts it; port 0: any free port, read back from `.port`)."""
    return dist.TCPStore(addr, port, size, master, timeout=timedelta(seconds=300), wait_for_workers=False)


def connect(st: dist.TCPStore, rank: int, size: int, device: torch.device):
    """(compute group, control group) of this rank; blocks until every rank has joined."""
    bounded = collective_timeout()
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = bounded
        compute = dist.ProcessGroupNCCL(dist.PrefixStore("compute/", st), rank, size, opts)
    else:
        compute = dist.ProcessGroupGloo(dist.PrefixStore("compute/", st), rank, size, bounded)
    control = dist.ProcessGroupGloo(dist.PrefixStore("control/", st), rank, size,
                                    bounded if rank == 0 else IDLE)
    return compute, control


class Channel:
    """Python objects broadcast from rank 0 (pickled: the ranks run one program and trust each other),
    as a length and then the bytes. `on_error(e)` turns a failure into the error to raise."""

    def __init__(self, group, on_error=None):
        self.group, self.on_error = group, on_error
        self.down: str | None = None  # set when the group has failed or closed: every send says so
        # rank 0, from a message until the device work it starts has ended (engine/mirror.py): still set
        # when rank 0 was interrupted in between (Ctrl-C), so the others may be inside a collective
        self.busy = False

    def _wait(self, start) -> None:
        """Run one collective (`start()` -> its work) to its end; a failure is `on_error`'s error."""
        if self.down is not None:
            from specfold.errors import DistributedError
            raise DistributedError(self.down)
        try:
            start().wait()
        except RuntimeError as e:
            raise (self.on_error(e) if self.on_error is not None else e) from None

    def _broadcast(self, t: torch.Tensor) -> None:
        self._wait(lambda: self.group.broadcast(t, 0))

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._broadcast(torch.tensor([len(data)], dtype=torch.long))
        self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def digests(self, obj) -> list[bytes]:
        """Every rank's SHA-256 of `obj` (pickled), gathered on every rank: the ranks compare state."""
        mine = torch.frombuffer(bytearray(hashlib.sha256(pickle.dumps(obj)).digest()), dtype=torch.uint8)
        out = [[torch.empty(32, dtype=torch.uint8) for _ in range(self.group.size())]]
        self._wait(lambda: self.group.allgather(out, [mine]))
        return [ctypes.string_at(t.data_ptr(), 32) for t in out[0]]

    def recv(self):
        n = torch.zeros(1, dtype=torch.long)
        self._broadcast(n)
        buf = torch.empty(int(n), dtype=torch.uint8)
        self._broadcast(buf)
        return pickle.loads(ctypes.string_at(buf.data_ptr(), buf.numel()))
