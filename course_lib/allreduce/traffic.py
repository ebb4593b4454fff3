"""What the values of ``course check allreduce`` cannot show, measured once a sum is right: whom each rank sent to and
received from, how many bytes it sent, and the longest chain of messages (course_lib.checking.p2p meters them)."""
from course_lib.checking.p2p import RECV, SEND, longest_chain

TRAFFIC = "the sum is right"   # how each message here starts (the hints that follow a failure leave these alone)


def naive_traffic(p2p, me: int, world: int) -> str | None:
    """The naive algorithm is a star: every other rank sends its tensor to rank 0 and receives the sum back from it;
    rank 0 receives W-1 tensors and sends W-1 sums. (At W = 2 the star is every pair: only W >= 3 shows it.)"""
    sends = sum(op == SEND for op, _, _ in p2p.events)
    recvs = sum(op == RECV for op, _, _ in p2p.events)
    if me and p2p.sent_to | p2p.received_from <= {0}:
        return None
    if not me and sends <= world - 1 and recvs <= world - 1:
        return None
    what = (f"exchanged with ranks {sorted(p2p.sent_to | p2p.received_from, key=str)}" if me else
            f"sent {sends} and received {recvs} messages")
    return (f"{TRAFFIC}, but group rank {me} {what}: in the naive all-reduce every rank sends its tensor to rank 0 "
            f"and receives the sum back from it, nothing else; rank 0 receives W-1 = {world - 1} tensors, adds them "
            "and sends the sum to each (no rank swaps tensors with every other one)")


def ring_traffic(p2p, me: int, world: int, x) -> str | None:
    """What the values cannot show: a ring sends only to the right neighbour and receives only from the left (ranks
    of the group), 2 (W-1) chunks of at most ceil(n/W) elements in all: 2 (W-1)/W of the tensor, whatever W. (At
    W = 2 the right neighbour is the left one, and the count is the whole tensor: only W >= 3 shows it.)"""
    right, left = (me + 1) % world, (me - 1) % world
    if p2p.off_ring(me, world):
        return (f"{TRAFFIC}, but group rank {me} sent to ranks {sorted(p2p.sent_to, key=str)} and received "
                f"from {sorted(p2p.received_from, key=str)}: in a ring each rank sends only to its right neighbour "
                f"(rank {right}) and receives only from its left (rank {left}), one chunk per step")
    size, n = x.element_size(), x.numel()
    chunk = -(-n // world) * size
    allowed = 2 * (world - 1) * chunk
    if p2p.bytes <= allowed and p2p.largest <= chunk:
        return None
    if p2p.largest >= n * size:
        fix = "send one chunk per step, not the whole tensor"
    elif p2p.largest > chunk:   # uneven chunks: tensor_split or chunk along dim 0 of a 2-D tensor cuts whole rows
        fix = (f"cut the W chunks over the flattened elements (tensor.view(-1)), not along a dimension of the "
               f"{x.dim()}-D tensor, whose rows need not split evenly")
    else:
        fix = "send one chunk per step, 2 (W-1) in all"
    if p2p.bytes <= allowed:
        return (f"{TRAFFIC}, but group rank {me} sent a message of {p2p.largest // size:,} elements; a ring's chunks "
                f"hold at most ceil(n/W) = {chunk // size:,} here (n = {n:,}, W = {world}): {fix}")
    return (f"{TRAFFIC}, but group rank {me} sent {p2p.bytes:,} B; a ring sends 2 (W-1) chunks of at most "
            f"ceil(n/W) elements, {allowed:,} B here (n = {n:,}, W = {world}): {fix}")


def ring_depth(logs: list | None) -> str | None:
    """What the neighbours and bytes cannot show: a ring whose steps are blocking and ordered round it (rank 0 sends
    first, each other rank receives, then sends on) makes every step a chain of W messages, 2 (W-1) W rounds in all.
    Posted together (sendrecv, isend/irecv), each step is one round: 2 (W-1); blocking send/recv ordered even/odd
    takes two: 4 (W-1) at most, which passes. W = 3 is the first size where the chained ring takes more."""
    chain, logs = _chain(logs)
    if chain is None or len(chain) - 1 <= 4 * (len(logs) - 1):
        return None
    rounds, steps = len(chain) - 1, 2 * (len(logs) - 1)
    return (f"{TRAFFIC}, but it takes {rounds} rounds, each message sent only after the one before it arrived: "
            f"{_route(chain)} (group ranks), {rounds / steps:.3g} messages per step. A ring takes 2 (W-1) = {steps} "
            f"at W = {len(logs)}, each step's sends in flight at once (sendrecv, isend/irecv, batch_isend_irecv); "
            f"blocking send/recv ordered even/odd takes twice that at most, {2 * steps}. Here a step waits for a "
            "chain of messages round the ring: post each step's send and receive together instead of receiving "
            "before sending")


def _route(chain: list[int]) -> str:
    """A long chain, shortened to its ends."""
    shown = chain if len(chain) <= 12 else [*chain[:6], "...", *chain[-6:]]
    return " -> ".join(map(str, shown))


def _chain(logs: list | None):
    """The longest chain of ``logs`` (None when a rank failed, its verdict says why, or its messages do not pair)."""
    if logs is None or any(log is None for log in logs):
        return None, logs
    return longest_chain([[tuple(e) for e in log] for log in logs]), logs


def tree_traffic(p2p, me: int, world: int) -> str | None:
    """In a tree each rank exchanges with its parent and its children only: in a binomial tree rank 0 has
    ceil(log2 W) children and every other rank at most that many partners in all. A star (every rank to rank 0 and
    back, the naive algorithm) gives rank 0 W-1 partners and W-1 rounds; W = 4 is the first size that shows it."""
    partners = (p2p.sent_to | p2p.received_from) - {"any"}
    most = (world - 1).bit_length()   # ceil(log2 W)
    if len(partners) <= most:
        return None
    return (f"{TRAFFIC}, but group rank {me} exchanged with {len(partners)} ranks ({sorted(partners)}); in a tree "
            f"each rank talks to its parent and its children only, at most ceil(log2 W) = {most} ranks at W = "
            f"{world}, so that the sum takes 2 ceil(log2 W) rounds, not the W-1 a rank that talks to every other "
            "one needs")


def tree_depth(logs: list | None) -> str | None:
    """What the partners cannot show: a chain (each rank adds what the next one sends and passes it on) talks to
    two ranks at most, yet its sum takes 2 (W-1) rounds, each message waiting on the one before. A binomial tree
    takes 2 ceil(log2 W) (a reduce up, a broadcast down); W = 4 is the first size where a chain takes more."""
    chain, logs = _chain(logs)
    if chain is None:
        return None
    most = 2 * (len(logs) - 1).bit_length()
    if len(chain) - 1 <= most:
        return None
    return (f"{TRAFFIC}, but it takes {len(chain) - 1} rounds, each message sent only after the one before it "
            f"arrived: {' -> '.join(map(str, chain))} (group ranks). A tree takes at most 2 ceil(log2 W) = {most} at "
            f"W = {len(logs)}, a reduce up the tree and a broadcast down it: a rank receives from all its children, "
            "adds, and only then sends once to its parent")


DEPTH = {"ring_allreduce": ring_depth, "tree_allreduce": tree_depth}   # judged on every member's messages
