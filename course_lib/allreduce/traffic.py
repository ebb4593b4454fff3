"""What the values of ``course check allreduce`` cannot show, measured once a sum is right: whom each rank sent to and
received from, how many bytes it sent, and the longest chain of messages (course_lib.checking.p2p meters them)."""
from course_lib.checking.p2p import longest_chain

TRAFFIC = "the sum is right"   # how each message here starts (the hints that follow a failure leave these alone)


def ring_traffic(p2p, me: int, world: int, x) -> str | None:
    """What the values cannot show: a ring sends only to the right neighbour and receives only from the left (ranks
    of the group), 2 (W-1) chunks of at most ceil(n/W) elements in all: 2 (W-1)/W of the tensor, whatever W. (At
    W = 2 the right neighbour is the left one, and the count is the whole tensor: only W >= 3 shows it.)"""
    right, left = (me + 1) % world, (me - 1) % world
    if p2p.off_ring(me, world):
        return (f"{TRAFFIC}, but group rank {me} sent to ranks {sorted(p2p.sent_to, key=str)} and received "
                f"from {sorted(p2p.received_from, key=str)}: in a ring each rank sends only to its right neighbour "
                f"(rank {right}) and receives only from its left (rank {left}), one chunk per step")
    allowed = 2 * (world - 1) * -(-x.numel() // world) * x.element_size()
    if p2p.bytes > allowed:
        return (f"{TRAFFIC}, but group rank {me} sent {p2p.bytes:,} B; a ring sends 2 (W-1) chunks of at most "
                f"ceil(n/W) elements, {allowed:,} B here (n = {x.numel():,}, W = {world}): send one chunk per step, "
                "not the whole tensor")
    return None


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
    if logs is None or any(log is None for log in logs):
        return None      # another rank failed (its verdict says why) or its messages could not be paired
    chain = longest_chain([[tuple(e) for e in log] for log in logs])
    most = 2 * (len(logs) - 1).bit_length()
    if chain is None or len(chain) - 1 <= most:
        return None
    return (f"{TRAFFIC}, but it takes {len(chain) - 1} rounds, each message sent only after the one before it "
            f"arrived: {' -> '.join(map(str, chain))} (group ranks). A tree takes at most 2 ceil(log2 W) = {most} at "
            f"W = {len(logs)}, a reduce up the tree and a broadcast down it: a rank receives from all its children, "
            "adds, and only then sends once to its parent")
