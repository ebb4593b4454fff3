"""What a stage received ahead of its use, measured where gloo gets it (``checking.p2p.P2PMeter``: a receive counts
when its wait() returned). A stage that receives every micro-batch's activation before its first forward waits for
the previous stage's last forward before it starts: the stages run one after another, with no overlap. A pipeline
receives each activation (gradient) just before the forward (backward) that uses it; Megatron receives the next one
a step early, in the exchange that sends the last gradient back, so one received and not yet used is allowed."""
from course_lib.checking.p2p import RECV

AHEAD = 1      # received and not yet used by its forward (backward) when the stage starts a call


def problem(pipe, events: list, sent: list, meter) -> str | None:
    """``events``: the stage's ("F" | "B", micro-batch) in order; ``sent``: the meter's event count at each one's
    start. None when no call started with more than AHEAD activations (gradients) received and not yet used."""
    used = {"F": 0, "B": 0}
    for (kind, i), at in zip(events, sent):
        got = [peer for op, peer, _ in meter.events[:at] if op == RECV]
        for side, peer in (("F", pipe.prev), ("B", pipe.next)):
            waiting = got.count(peer) - used[side] if peer is not None else 0
            if waiting > AHEAD:
                return text(pipe, kind, i, side, waiting)
        used[kind] += 1
    return None


def text(pipe, kind: str, i: int, side: str, waiting: int) -> str:
    step = "forward" if kind == "F" else "backward"
    what, where, use = (("activations", "previous", "forward") if side == "F" else
                        ("gradients", "next", "backward"))
    call = "communicate(pipe, recv_prev=True)" if side == "F" else "communicate(pipe, recv_next=True)"
    return (f"stage {pipe.stage} started the {step} of micro-batch {i} having received {waiting} {what} from the "
            f"{where} stage that no {use} had used yet (measured at gloo's receive): it waited for the {where} "
            f"stage's {use}s of all of them before its own, so the stages run one after another instead of "
            f"overlapping. Receive each micro-batch's {what[:-1]} just before the {use} that uses it ({call} "
            f"inside the loop, not all of them first)")
