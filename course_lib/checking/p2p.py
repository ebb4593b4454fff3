"""What a rank's point-to-point operations did, measured where gloo gets them: ``ProcessGroup.send`` and ``recv``,
which dist.send/recv, dist.isend/irecv and batch_isend_irecv all reach. Peers are ranks of the group the operation
went to (c10d turns a global rank into the group's before the call). The library's collectives move their bytes
inside gloo, where this does not see them. ``post_events`` and ``events_of`` share each rank's log with the others
of a case, for a judgement that needs every rank's (``longest_chain``)."""
import datetime
import json

SEND, RECV = 1, 2
NEVER_WAITED: list = []   # P2PMeter's keep_sends: gloo cancels a send whose request is dropped, and its partner hangs


class P2PMeter:
    """``with P2PMeter() as m: ...`` -> ``m.bytes`` given to sends (``m.largest``: the most one send was given),
    ``m.sent_to`` and ``m.received_from``: the peers (a receive from any source: the rank it came from, read when its
    wait() returned; ``"any"`` if it never was); ``m.events``: (SEND or RECV, peer, tag) in the order this rank did
    them, a send when it was posted, a receive when its wait() returned (its data is there only then); ``m.arrived``:
    (weak reference to its storage, bytes) of each tensor received, from when its wait() returned (what a rank still
    holds of what it received: those not ``expired()``); ``m.unwaited``: receives never waited for.

    ``guard(SEND or RECV, peer, tensors, pg) -> tensors`` sees each send and receive from a named peer before gloo:
    it may raise to refuse it or give other buffers to receive into. ``keep_sends`` (else a send dropped unwaited is
    cancelled, as without the meter): each send kept until its wait(); ``m.unwaited_sends``: those never waited for,
    kept for the rest of the process (NEVER_WAITED) so that they still leave (none is waited for here: one no rank
    receives would wait forever)."""

    def __init__(self, guard=None, keep_sends: bool = False):
        self.guard, self.keep_sends = guard or (lambda kind, peer, tensors, pg: tensors), keep_sends

    def __enter__(self) -> "P2PMeter":
        import torch.distributed.distributed_c10d as c10d  # deferred: the launcher, which imports no torch, reads this
        from torch.multiprocessing.reductions import StorageWeakRef
        self.bytes, self.largest, self.events, self.arrived = 0, 0, [], []
        self.sent_to, self.received_from = set(), set()
        # id(work) -> (work, its RECV event, its tensors' storages): a receive posted, not yet waited for
        self._pending, self._sends = {}, {}     # and id(work) -> work: a send posted, not yet waited for
        self._real = [(c10d.ProcessGroup, name, vars(c10d.ProcessGroup)[name])
                      for name in ("send", "recv", "recv_anysource")] + [(c10d.Work, "wait", vars(c10d.Work)["wait"])]
        send, recv, anysource, wait = (real for *_, real in self._real)

        def metered_send(pg, tensors, dst, tag=0, *args, **kwargs):
            tensors = self.guard(SEND, dst, tensors, pg)
            size = sum(t.numel() * t.element_size() for t in tensors)
            self.bytes, self.largest = self.bytes + size, max(self.largest, size)
            self.sent_to.add(dst)
            self.events.append((SEND, dst, tag))
            work = send(pg, tensors, dst, tag, *args, **kwargs)
            if self.keep_sends:
                self._sends[id(work)] = work      # kept: an id is unique only while its object lives
            return work

        def pend(work, tensors, src, tag):
            storages = [(StorageWeakRef(s), s.nbytes()) for s in (t.untyped_storage() for t in tensors)]
            self._pending[id(work)] = (work, (RECV, src, tag), storages)
            return work

        def metered_recv(pg, tensors, src, tag=0, *args, **kwargs):
            tensors = self.guard(RECV, src, tensors, pg)
            self.received_from.add(src)
            return pend(recv(pg, tensors, src, tag, *args, **kwargs), tensors, src, tag)

        def metered_anysource(pg, tensors, tag=0, *args, **kwargs):
            return pend(anysource(pg, tensors, tag, *args, **kwargs), tensors, "any", tag)

        def metered_wait(work, *args, **kwargs):
            self._sends.pop(id(work), None)       # let go: its tensor is held no longer than the code holds it
            done = wait(work, *args, **kwargs)
            if id(work) in self._pending:
                _, (op, src, tag), storages = self._pending.pop(id(work))
                if src == "any":   # known once it came: a chain or a partner must not hide behind a missing src=
                    src = work._source_rank()
                    self.received_from.add(src)
                self.events.append((op, src, tag))
                self.arrived += storages
            return done

        for (owner, name, _), metered in zip(self._real, (metered_send, metered_recv, metered_anysource, metered_wait)):
            setattr(owner, name, metered)
        return self

    def __exit__(self, *exc) -> bool:
        for owner, name, real in self._real:
            setattr(owner, name, real)
        self.unwaited = len(self._pending)   # receives never waited for: when their data came is not known
        self.events += [event for _, event, _ in self._pending.values()]
        self.received_from |= {src for _, (_, src, _), _ in self._pending.values() if src == "any"}
        self.unwaited_sends = len(self._sends)
        NEVER_WAITED.extend(self._sends.values())
        self._pending, self._sends = {}, {}
        return False

    def off_ring(self, me: int, world: int) -> bool:
        """Whether rank ``me`` of a ring of ``world`` sent to any but the next rank or received from any but the
        previous one (at ``world`` = 2 they are one rank: only 3 or more can show it)."""
        return bool(self.sent_to - {(me + 1) % world} or self.received_from - {(me - 1) % world})


def longest_chain(logs: list) -> list[int] | None:
    """The ranks along the longest chain of messages in ``logs`` (each rank's ``P2PMeter.events``, by group rank),
    each message sent after the one before it arrived: a Lamport clock that counts messages. Its length minus one is
    the rounds the algorithm needs however fast the links are. None when the sends and receives do not pair up
    (a receive from any source, a log cut short)."""
    chain = [[r] for r in range(len(logs))]    # the longest chain that ends at each rank so far
    in_flight: dict = {}                       # (src, dst, tag) -> the chains of its sends, oldest first
    at = [0] * len(logs)
    moved = True
    while moved:
        moved = False
        for r, log in enumerate(logs):
            while at[r] < len(log):
                op, peer, tag = log[at[r]]
                if op == SEND:
                    in_flight.setdefault((r, peer, tag), []).append(chain[r])
                elif in_flight.get((peer, r, tag)):
                    came = in_flight[(peer, r, tag)].pop(0)
                    if len(came) >= len(chain[r]):
                        chain[r] = [*came, r]
                else:
                    break      # its message is not sent yet: another rank first
                at[r] += 1
                moved = True
    if any(at[r] < len(log) for r, log in enumerate(logs)):
        return None
    return max(chain, key=len)


def post_events(ctx, p2p) -> None:
    """This rank's ``p2p.events`` (None: idle, failed, or a receive from any source never waited for, which cannot be
    paired) for the other ranks of this case, on the launch's store: a set waits for no one, and a collective on the
    harness's group here would pair with another rank's end-of-case agreement when this one failed."""
    events = p2p.events if p2p is not None and all(peer != "any" for _, peer, _ in p2p.events) else None
    store().set(f"p2p/{ctx.current['case']}/{ctx.rank}", json.dumps(events))


def events_of(ctx, members: list[int], seconds: float = 5.0) -> list | None:
    """Every member's posted events, by group rank; None when one is not there within ``seconds`` (its call did not
    end: the harness's agreement after the case says what happened to it)."""
    keys = [f"p2p/{ctx.current['case']}/{m}" for m in members]
    try:
        store().wait(keys, datetime.timedelta(seconds=seconds))
    except Exception:   # DistStoreError: a member still in its call, or gone
        return None
    return [json.loads(store().get(key)) for key in keys]


def store():
    """The launch's own store (the one init_process_group made), which every rank of the launch reaches."""
    import torch.distributed.distributed_c10d as c10d  # deferred: the harness reads this module before torch
    return c10d._get_default_store()
