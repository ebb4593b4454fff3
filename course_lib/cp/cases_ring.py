"""``ring_attention``: its output against one process, and what values cannot show, measured on each rank while it
runs: no collective, a barrier included (the guard's counts), whom it sends to and receives from and when each block
came, whether each send was posted before that step's receive returned and waited for at all (P2PMeter), the
bytes it sends, and at each call of the file's ``block_attention`` the keys it is given and the received blocks and
partial outputs it still holds (weak references to their storages: a storage counts while anything holds it, a
view included)."""
from course_lib.checking.case import Fail
from course_lib.checking.p2p import RECV, SEND, P2PMeter
from course_lib.cp import reference
from course_lib.cp.cases_attention import _inputs, _mode
from course_lib.tp.numerics import as_tensor, judge

USED = "block_attention"   # in P2PMeter.events: a block went into the attention


def _ring_peers(c, p2p, where):
    """In a ring a rank sends only to one neighbour and receives only from the other (the next and the previous rank,
    or the other way round), one block at a time, so that it holds at most two key/value blocks; exchanging blocks
    with every rank holds all cp of them, the memory ring attention exists to save. (At cp = 2 the next rank is the
    previous one: only cp >= 3 shows it.)"""
    me = c.r
    nxt, prev = (me + 1) % c.cp, (me - 1) % c.cp
    sent, got = p2p.sent_to, p2p.received_from
    if not (sent <= {nxt} and got <= {prev} or sent <= {prev} and got <= {nxt}):
        raise Fail(f"{where}: rank {me} of the cp group sent to ranks {sorted(sent, key=str)} and received from "
                   f"{sorted(got, key=str)}; in a ring each rank sends only to the next (rank {nxt}) and receives "
                   f"only from the previous (rank {prev}), or the other way round, the same two every step, one "
                   f"block per step, so that it holds at most two key/value blocks: exchanging blocks with every "
                   f"rank holds all {c.cp}")


def _ring_posts_first(c, p2p, where):
    """Each step posts its send before it waits for its receive: a rank whose receive returned before it posted
    the send of that step (blocking send/recv, some ranks receiving first) makes its neighbour wait for it, and the
    step's transfers run one after another round the ring instead of all at once."""
    sends = [i for i, (kind, *_) in enumerate(p2p.events) if kind == SEND]
    recvs = [i for i, (kind, *_) in enumerate(p2p.events) if kind == RECV]
    pairs = list(zip(sends, recvs)) if len(sends) == len(recvs) else list(zip(sends, recvs))[:1]
    if any(r < s for s, r in pairs):
        raise Fail(f"{where}: rank {c.r} of the cp group received a block (its wait returned) before it posted its "
                   f"own send of that step: a rank that receives first waits for its neighbour's send, so a step "
                   f"takes the time of two or more transfers in turn instead of one for all (blocking send/recv "
                   f"ordered by rank parity does this, and a ring of blocking calls in rank order serialises the "
                   f"whole step); post the isend and the irecv together, then wait on both (dist.batch_isend_irecv "
                   f"with P2POp, or isend + irecv and wait), as the exercise asks")


def _ring_keys(c, held, shard, where):
    """The keys block_attention is given at once: a ring attends to one rank's block at a time, so never more than
    a shard's (the case's shards are equal); more is the blocks that came put together, the whole sequence's keys
    on one rank, which ring attention exists never to hold."""
    s = shard[0].shape[-2]
    if held.keys > s:
        raise Fail(f"{where}: rank {c.r} of the cp group gave block_attention {held.keys} keys at once, the keys of "
                   f"{held.keys / s:.3g} ranks (a shard is S/cp = {s} tokens); ring attention never holds the whole "
                   f"sequence's keys: call block_attention on each block alone as it arrives and merge its (out, "
                   f"lse) into the running one with merge_partials, instead of concatenating the blocks that came")


def _ring_holds(c, p2p, where):
    """What the peers cannot show: a ring that first receives every block and only then computes holds all cp of
    them too. Each call of the file's block_attention uses a block; a ring uses each one as it arrives, so it never
    has two received blocks waiting. Judged when every block went through block_attention and every receive was
    waited for (a receive counts when its wait returns); only cp >= 3 has two blocks to receive."""
    recvs = sum(1 for kind, *_ in p2p.events if kind == RECV)
    if (c.cp < 3 or p2p.unwaited or recvs % (c.cp - 1)
            or sum(1 for kind, *_ in p2p.events if kind == USED) < c.cp):
        return
    per_block, waiting, most = recvs // (c.cp - 1), 0, 0
    for kind, *_ in p2p.events:
        if kind == RECV:
            waiting += 1
            most = max(most, -(-waiting // per_block))
        elif kind == USED:
            waiting = max(0, waiting - per_block)
    if most >= 2:
        raise Fail(f"{where}: rank {c.r} of the cp group received {most} key/value blocks before it used one of them "
                   f"(block_attention); a ring computes with each block as it arrives and then passes it on, so "
                   f"that it holds at most two: receiving them all first holds all {c.cp}, the memory ring "
                   f"attention exists to save")


def _ring_bytes(c, p2p, shard, where):
    """The bytes it gave to sends: a ring sends its key/value block and their positions cp-1 times. Judged from one
    k block more on, so that a few bytes of bookkeeping (a shard size) pass: q as well, a block twice, one step more
    round the ring or the blocks already passed on each send at least that."""
    block = sum(t.nbytes for t in shard)
    right = (c.cp - 1) * block
    if p2p.bytes >= right + shard[0].nbytes:
        raise Fail(f"{where}: rank {c.r} of the cp group sent {p2p.bytes} bytes to other ranks; a ring sends its "
                   f"key/value block and their positions to the next rank cp-1 = {c.cp - 1} times: {right} bytes "
                   f"here. Send k, v and the positions once per step (not q, not a block twice, not the blocks it "
                   f"already passed on) and stop after cp-1 steps")


def _ring_memory(c, held, shard, where):
    """What it still held at a call of block_attention (``_Held``): a ring holds the block it computes with and
    the one in flight, and one running output; only cp >= 4 has more than two blocks to keep."""
    block = sum(t.nbytes for t in shard)
    if held.blocks >= 2 * block + block // 2:      # half a block over two: a bigger receive buffer is no third
        raise Fail(f"{where}: rank {c.r} of the cp group still held {held.blocks / block:.3g} received key/value "
                   f"blocks ({held.blocks} bytes) when it called block_attention; a ring holds at most two (the one "
                   f"it computes with and the one in flight): drop each block once it is used and passed on (keep "
                   f"no list of them), or it holds all {c.cp}, the memory ring attention exists to save")
    if held.outputs >= 3:
        raise Fail(f"{where}: rank {c.r} of the cp group still held {held.outputs} partial outputs of earlier blocks "
                   f"when it called block_attention; merge each block's (out, lse) into the running one with "
                   f"merge_partials as it comes and keep only that: keeping them all to merge at the end holds one "
                   f"per block, {c.cp} here, growing with cp")


class _Held:
    """``with _Held(mod, p2p) as held:`` each call of the file's block_attention noted in ``p2p.events`` (ring_attention
    looks it up at each call), and at each call the most bytes of received blocks still held (``held.blocks``: the
    storages of the receives whose wait returned, ``p2p.arrived``, each storage once however many views) and of
    earlier calls' outputs still held (``held.outputs``), and the most keys given at once (``held.keys``). Entered
    inside the P2PMeter ``p2p``."""

    def __init__(self, mod, p2p):
        self.mod, self.p2p, self.blocks, self.outputs, self.keys = mod, p2p, 0, 0, 0
        self._made = []

    def __enter__(self):
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        attend = self._real = getattr(self.mod, "block_attention", None)

        def block_attention(*args, **kwargs):
            self.p2p.events.append((USED, None, None))
            alive = {r.cdata: n for r, n in self.p2p.arrived if not r.expired()}
            self.blocks = max(self.blocks, sum(alive.values()))
            self.outputs = max(self.outputs, len({r.cdata for r in self._made if not r.expired()}))
            k = args[1] if len(args) > 1 else kwargs.get("k")
            if torch.is_tensor(k) and k.dim() >= 2:
                self.keys = max(self.keys, k.shape[-2])
            out = attend(*args, **kwargs)
            if isinstance(out, tuple) and out and torch.is_tensor(out[0]):
                self._made.append(StorageWeakRef(out[0].untyped_storage()))
            return out
        if attend is not None:
            self.mod.block_attention = block_attention
        return self

    def __exit__(self, *exc):
        if self._real is not None:
            self.mod.block_attention = self._real
        return False


def _not_itself(kind, peer, tensors, pg):
    """P2PMeter's guard: a send or receive to the rank itself refused with what it means (gloo's own error names a
    pair of sockets)."""
    import torch.distributed as dist
    if peer == pg.rank():
        raise ValueError(f"ring_attention {'sends to' if kind == SEND else 'receives from'} its own rank (rank {peer} "
                         f"of the cp group, global rank {dist.get_rank()}): its place in the ring is its rank in the "
                         f"group, dist.get_rank(group) (dist.get_rank() is the global rank, the same only when the "
                         f"group is ranks 0..cp-1), and send/recv take the neighbours' global ranks, "
                         f"dist.get_global_rank(group, r)")
    return tensors


def case_ring(c, balanced):
    import torch
    fn = c.need("ring_attention")
    seq_len, full, pos = _inputs(c, balanced)
    with torch.no_grad():
        blocks = [[t[:, reference.positions(seq_len, c.cp, r, balanced)] for t in full[1:]]
                  + [reference.positions(seq_len, c.cp, r, balanced)] for r in range(c.cp)]
        c.take_counts()
        # its sends kept until waited for: one dropped unwaited would leave the next rank waiting, a hang instead of
        # the verdict that names the mistake
        with P2PMeter(_not_itself, keep_sends=True) as p2p, _Held(c.mod, p2p) as held:
            out = as_tensor(fn(*(t[:, pos].clone() for t in full), pos.clone(), **c.kw), "ring_attention")
        used = {k: n for k, n in c.take_counts().items() if n}
        where = f"seq_len={seq_len}, cp={c.cp}, {_mode(balanced)}"
        if used:
            raise Fail(f"{where}: ring_attention called {', '.join(f'{n} x {k}' for k, n in used.items())}: pass the "
                       f"key/value blocks around the ring with send/recv (isend/irecv), no collective"
                       + (" (a barrier is one too: every rank of the group waits for the slowest; waiting on its own "
                          "send and receive is all a step needs)" if {"barrier", "monitored_barrier"} & set(used)
                          else ""))
        if p2p.unwaited_sends:
            raise Fail(f"{where}: rank {c.r} of the cp group returned from ring_attention without waiting for "
                       f"{p2p.unwaited_sends} of its sends: a send not waited for may not have left, and once its "
                       f"request and tensor are dropped the next rank waits for a block that never comes; wait on "
                       f"every request, the sends' too, before going on")
        _ring_peers(c, p2p, where)
        _ring_posts_first(c, p2p, where)
        _ring_holds(c, p2p, where)
        shard = [full[1][:, pos], full[2][:, pos], pos]
        _ring_keys(c, held, shard, where)
        want = reference.serial(*full)[:, pos]
        judge(out, want, f"{where}: the output differs from causal attention in one process", [
            (reference.ring_order(full[0][:, pos], blocks, c.r, reference.average),
             f"{where}: ring attention without the log-sum-exp correction: the partial results are averaged; merge "
             f"them with merge_partials (weights exp(lse_x - lse))")] if c.cp > 1 else ())
        _ring_bytes(c, p2p, shard, where)
        _ring_memory(c, held, shard, where)
        return None
