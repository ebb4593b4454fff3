"""How communicate posts its operations, seen where gloo gets them (P2PMeter's guard): to which
ranks, in which dtype, whether through dist.batch_isend_irecv, and whether every send's request was waited on. A peer
that is not the stage's neighbour is stopped before gloo sees it (in the checker's reversed pipeline, where stage s
is not rank s, pipe.stage +- 1 names the wrong rank); a receive buffer of another dtype than the stages send is
swapped for a right one (gloo would abort the process on the size mismatch), and the check says so."""
import math
import re
import sys

from course_lib.checking.p2p import SEND

STUB = "torch.empty(pipe.shape, dtype=pipe.dtype)"


class Refused(Exception):
    """An operation the checker stopped before gloo saw it: the message says why."""


def batched() -> bool:
    """Whether this send or receive was posted by dist.batch_isend_irecv (its frame is on the stack, however the
    learner imported it); called from Posted, which P2PMeter calls."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "batch_isend_irecv" and "distributed" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class Posted:
    """communicate's operations, seen as P2PMeter's guard: ``with P2PMeter(posted, keep_sends=True) as meter:
    communicate(pipe, ...)`` -> ``posted.ops``: ("send" | "recv", peer, batched) in order; ``meter.unwaited_sends``:
    send requests never waited on."""

    def __init__(self, pipe, ranks: list | None = None):
        # ranks: the global rank of each stage, when the check refuses any peer but the neighbours
        self.pipe, self.ranks, self.ops = pipe, ranks, []
        self.wrong_dtype = None      # the dtype of a receive buffer that was not pipe.dtype

    def __call__(self, kind, peer: int, tensors, pg) -> list:
        pipe, ranks = self.pipe, self.ranks
        self.ops.append(("send" if kind == SEND else "recv", peer, batched()))
        if ranks and peer not in (pipe.prev, pipe.next):
            to = "sent to" if kind == SEND else "posted a receive from"
            which = ("itself" if peer == ranks[pipe.stage] else
                     f"stage {ranks.index(peer)}" if peer in ranks else "no stage")
            raise Refused(f"stage {pipe.stage} (global rank {ranks[pipe.stage]}) {to} rank {peer}, which is "
                          f"{which}; its neighbours are pipe.prev = {pipe.prev} and pipe.next = {pipe.next}. Here "
                          f"(pipeline ranks {ranks}), as in a dp x pp grid, stage s is not rank s: the peers of "
                          f"communicate are pipe.prev and pipe.next, the GLOBAL ranks of the neighbouring stages, "
                          f"not pipe.stage +- 1")
        return tensors if kind == SEND else self.buffers(tensors)

    def buffers(self, tensors) -> list:
        """The receive's buffers; one of another dtype than the stages send is noted and replaced by a right one,
        so that the exchange ends (gloo would abort the process on the size mismatch) and the check can say why."""
        import torch
        pipe = self.pipe
        if not (tensors and tensors[0].dtype != pipe.dtype and tensors[0].numel() == math.prod(pipe.shape)):
            return tensors
        self.wrong_dtype = self.wrong_dtype or tensors[0].dtype
        return [torch.empty(pipe.shape, dtype=pipe.dtype)]


def problem(posted: Posted, unwaited: int, stage: int, loose: bool = True) -> str | None:
    """communicate's way of posting, once an exchange has returned: every operation through batch_isend_irecv (when
    ``loose``), every send's request waited on (``unwaited``: the meter's ``unwaited_sends``)."""
    if posted.wrong_dtype is not None:
        pipe = posted.pipe
        return (f"stage {stage} received into a {posted.wrong_dtype} buffer while the stages send {pipe.dtype} "
                f"(pipe.dtype): the message is {math.prod(pipe.shape) * pipe.dtype.itemsize} B and the buffer "
                f"{math.prod(pipe.shape) * posted.wrong_dtype.itemsize} B (gloo aborts the process on that: "
                f"'op.preamble.length <= op.nbytes'). Allocate each receive buffer as {STUB}: without dtype=, "
                f"torch.empty makes the default dtype, float32")
    loose = [kind for kind, _, inside in posted.ops if not inside] if loose else []
    if loose:
        return (f"stage {stage}: communicate made {loose.count('send')} sends and {loose.count('recv')} receives "
                f"outside dist.batch_isend_irecv (dist.isend / irecv / send / recv one by one). On gloo that runs, "
                f"but on NCCL a send and a receive to the same peer posted separately can deadlock in 1F1B's steady "
                f"state. Post them together: a dist.P2POp(dist.isend | dist.irecv, tensor, peer, pipe.group) per "
                f"operation, all in one dist.batch_isend_irecv(ops), then wait on every request it returns")
    if unwaited:
        return (f"stage {stage}: communicate returned without waiting on {unwaited} of its send requests: a send is "
                f"done only when its request's wait() returns (until then its buffer may not be sent yet, and gloo "
                f"may drop it with the request). Wait on every request batch_isend_irecv returns, sends included")
    return None


def crash_hint(item: str, first, recs) -> str:
    """The plugin's hint: gloo's abort on a message larger than its receive buffer, said in pipeline terms."""
    texts = [first.ended or ""] + [v.get("message", "") for v in first.verdicts.values()]
    found = next((m for m in map(re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)").search, texts)
                  if m), None)
    if not found:
        return ""
    sent, room = int(found.group(1)), int(found.group(2))
    why = ("half the bytes: a float32 buffer (torch.empty(pipe.shape) without dtype=) for the float64 the stages "
           "send" if sent == 2 * room else "a buffer of another shape or dtype than the tensor sent")
    return (f"\nhint: gloo aborted the receiving process: a message of {sent} B arrived for a receive buffer of "
            f"{room} B, {why}. Allocate each receive buffer as {STUB}")
