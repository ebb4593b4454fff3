"""Faulty all-reduce submissions that `course check allreduce` must catch, at the right function and with the
right reason, while the correct functions in the same file pass (tests/faulty.py says how a case is declared;
tests/test_allreduce_checker.py runs them, tests/test_allreduce_model.py benchmarks one).

All but one are the solution with a mistake typed in, so the message names ``allreduce.py``. The control,
all_correct.py, is a whole file: all three functions right in a learner's style (blocking send/recv,
isend/irecv pairs, no early return for W=1 or empty tensors). ``world_sizes``: the smallest that shows the
fault, to keep the suite quick. Functions not named in ``expect`` must pass.
"""
import re

from faulty import Faulty


def worlds(*sizes):
    return {"world_sizes": sizes}


def group_ranks(text: str) -> str:
    """``text`` with every ``peer(group, R)`` replaced by ``R``: group ranks where send/recv take global ones."""
    return re.sub(r"peer\(group, ((?:[^()]|\([^()]*\))*)\)", r"\1", text)


RING_LOOPS = (
    "    # reduce-scatter: each step adds the left neighbour's partial sum of one chunk into ours\n"
    "    for step in range(world - 1):\n"
    "        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world\n"
    "        buf = incoming[: chunks[recv_i].numel()]\n"
    "        sendrecv(chunks[send_i], right, buf, left, group)\n"
    "        chunks[recv_i] += buf\n"
    "    # all-gather: pass the finished chunks on; receive straight into place, no copy\n"
    "    for step in range(world - 1):\n"
    "        send_i, recv_i = (rank + 1 - step) % world, (rank - step) % world\n"
    "        sendrecv(chunks[send_i], right, chunks[recv_i], left, group)\n")
NAIVE_ADD = "            tensor += incoming                       # in place: the caller's tensor holds the sum\n"
NAIVE_EARLY_RETURN = "    if world == 1 or tensor.numel() == 0:\n        return\n    if rank == 0:\n"
NAIVE_BODY = (NAIVE_EARLY_RETURN
              + "        incoming = torch.empty_like(tensor)          # same dtype: an int64 sum stays exact\n"
              "        for src in range(1, world):\n"
              "            dist.recv(incoming, src=peer(group, src), group=group)\n"
              + NAIVE_ADD
              + "        for dst in range(1, world):\n"
              "            dist.send(tensor, dst=peer(group, dst), group=group)\n"
              "    else:\n"
              "        dist.send(tensor, dst=peer(group, 0), group=group)\n"
              "        dist.recv(tensor, src=peer(group, 0), group=group)\n")
RING_BOUNDS = "    bounds = [i * n // world for i in range(world + 1)]   # chunk i is flat[bounds[i]:bounds[i+1]]\n"
RING_CHUNKS = "    chunks = [flat[bounds[i]:bounds[i + 1]] for i in range(world)]   # views, not copies\n"
RING_GATHER = "        sendrecv(chunks[send_i], right, chunks[recv_i], left, group)\n"
RING_PEERS = "    right, left = peer(group, (rank + 1) % world), peer(group, (rank - 1) % world)\n"
TREE_REDUCE = ("    incoming = torch.empty_like(tensor)\n"
               "    mask = 1\n"
               "    while mask < world:                               # reduce towards rank 0\n"
               "        if rank & mask:\n"
               "            dist.send(tensor, dst=peer(group, rank - mask), group=group)\n"
               "            break\n"
               "        if rank + mask < world:\n"
               "            dist.recv(incoming, src=peer(group, rank + mask), group=group)\n"
               "            tensor += incoming\n"
               "        mask <<= 1\n")
TREE_BROADCAST = ("    # broadcast: receive from the rank we sent to (rank 0 receives nothing), then feed our subtree\n"
                  "    if rank == 0:\n"
                  "        mask = 1\n"
                  "        while mask < world:\n"
                  "            mask <<= 1\n"
                  "    else:\n"
                  "        mask = rank & -rank                           # lowest set bit: the round in which we sent\n"
                  "        dist.recv(tensor, src=peer(group, rank - mask), group=group)\n"
                  "    mask >>= 1\n"
                  "    while mask:\n"
                  "        if rank + mask < world:\n"
                  "            dist.send(tensor, dst=peer(group, rank + mask), group=group)\n"
                  "        mask >>= 1\n")

CASES = [
    Faulty("all_correct", file="all_correct.py", options=worlds(3, 5), expect={},
           why="the control: all three right, in a learner's style"),
    Faulty("naive_float32_accumulator", options=worlds(1),
           why="naive accumulates in float32: float64 loses digits, int64 loses exactness",
           edits=[(NAIVE_EARLY_RETURN, "    if rank == 0:\n        acc = tensor.float()\n"),
                  (NAIVE_ADD, "            acc += incoming.float()\n        tensor.copy_(acc)\n")],
           expect={"naive_allreduce": ("fail", r"float64.*float32 precision")}),
    Faulty("naive_float32_buffer", options=worlds(2),
           why="naive receives into a float32 buffer (torch.empty(shape)) whatever the tensor's dtype",
           edits=[("        incoming = torch.empty_like(tensor)          # same dtype: an int64 sum stays exact\n",
                   "        incoming = torch.empty(tensor.shape)\n")],
           expect={"naive_allreduce": ("fail", r"W=2, 1,009 elements, float64: rank 0 ended during the call at allreduce\.py:"
                                               r"{line:dist.recv(incoming, src=peer(group, src)} in naive_allreduce: .*"
                                               r"rank 0: .*Received data size doesn't "
                                               r"match.*then rank 1: .*Connection (reset|closed) by peer.*"
                                               r"float32 cases at W=2 passed.*tensor's dtype")}),
    Faulty("ring_float32_scratch", options=worlds(3),
           why="ring's receive buffer made with torch.empty(n): float32 whatever the tensor's dtype; gloo ends the "
               "process that receives too many bytes, so the verdict must say where that rank was",
           edits=[("    incoming = scratch(tensor, max(c.numel() for c in chunks))\n",
                   "    incoming = torch.empty(max(c.numel() for c in chunks))   # one chunk's room\n")],
           expect={"ring_allreduce": ("fail", r"W=3, 1,009 elements, float64: ranks? .*ended during the call.*"
                                              r"(at|died at) allreduce\.py:\d+ in sendrecv: .*\(called from allreduce\.py:"
                                              r"{line:        sendrecv(chunks[send_i], right, buf, left, group)} "
                                              r"in ring_allreduce: sendrecv\(chunks\[send_i\], right, buf, left, group\)\).*"
                                              r"Received data size doesn't match.*tensor's dtype")}),
    Faulty("naive_no_group_parameter", options=worlds(2),
           why="naive without the group parameter of the interface",
           edits=[("def naive_allreduce(tensor, group=None):", "def naive_allreduce(tensor):")],
           expect={"naive_allreduce": ("fail", r"must accept group=None")}),
    Faulty("naive_returns_new_tensor", options=worlds(2),
           why="naive builds the sum in a new tensor and returns it; the caller's tensor is unchanged",
           edits=[("        return\n    if rank == 0:\n",
                   "        return\n    total = tensor.clone()\n    if rank == 0:\n"),
                  (NAIVE_ADD, "            total = total + incoming\n"),
                  ("dist.send(tensor, dst=peer(group, dst)", "dist.send(total, dst=peer(group, dst)"),
                  ("        dist.recv(tensor, src=peer(group, 0), group=group)\n",
                   "        dist.recv(total, src=peer(group, 0), group=group)\n    return total\n")],
           expect={"naive_allreduce": ("fail", r"W=2.*returned the sum as a new tensor")}),
    Faulty("naive_uses_all_reduce", options=worlds(2),
           why="'naive' calls the library's all_reduce: not allowed",
           edits=[(NAIVE_BODY, "    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)\n")],
           expect={"naive_allreduce": ("fail", r"calls dist\.all_reduce .*:{line:dist.all_reduce(tensor} ")}),
    Faulty("naive_recv_before_send", options=worlds(2),
           why="in naive the other ranks wait for the result before sending their own part: everybody waits",
           edits=[("        dist.send(tensor, dst=peer(group, 0), group=group)\n"
                   "        dist.recv(tensor, src=peer(group, 0), group=group)\n",
                   "        dist.recv(tensor, src=peer(group, 0), group=group)   # rank 0 first waits for our part\n"
                   "        dist.send(tensor, dst=peer(group, 0), group=group)\n")],
           expect={"naive_allreduce": ("fail", r"W=2.*deadlock.*ranks \[0, 1\].*rank 1 was waiting at "
                                               r"allreduce\.py:{line:dist.recv(tensor, src=peer(group, 0)}")}),
    Faulty("ring_averages", options=worlds(2),
           why="ring divides by W at the end, as DDP does for gradients: all-reduce(sum) must not",
           edits=[(RING_GATHER, RING_GATHER + "    tensor /= world\n")],
           expect={"ring_allreduce": ("fail", r"W=2, 1,009 elements, float32.*the mean")}),
    Faulty("ring_missing", options=worlds(2), why="ring_allreduce not written at all (renamed)",
           edits=[("def ring_allreduce(tensor, group=None):", "def my_ring(tensor, group=None):")],
           expect={"ring_allreduce": ("missing", r"no function ring_allreduce")}),
    # right sums with what only the traffic shows: the checker meters each rank's sends and receives
    Faulty("ring_exchanges_with_every_rank", options=worlds(3),
           why="'ring': every rank sends its whole tensor to every other rank and adds what comes",
           edits=[(RING_LOOPS, "    total = flat.clone()\n"
                               "    for step in range(1, world):   # every other rank's tensor, straight from it\n"
                               "        dst, src = peer(group, (rank + step) % world), peer(group, (rank - step) % world)\n"
                               "        buf = scratch(tensor, n)\n"
                               "        sendrecv(flat, dst, buf, src, group)\n"
                               "        total += buf\n"
                               "    flat.copy_(total)\n")],
           expect={"ring_allreduce": ("fail", r"W=3, .*: the sum is right, but group rank 0 sent to ranks \[1, 2\] and "
                                              r"received from \[1, 2\]: in a ring each rank sends only to its right "
                                              r"neighbour \(rank 1\)")}),
    Faulty("ring_passes_whole_tensors", options=worlds(3),
           why="'ring': the whole tensor is passed round the ring W-1 times, not one chunk per step",
           edits=[(RING_LOOPS, "    total, passing = flat.clone(), flat.clone()\n"
                               "    for step in range(world - 1):   # the whole tensor, passed round the ring\n"
                               "        buf = torch.empty_like(flat)\n"
                               "        sendrecv(passing, right, buf, left, group)\n"
                               "        total += buf\n"
                               "        passing = buf\n"
                               "    flat.copy_(total)\n")],
           expect={"ring_allreduce": ("fail", r"W=3, 1,009 elements, float32: .*the sum is right, but group rank 0 "
                                              r"sent 8,072 B; a ring sends 2 \(W-1\) chunks of at most ceil\(n/W\) "
                                              r"elements, 5,392 B here \(n = 1,009, W = 3\)")}),
    Faulty("tree_is_a_star", options=worlds(4),
           why="'tree': rank 0 receives from every rank, adds, and sends the sum back to each (the naive star)",
           edits=[("    mask = 1\n    while mask < world:                               # reduce towards rank 0\n",
                   "    if rank == 0:   # every rank to rank 0 and back\n"
                   "        for src in range(1, world):\n"
                   "            dist.recv(incoming, src=peer(group, src), group=group)\n"
                   "            tensor += incoming\n"
                   "        for dst in range(1, world):\n"
                   "            dist.send(tensor, dst=peer(group, dst), group=group)\n"
                   "    else:\n"
                   "        dist.send(tensor, dst=peer(group, 0), group=group)\n"
                   "        dist.recv(tensor, src=peer(group, 0), group=group)\n"
                   "    return\n"
                   "    mask = 1\n    while mask < world:                               # reduce towards rank 0\n")],
           expect={"tree_allreduce": ("fail", r"W=4, .*the sum is right, but group rank 0 exchanged with 3 ranks "
                                              r"\(\[1, 2, 3\]\); in a tree each rank talks to its parent and its "
                                              r"children only, at most ceil\(log2 W\) = 2 ranks at W = 4")}),
    Faulty("tree_is_a_chain", options=worlds(4),
           why="'tree' as a chain: each rank adds what the next one sends and passes it on, then the sum comes back "
               "the same way (two partners at most, but 2 (W-1) rounds)",
           edits=[("    mask = 1\n    while mask < world:                               # reduce towards rank 0\n",
                   "    if rank + 1 < world:   # a chain: W-1 hops up, W-1 hops back\n"
                   "        dist.recv(incoming, src=peer(group, rank + 1), group=group)\n"
                   "        tensor += incoming\n"
                   "    if rank > 0:\n"
                   "        dist.send(tensor, dst=peer(group, rank - 1), group=group)\n"
                   "        dist.recv(tensor, src=peer(group, rank - 1), group=group)\n"
                   "    if rank + 1 < world:\n"
                   "        dist.send(tensor, dst=peer(group, rank + 1), group=group)\n"
                   "    return\n"
                   "    mask = 1\n    while mask < world:                               # reduce towards rank 0\n")],
           expect={"tree_allreduce": ("fail", r"W=4, .*the sum is right, but it takes 6 rounds, each message sent "
                                              r"only after the one before it arrived: 3 -> 2 -> 1 -> 0 -> 1 -> 2 -> 3 "
                                              r"\(group ranks\)\. A tree takes at most 2 ceil\(log2 W\) = 4 at W = 4")}),
    Faulty("naive_swaps_with_every_rank", options=worlds(3),
           why="'naive' as an all-to-all: every rank swaps its own tensor with every other rank and adds what comes, "
               "where the naive algorithm sends every tensor to rank 0, which sends the sum back",
           edits=[(NAIVE_BODY, "    if world == 1 or tensor.numel() == 0:\n        return\n"
                               "    mine = tensor.clone()\n"
                               "    for step in range(1, world):\n"
                               "        src = peer(group, (rank - step) % world)\n"
                               "        buf = torch.empty_like(tensor)\n"
                               "        sendrecv(mine, peer(group, (rank + step) % world), buf, src, group)\n"
                               "        tensor += buf\n")],
           expect={"naive_allreduce": ("fail", r"W=3, .*the sum is right, but group rank 1 exchanged with ranks "
                                               r"\[0, 2\]: in the naive all-reduce every rank sends its tensor to "
                                               r"rank 0 and receives the sum back from it")}),
    Faulty("ring_blocking_chain", options=worlds(3),
           why="ring with blocking send/recv, rank 0 sending first and every other rank receiving first: right "
               "neighbours and bytes, but each step is a chain of W messages round the ring",
           edits=[("        sendrecv(chunks[send_i], right, buf, left, group)\n",
                   "        if rank == 0:   # rank 0 starts each step, the others pass it on\n"
                   "            dist.send(chunks[send_i], right, group)\n"
                   "            dist.recv(buf, left, group)\n"
                   "        else:\n"
                   "            dist.recv(buf, left, group)\n"
                   "            dist.send(chunks[send_i], right, group)\n"),
                  (RING_GATHER, "        if rank == 0:\n"
                                "            dist.send(chunks[send_i], right, group)\n"
                                "            dist.recv(chunks[recv_i], left, group)\n"
                                "        else:\n"
                                "            dist.recv(chunks[recv_i], left, group)\n"
                                "            dist.send(chunks[send_i], right, group)\n")],
           expect={"ring_allreduce": ("fail", r"W=3, 1,009 elements, float32: .*the sum is right, but it takes 12 "
                                              r"rounds.*3 messages per step\. A ring takes 2 \(W-1\) = 4 at W = 3.*"
                                              r"post each step's send and receive together")}),
    Faulty("ring_even_odd_blocking", options=worlds(3, 4), expect={},
           why="the control for the ring's rounds: blocking send/recv ordered even/odd (the hang hint's advice) "
               "takes two rounds a step, which passes",
           edits=[("        sendrecv(chunks[send_i], right, buf, left, group)\n",
                   "        if rank % 2 == 0:\n"
                   "            dist.send(chunks[send_i], right, group)\n"
                   "            dist.recv(buf, left, group)\n"
                   "        else:\n"
                   "            dist.recv(buf, left, group)\n"
                   "            dist.send(chunks[send_i], right, group)\n"),
                  (RING_GATHER, "        if rank % 2 == 0:\n"
                                "            dist.send(chunks[send_i], right, group)\n"
                                "            dist.recv(chunks[recv_i], left, group)\n"
                                "        else:\n"
                                "            dist.recv(chunks[recv_i], left, group)\n"
                                "            dist.send(chunks[send_i], right, group)\n")]),
    Faulty("ring_cuts_rows", options=worlds(2),
           why="ring cuts a 2-D tensor along its rows (tensor_split): the chunks are uneven, one holds 6 of 9 elements",
           edits=[(RING_BOUNDS + RING_CHUNKS, "    chunks = list(tensor.tensor_split(world))   # along dim 0\n"),
                  ("        buf = incoming[: chunks[recv_i].numel()]\n",
                   "        buf = incoming[: chunks[recv_i].numel()].view(chunks[recv_i].shape)\n")],
           expect={"ring_allreduce": ("fail", r"W=2, a 2-D tensor of shape \(3, 3\), float32: .*sent a message of 6 "
                                              r"elements; a ring's chunks hold at most ceil\(n/W\) = 5.*flattened "
                                              r"elements")}),
    Faulty("tree_chain_any_source", options=worlds(4),
           why="'tree' as a chain whose receives name no source (dist.recv without src): the rounds are measured "
               "from where each message came from",
           edits=[("    mask = 1\n    while mask < world:                               # reduce towards rank 0\n",
                   "    if rank + 1 < world:\n"
                   "        dist.recv(incoming, group=group)   # from any source\n"
                   "        tensor += incoming\n"
                   "    if rank > 0:\n"
                   "        dist.send(tensor, dst=peer(group, rank - 1), group=group)\n"
                   "        dist.recv(tensor, group=group)\n"
                   "    if rank + 1 < world:\n"
                   "        dist.send(tensor, dst=peer(group, rank + 1), group=group)\n"
                   "    return\n"
                   "    mask = 1\n    while mask < world:                               # reduce towards rank 0\n")],
           expect={"tree_allreduce": ("fail", r"W=4, .*the sum is right, but it takes 6 rounds, each message "
                                              r"sent only after the one before it arrived: 3 -> 2 -> 1 -> 0 -> 1 -> 2 "
                                              r"-> 3")}),
    Faulty("ring_overwrites_in_reduce_scatter", options=worlds(2),
           why="ring's reduce-scatter copies the received chunk instead of adding it: every element is wrong",
           edits=[("        chunks[recv_i] += buf\n", "        chunks[recv_i].copy_(buf)\n")],
           expect={"ring_allreduce": ("fail", r"W=2, 1,009 elements, float32.*1009 of 1009 elements wrong.*"
                                              r"chunk 0 \(elements 0\.\.503\) holds the sum of rank \d only.*"
                                              r"no chunk holds the full sum.*reduce-scatter")}),
    Faulty("ring_short_all_gather", options=worlds(3),
           why="ring's all-gather runs W-2 steps: one chunk per rank never arrives",
           edits=[("    for step in range(world - 1):\n        send_i, recv_i = (rank + 1 - step)",
                   "    for step in range(world - 2):\n        send_i, recv_i = (rank + 1 - step)")],
           expect={"ring_allreduce": ("fail", r"W=3, 1,009 elements, float32.*hold the full sum, but chunk \d .*"
                                              r"all-gather did not bring")}),
    Faulty("ring_send_before_recv", options=worlds(2),
           why="ring with a blocking send then recv on every rank: everybody sends, nobody receives",
           edits=[("        sendrecv(chunks[send_i], right, buf, left, group)\n",
                   "        dist.send(chunks[send_i], right, group)   # blocks until the right neighbour receives\n"
                   "        dist.recv(buf, left, group)\n"),
                  (RING_GATHER, "        dist.send(chunks[send_i], right, group)\n"
                                "        dist.recv(chunks[recv_i], left, group)\n")],
           # "a deadlock": the ranks saw each other wait, before the deadline; each rank's line
           expect={"ring_allreduce": ("fail", r"W=2, 1,009 elements, float32: did not finish: a deadlock, ranks \[0, 1\] "
                                              r"did not return; every rank was waiting on another.*\nrank 0 was waiting at "
                                              r"allreduce\.py:{line:dist.send(chunks[send_i], right}.*\nrank 1 was waiting "
                                              r"at allreduce\.py:{line:dist.send(chunks[send_i], right}")}),
    Faulty("ring_tail_lost", options=worlds(2),
           why="ring with chunk size n // W for every chunk: the last n % W elements are never reduced",
           edits=[(RING_BOUNDS, "    bounds = [i * (n // world) for i in range(world + 1)]\n")],
           expect={"ring_allreduce": ("fail", r"W=2, 1,009 elements.*1 of 1009 elements wrong.*chunk boundaries")}),
    Faulty("ring_torch_chunk", options=worlds(2),
           why="ring cuts the tensor with torch.chunk: fewer than W chunks when n is small (n=1, W=2 gives 1)",
           edits=[(RING_BOUNDS + RING_CHUNKS, "    chunks = list(torch.chunk(flat, world))\n")],
           expect={"ring_allreduce": ("fail", r"W=2, 1 element,.*IndexError")}),
    Faulty("tree_no_broadcast", options=worlds(2),
           why="tree reduces to rank 0 and forgets to broadcast the result back",
           edits=[(TREE_BROADCAST, "")],
           expect={"tree_allreduce": ("fail", r"W=2.*rank 1: .*never comes back")}),
    Faulty("tree_pow2_only", options=worlds(2, 3),
           why="recursive doubling without the fix for a world size that is not a power of two",
           edits=[(TREE_REDUCE + TREE_BROADCAST,
                   "    distance = 1\n"
                   "    while distance < world:\n"
                   "        partner = rank ^ distance                  # may be >= world when W is not 2**k\n"
                   "        received = torch.empty_like(tensor)\n"
                   "        reqs = [dist.isend(tensor.clone(), partner), dist.irecv(received, partner)]\n"
                   "        for q in reqs:\n"
                   "            q.wait()\n"
                   "        tensor += received\n"
                   "        distance *= 2\n")],
           # gloo would read past its table of peers for rank 3 (a wait, or a crash): the harness refuses the peer
           expect={"tree_allreduce": ("fail", r"W=3, 1,009 elements, float32: ranks \[1, 2\] \(rank 1 shown\): raised "
                                              r"ValueError: Invalid peer rank 3 for isend/send: the group has ranks 0\.\.2 "
                                              r"\(at allreduce\.py:{line:reqs = [dist.isend(tensor.clone(), partner)}.*\n"
                                              r"rank 0 was waiting at allreduce\.py:{line:            q.wait()}.*"
                                              r"every case at W=2 passed and W=3 is the "
                                              r"first world size that is not a power of two")}),
    Faulty("tree_rebinds_name", options=worlds(2),
           why="tree writes 'tensor = tensor + buf': that rebinds a local name, the caller's tensor keeps its values",
           edits=[("            tensor += incoming\n", "            tensor = tensor + incoming\n"),
                  ("        dist.recv(tensor, src=peer(group, rank - mask), group=group)\n",
                   "        result = torch.empty_like(tensor)\n"
                   "        dist.recv(result, src=peer(group, rank - mask), group=group)\n"
                   "        tensor = result\n")],
           expect={"tree_allreduce": ("fail", r"W=2.*in place")}),
    Faulty("tree_uses_broadcast", options=worlds(2),
           why="tree's second half uses broadcast, imported by name at the top of the file",
           edits=[("import torch.distributed as dist\n",
                   "import torch.distributed as dist\nfrom torch.distributed import broadcast\n"),
                  (TREE_BROADCAST, "    broadcast(tensor, src=0)\n")],
           expect={"tree_allreduce": ("fail", r"calls dist\.broadcast")}),
    # collectives reached another way than dist.NAME: caught where they meet the process group
    Faulty("naive_process_group_object", options=worlds(2),
           why="naive calls the all-reduce method of the ProcessGroup object (dist.group.WORLD)",
           edits=[(NAIVE_BODY, "    (group or dist.group.WORLD).allreduce([tensor]).wait()\n")],
           expect={"naive_allreduce": ("fail", r"calls all_reduce \(through a ProcessGroup object.*"
                                               r":{line:dist.group.WORLD).allreduce}.*only point-to-point")}),
    Faulty("ring_default_group", options=worlds(2),
           why="ring takes the default group from a private helper and calls its allreduce",
           edits=[("import torch.distributed as dist\n",
                   "import torch.distributed as dist\nfrom torch.distributed.distributed_c10d import _get_default_group\n"),
                  (RING_BOUNDS, "    _get_default_group().allreduce(tensor).wait()\n    return\n" + RING_BOUNDS)],
           expect={"ring_allreduce": ("fail", r"calls all_reduce \(through a ProcessGroup object.*"
                                              r":{line:_get_default_group().allreduce}")}),
    Faulty("tree_distributed_c10d", options=worlds(2),
           why="tree calls broadcast through the module torch.distributed.distributed_c10d",
           edits=[("import torch.distributed as dist\n",
                   "import torch.distributed as dist\nimport torch.distributed.distributed_c10d as c10d\n"),
                  (TREE_BROADCAST, "    c10d.broadcast(tensor, src=peer(group, 0), group=group)\n")],
           expect={"tree_allreduce": ("fail", r"calls dist\.broadcast .*:{line:c10d.broadcast(tensor}")}),
    Faulty("naive_functional_collective", options=worlds(2),
           why="naive calls the functional all_reduce (torch.distributed._functional_collectives)",
           edits=[("import torch.distributed as dist\n",
                   "import torch.distributed as dist\nimport torch.distributed._functional_collectives as funcol\n"),
                  (NAIVE_BODY, "    tensor.copy_(funcol.all_reduce(tensor, \"sum\", group or dist.group.WORLD))\n")],
           expect={"naive_allreduce": ("fail", r"calls all_reduce \(through a ProcessGroup object, functional "
                                               r"collectives.*:{line:funcol.all_reduce(tensor}")}),
    Faulty("ring_torch_ops", options=worlds(2),
           why="ring calls the dispatcher's op of the functional all-reduce directly (torch.ops._c10d_functional)",
           edits=[("import torch.distributed as dist\n", "import torch\nimport torch.distributed as dist\n"),
                  (RING_BOUNDS, "    ops = torch.ops._c10d_functional\n"
                                "    name = (group or dist.group.WORLD).group_name\n"
                                "    tensor.copy_(ops.wait_tensor(ops.all_reduce(tensor, 'sum', name)))\n    return\n"
                                + RING_BOUNDS)],
           expect={"ring_allreduce": ("fail", r"calls all_reduce \(through .*torch\.ops.*"
                                              r":{line:ops.wait_tensor(ops.all_reduce(}")}),
    # a subgroup that does not start at global rank 0: send/recv take global ranks, also with group=
    Faulty("naive_group_ranks", options=worlds(4),
           why="naive hands group ranks to send/recv; right on the whole world, wrong on the group [2, 3]",
           edits=[(NAIVE_BODY, group_ranks(NAIVE_BODY))],
           expect={"naive_allreduce": ("fail", r"W=4, group=ranks \[2, 3\] \(dist.new_group\), 1,009 elements.*"
                                               r"Global rank \d is not part of group.*:{line:dist.recv(incoming, src=src}.*"
                                               r"take GLOBAL ranks.*group rank 0 but global rank 2.*get_global_rank")}),
    Faulty("naive_world_ranks", options=worlds(4),
           why="naive sends to group ranks on the whole world (no group=): the group [2, 3] waits for idle ranks",
           edits=[(NAIVE_BODY, group_ranks(NAIVE_BODY).replace(", group=group", ""))],
           expect={"naive_allreduce": ("fail", r"W=4, group=ranks \[2, 3\].*deadlock.*rank 2 was waiting at "
                                               r"allreduce\.py:{line:dist.recv(incoming, src=src)}.*runs on the group "
                                               r"\[2, 3\] only.*get_global_rank")}),
    Faulty("ring_group_ranks", options=worlds(4), why="ring's neighbours as group ranks",
           edits=[(RING_PEERS, group_ranks(RING_PEERS))],
           expect={"ring_allreduce": ("fail", r"W=4, group=ranks \[2, 3\].*not part of group.*take GLOBAL ranks")}),
    Faulty("tree_group_ranks", options=worlds(4), why="tree's partners as group ranks",
           edits=[(TREE_REDUCE + TREE_BROADCAST, group_ranks(TREE_REDUCE + TREE_BROADCAST))],
           expect={"tree_allreduce": ("fail", r"W=4, group=ranks \[2, 3\].*not part of group.*take GLOBAL ranks")}),
    # not a verdict per function: the file does not load
    Faulty("syntax_error", options=worlds(1), why="a syntax error: the whole file fails to load",
           edits=[("def ring_allreduce(tensor, group=None):", "def ring_allreduce(tensor, group=None)")],
           expect={"import": ("fail", r"allreduce\.py:{line:def ring_allreduce(tensor, group=None)}.*SyntaxError")}),
]
