"""What a rank's point-to-point operations did, measured where gloo gets them: ``ProcessGroup.send`` and ``recv``,
which dist.send/recv, dist.isend/irecv and batch_isend_irecv all reach. Peers are ranks of the group the operation
went to (c10d turns a global rank into the group's before the call). The library's collectives move their bytes
inside gloo, where this does not see them."""


class P2PMeter:
    """``with P2PMeter() as m: ...`` -> ``m.bytes`` given to sends, ``m.sent_to`` and ``m.received_from``: the peers
    (``"any"`` for a receive from any source)."""

    def __enter__(self) -> "P2PMeter":
        import torch.distributed.distributed_c10d as c10d  # deferred: the launcher, which imports no torch, reads this
        self.bytes, self.sent_to, self.received_from = 0, set(), set()
        self._cls = c10d.ProcessGroup
        self._real = {name: vars(self._cls)[name] for name in ("send", "recv", "recv_anysource")}
        send, recv, anysource = self._real.values()

        def metered_send(pg, tensors, dst, *args, **kwargs):
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            self.sent_to.add(dst)
            return send(pg, tensors, dst, *args, **kwargs)

        def metered_recv(pg, tensors, src, *args, **kwargs):
            self.received_from.add(src)
            return recv(pg, tensors, src, *args, **kwargs)

        def metered_anysource(pg, *args, **kwargs):
            self.received_from.add("any")
            return anysource(pg, *args, **kwargs)

        self._cls.send, self._cls.recv, self._cls.recv_anysource = metered_send, metered_recv, metered_anysource
        return self

    def __exit__(self, *exc) -> bool:
        for name, real in self._real.items():
            setattr(self._cls, name, real)
        return False

    def off_ring(self, me: int, world: int) -> bool:
        """Whether rank ``me`` of a ring of ``world`` sent to any but the next rank or received from any but the
        previous one (at ``world`` = 2 they are one rank: only 3 or more can show it)."""
        return bool(self.sent_to - {(me + 1) % world} or self.received_from - {(me - 1) % world})
