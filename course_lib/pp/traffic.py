"""What a stage sent during a schedule, measured where gloo gets it (``checking.p2p.P2PMeter``) and set against its
forwards and backwards: a pipeline's only traffic is one activation per micro-batch to the next stage and one
gradient per micro-batch to the previous one, each sent as soon as it is computed. An output held back while the
stage computes the next micro-batch makes the next stage wait for that too: the stages run one after another."""
from course_lib.checking.p2p import SEND
from course_lib.pp import received


def problem(pipe, events: list, sent: list, meter) -> str | None:
    """``events``: the stage's ("F" | "B", micro-batch) in order; ``sent``: the meter's event count at each one's
    start; ``meter``: the P2PMeter that watched the schedule. None when the traffic is the pipeline's."""
    import math
    s, m = pipe.stage, pipe.m
    sends = [peer for kind, peer, _ in meter.events if kind == SEND]
    others = sorted(set(sends) - {pipe.prev, pipe.next}, key=str)
    if others:
        return (f"stage {s} sent to ranks {others}: a stage sends only to its neighbours (pipe.prev = {pipe.prev}, "
                f"pipe.next = {pipe.next}): one activation forward and one gradient back per micro-batch")
    want = {"next": 0 if pipe.last else m, "prev": 0 if pipe.first else m}
    got = {"next": sends.count(pipe.next) if pipe.next is not None else 0,
           "prev": sends.count(pipe.prev) if pipe.prev is not None else 0}
    each = math.prod(pipe.shape) * pipe.dtype.itemsize
    total = (want["next"] + want["prev"]) * each
    if got != want or meter.bytes != total:
        return (f"stage {s} sent {got['next']} messages to the next stage and {got['prev']} to the previous one, "
                f"{meter.bytes:,} B in all (measured at gloo's send); with m = {m} the pipeline sends "
                f"{want['next']} and {want['prev']}, {total:,} B: one micro-batch's activation ({each} B, pipe.shape) "
                f"forward and one gradient back per micro-batch, each in its own communicate call, nothing more")
    return order_problem(pipe, events, sent, meter) or received.problem(pipe, events, sent, meter)


def order_problem(pipe, events: list, sent: list, meter) -> str | None:
    """Before the stage starts the forward (backward) of its k-th micro-batch, it has sent the k outputs
    (gradients) before it on; then, before any call, every output and gradient computed so far."""
    return same_kind(pipe, events, sent, meter) or any_kind(pipe, events, sent, meter)


def sends_before(pipe, meter, at: int) -> dict:
    """{"F": outputs sent to the next stage, "B": gradients sent to the previous one} among the first ``at``
    events of the meter."""
    done = [to for op, to, _ in meter.events[:at] if op == SEND]
    return {"F": done.count(pipe.next) if pipe.next is not None else None,
            "B": done.count(pipe.prev) if pipe.prev is not None else None}


def same_kind(pipe, events: list, sent: list, meter) -> str | None:
    s, seen = pipe.stage, {"F": 0, "B": 0}
    for (kind, i), at in zip(events, sent):
        k, done = seen[kind], sends_before(pipe, meter, at)[kind]
        seen[kind] += 1
        if done is not None and done < k:
            what, where = ("output", "next") if kind == "F" else ("input's gradient", "previous")
            step = "forward" if kind == "F" else "backward"
            return (f"stage {s} started the {step} of micro-batch {i} having sent on {done} of the {k} micro-batches "
                    f"before it (measured at gloo's send): the {where} stage waits for this stage's next {step} too, "
                    f"and the stages run one after another instead of overlapping. Send each micro-batch's {what} to "
                    f"the {where} stage as soon as it is computed, before the next micro-batch's {step}")
    return None


def any_kind(pipe, events: list, sent: list, meter) -> str | None:
    """A forward's output still unsent when the stage starts a backward, or a backward's gradient when it starts
    a forward (1F1B alternates them: holding one back makes the neighbour wait a whole step)."""
    s, seen = pipe.stage, {"F": 0, "B": 0}
    for (kind, i), at in zip(events, sent):
        other = "B" if kind == "F" else "F"
        done = sends_before(pipe, meter, at)[other]
        if done is not None and done < seen[other]:
            step, held = ("forward", "backward") if kind == "F" else ("backward", "forward")
            what, where = ("output", "next") if other == "F" else ("input's gradient", "previous")
            fix = (": in the steady state send y and receive its gradient in ONE communicate(pipe, send_next=y, "
                   "recv_next=True), before the backward" if other == "F" else
                   ", before the next forward (Megatron sends it with the next activation's receive, in one "
                   "communicate(pipe, send_prev=dx, recv_prev=True))")
            return (f"stage {s} started the {step} of micro-batch {i} with the {what} of its last {held} not yet "
                    f"sent to the {where} stage (sent {done} of {seen[other]}, measured at gloo's send): the {where} "
                    f"stage waits for this {step} too, and the stages run one after another instead of "
                    f"overlapping. Send each {what} as soon as it is computed{fix}")
        seen[kind] += 1
    return None
