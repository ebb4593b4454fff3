"""Faulty context-parallel submissions that `course check cp` must catch, at the right function and with the right
reason (tests/faulty.py says how a case is declared; tests/test_cp_checker.py runs them). ``("pass", "")``: that
function must still pass. ``world_sizes`` keeps each run short: the one-process cases always run first.
"""
from faulty import Faulty

CP2, GRID = {"world_sizes": (2,)}, {"world_sizes": (4,)}
PASS = ("pass", "")
ALL_REDUCE_CP = "        dist.all_reduce(p.grad, group=cp_group)   # the weights are replicated over cp too\n"
RING_STEP = ("        ops = [dist.P2POp(dist.isend, t, nxt, group) for t in block]\n"
             "        ops += [dist.P2POp(dist.irecv, t, prev, group) for t in incoming]\n"
             "        for request in dist.batch_isend_irecv(ops):\n"
             "            request.wait()\n")
GATHER_BACKWARD = ("        parts = [p.contiguous() for p in grad_output.chunk(cp, dim=1)]\n"
                   "        grad = torch.empty_like(parts[0])\n"
                   "        dist.reduce_scatter(grad, parts, group=ctx.group)   # sum over ranks of each rank's slice\n"
                   "        return grad, None\n")
RING_LOOP = ("    for _ in range(cp - 1):\n        incoming = [torch.empty_like(t) for t in block]\n"
             "        # post every send and receive before waiting on any: blocking sends on every rank would all wait\n"
             + RING_STEP + "        block = incoming\n"
             "        out_b, lse_b = block_attention(q, block[0], block[1], positions, block[2])\n"
             "        out, lse = merge_partials(out, lse, out_b, lse_b)\n")

CASES = [
    Faulty("mask_at_local_indices", options=CP2,
           why="the causal mask built from the shard's own indices, as in one process",
           edits=[("    future = key_positions[None, :] > positions[:, None]\n",
                   "    future = torch.ones(q.shape[1], keys.shape[1], dtype=torch.bool).triu(1)\n")],
           expect={"cp_attention": ("fail", r"cp=2, plain split, this rank's positions \[4, 5, 6, 7\]: the causal mask "
                                            r"is taken at local indices"),
                   "gather_sequence": PASS, "ring_attention": PASS}),
    Faulty("gather_without_backward", options=CP2,
           why="the gather's backward keeps this rank's own slice of the gradient (no reduce-scatter)",
           edits=[("        dist.reduce_scatter(grad, parts, group=ctx.group)   # sum over ranks of each "
                   "rank's slice\n",
                   "        grad = parts[dist.get_rank(ctx.group)]\n")],
           expect={"gather_sequence": ("fail", "gather without its backward: .*reduce-scatter"),
                   "cp_attention": ("fail", r"gather without its backward: k\.grad holds only what this rank's queries "
                                            r"contributed.*\n\(cp_attention is built on gather_sequence"),
                   "unshard_sequence": PASS, "ring_attention": PASS}),
    Faulty("gather_plain_all_gather", options=CP2,
           why="gather_sequence a plain function around dist.all_gather: no autograd at all",
           edits=[("    return _GatherSequence.apply(t, group)",
                   "    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]\n"
                   "    dist.all_gather(parts, t.detach().contiguous(), group=group)\n"
                   "    return torch.cat(parts, dim=1)")],
           expect={"gather_sequence": ("fail", "does not require grad: a plain dist.all_gather has no backward"),
                   "cp_attention": ("fail", r"q\.grad is None|\.grad is None: the gather of k and v must be "
                                            r"differentiable"),
                   "reduce_shared_grads": PASS}),
    Faulty("gather_group_ignored", options=GRID, why="the gather all-gathers over every rank, not the cp group",
           edits=[("        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]\n"
                   "        dist.all_gather(parts, t.contiguous(), group=group)\n",
                   "        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]\n"
                   "        dist.all_gather(parts, t.contiguous())\n")],
           expect={"gather_sequence": ("fail", r"4 ranks, dp=2 x cp=2, group= given: .*must concatenate every rank's "
                                               r"shard.*\n\(it passes when the group is every rank but not with dp=2 x "
                                               r"cp=2: pass group=\.\.\. to every collective"),
                   "reduce_shared_grads": PASS, "ring_attention": PASS}),
    Faulty("grads_over_dp_only", options=GRID, why="the shared weights' grads averaged over the dp group alone",
           edits=[(ALL_REDUCE_CP, ""),
                  ("    ranks = dist.get_world_size(dp_group) * dist.get_world_size(cp_group)",
                   "    ranks = dist.get_world_size(dp_group)")],
           expect={"reduce_shared_grads": ("fail", r"4 ranks, dp=2 x cp=2, group= given: .*the gradients are "
                                                   r"averaged over dp only"),
                   "cp_attention": PASS}),
    Faulty("grads_over_dp_only_cp2", options=CP2, why="the same mistake where dp = 1: nothing is reduced",
           edits=[(ALL_REDUCE_CP, ""),
                  ("    ranks = dist.get_world_size(dp_group) * dist.get_world_size(cp_group)",
                   "    ranks = dist.get_world_size(dp_group)")],
           expect={"reduce_shared_grads": ("fail", r"cp=2: .*the gradients are not reduced over cp")}),
    Faulty("grads_not_reduced", options=GRID, why="reduce_shared_grads does nothing",
           edits=[("        dist.all_reduce(p.grad, group=dp_group)\n" + ALL_REDUCE_CP + "        p.grad /= ranks\n",
                   "        pass\n")],
           expect={"reduce_shared_grads": ("fail", "not reduced at all")}),
    Faulty("grads_summed", options=CP2, why="the grads summed over dp x cp, not averaged",
           edits=[("        p.grad /= ranks\n", "")],
           expect={"reduce_shared_grads": ("fail", r"summed, not averaged: divide by dp \* cp = 2")}),
    Faulty("ring_without_lse", options=CP2, why="partial softmaxes averaged: no log-sum-exp correction",
           edits=[("    lse = torch.logaddexp(lse_a, lse_b)\n",
                   "    return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)\n"
                   "    lse = torch.logaddexp(lse_a, lse_b)\n")],
           expect={"merge_partials": ("fail", "averages the two partial outputs.*log-sum-exp correction"),
                   "ring_attention": ("fail", r"ring attention without the log-sum-exp correction.*\n"
                                              r"\(ring_attention is built on merge_partials"),
                   "cp_attention": PASS}),
    Faulty("ring_send_then_recv", options=CP2,
           why="every rank sends its block to the next with a blocking send before it receives: a deadlock",
           edits=[(RING_STEP, "        for t in block:\n            dist.send(t, nxt, group)\n"
                              "        for t in incoming:\n            dist.recv(t, prev, group)\n")],
           expect={"ring_attention": ("fail", r"did not finish: a deadlock.*\nrank 0 was waiting at cp\.py:"
                                              r"{line:            dist.send(t, nxt, group)}[\s\S]*\nhint: "
                                              r"with gloo a send waits for its matching recv"),
                   "reduce_shared_grads": PASS}),
    Faulty("ring_exchanges_with_every_rank", options={"world_sizes": (3,)},
           why="every rank sends its block to every other rank at once: right values, all cp blocks held",
           edits=[("    for _ in range(cp - 1):\n        incoming = [torch.empty_like(t) for t in block]\n",
                   "    ranks = [r if group is None else dist.get_global_rank(group, r) for r in range(cp)]\n"
                   "    for peer in [r for r in range(cp) if r != me]:\n"
                   "        incoming = [torch.empty_like(t) for t in block]\n"
                   "        nxt = prev = ranks[peer]\n"),
                  ("        block = incoming\n        out_b, lse_b = block_attention(q, block[0], block[1], positions, "
                   "block[2])\n",
                   "        out_b, lse_b = block_attention(q, incoming[0], incoming[1], positions, incoming[2])\n")],
           expect={"ring_attention": ("fail", r"cp=3: .*rank 0 of the cp group sent to ranks \[1, 2\] and received "
                                              r"from \[1, 2\]; in a ring each rank sends only to the next"),
                   "cp_attention": PASS}),
    Faulty("ring_collects_every_block_first", options={"world_sizes": (3,)},
           why="a ring with its neighbours only, that keeps every block it receives and computes once all are there",
           edits=[("    for _ in range(cp - 1):\n        incoming = [torch.empty_like(t) for t in block]\n",
                   "    kept = []\n"
                   "    for _ in range(cp - 1):\n        incoming = [torch.empty_like(t) for t in block]\n"),
                  ("        block = incoming\n        out_b, lse_b = block_attention(q, block[0], block[1], positions, "
                   "block[2])\n        out, lse = merge_partials(out, lse, out_b, lse_b)\n",
                   "        block = incoming\n        kept.append(block)\n"
                   "    for block in kept:\n"
                   "        out_b, lse_b = block_attention(q, block[0], block[1], positions, block[2])\n"
                   "        out, lse = merge_partials(out, lse, out_b, lse_b)\n")],
           expect={"ring_attention": ("fail", r"cp=3: .*rank 0 of the cp group received 2 key/value blocks before it "
                                              r"used one of them \(block_attention\); a ring computes with each block "
                                              r"as it arrives"),
                   "cp_attention": PASS}),
    Faulty("attention_gathers_q_too", options=CP2,
           why="q gathered as well, the whole sequence's attention computed on every rank and its shard kept",
           edits=[("    keys, values = gather_sequence(k, group), gather_sequence(v, group)\n",
                   "    keys, values = gather_sequence(k, group), gather_sequence(v, group)\n"
                   "    queries = gather_sequence(q, group)\n"),
                  ("    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
                   "    future = key_positions[None, :] > positions[:, None]\n"
                   "    return scores.masked_fill(future, float(\"-inf\")).softmax(dim=-1) @ values\n",
                   "    scores = queries @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
                   "    future = key_positions[None, :] > key_positions[:, None]\n"
                   "    whole = scores.masked_fill(future, float(\"-inf\")).softmax(dim=-1) @ values\n"
                   "    me, s = dist.get_rank(group), q.shape[1]\n"
                   "    return whole[:, me * s:(me + 1) * s]\n")],
           expect={"cp_attention": ("fail", r"cp=2: .*cp_attention gave 768 bytes of floating-point tensors to "
                                            r"all-gathers in forward; the keys and values need only this rank's k and "
                                            r"v, 512 bytes"),
                   "gather_sequence": PASS, "ring_attention": PASS}),
    Faulty("ring_gathers_then_scatters", options=CP2,
           why="no ring: the blocks gathered on rank 0 and the whole sequence scattered back, an all-gather in two",
           edits=[(RING_LOOP,
                   "    root = 0 if group is None else dist.get_global_rank(group, 0)\n"
                   "    for i, t in enumerate(block):\n"
                   "        parts = [torch.empty_like(t) for _ in range(cp)]\n"
                   "        dist.gather(t, parts if me == 0 else None, dst=root, group=group)\n"
                   "        whole = torch.cat(parts, dim=1 if t.dim() > 1 else 0)\n"
                   "        dist.scatter(whole, [whole] * cp if me == 0 else None, src=root, group=group)\n"
                   "        block[i] = whole\n"
                   "    out, lse = block_attention(q, block[0], block[1], positions, block[2])\n")],
           expect={"ring_attention": ("fail", r"ring_attention called 3 x gather, 3 x scatter: pass the key/value "
                                              r"blocks around the ring with send/recv"),
                   "cp_attention": PASS}),
    Faulty("ring_sends_q_too", options=CP2,
           why="the ring passes q around with k, v and positions: right values, a third more bytes every step",
           edits=[("    block = [k.contiguous(), v.contiguous(), positions.contiguous()]\n",
                   "    block = [k.contiguous(), v.contiguous(), positions.contiguous(), q.contiguous()]\n")],
           expect={"ring_attention": ("fail", r"cp=2: .*rank [01] of the cp group sent 800 bytes to other ranks; a ring "
                                              r"sends its key/value block and their positions to the next rank cp-1 = "
                                              r"1 times: 544 bytes here"),
                   "cp_attention": PASS}),
    Faulty("ring_goes_round_cp_steps", options=CP2,
           why="cp steps round the ring, not cp-1: the last one brings the rank's own block back, and is not used",
           edits=[("    for _ in range(cp - 1):\n", "    for step in range(cp if cp > 1 else 0):\n"),
                  ("        block = incoming\n        out_b", "        block = incoming\n        if step == cp - 1:\n"
                   "            break\n        out_b")],
           expect={"ring_attention": ("fail", r"cp=2: .*sent 1088 bytes to other ranks; a ring sends .*: 544 bytes "
                                              r"here"),
                   "merge_partials": PASS}),
    Faulty("ring_keeps_used_blocks", options={"world_sizes": (4,)},
           why="the ring computes with each block as it comes but keeps every received block in a list",
           edits=[("        block = incoming\n", "        block = incoming\n        kept.append(block)\n"),
                  ("    block = [k.contiguous(), v.contiguous(), positions.contiguous()]\n",
                   "    block = [k.contiguous(), v.contiguous(), positions.contiguous()]\n    kept = []\n")],
           expect={"ring_attention": ("fail", r"cp=4: .*rank [0-3] of the cp group still held 3 received key/value "
                                              r"blocks .* when it called block_attention; a ring holds at most two"),
                   "cp_attention": PASS}),
    Faulty("ring_keeps_partial_outputs", options={"world_sizes": (4,)},
           why="block_attention on each block as it comes, every partial result kept and merged at the end",
           edits=[("        out, lse = merge_partials(out, lse, out_b, lse_b)\n    return out\n",
                   "        parts.append((out_b, lse_b))\n    for out_b, lse_b in parts:\n"
                   "        out, lse = merge_partials(out, lse, out_b, lse_b)\n    return out\n"),
                  ("    out, lse = block_attention(q, k, v, positions, positions)\n",
                   "    out, lse = block_attention(q, k, v, positions, positions)\n    parts = []\n")],
           expect={"ring_attention": ("fail", r"cp=4: .*rank [0-3] of the cp group still held 3 partial outputs of "
                                              r"earlier blocks when it called block_attention"),
                   "cp_attention": PASS}),
    Faulty("split_loses_tokens+unshard_equal_shards", options=CP2,
           why="split_positions cuts S // cp tokens per rank; unshard_sequence assumes equal, contiguous shards",
           edits=[("        return positions.tensor_split(cp)[rank]        # the first seq_len % cp ranks get one "
                   "token more\n",
                   "        n = seq_len // cp\n        return positions[rank * n:(rank + 1) * n]\n"),
                  ("    full[:, positions] = local\n",
                   "    s = local.shape[1]\n    rank = dist.get_rank(group)\n"
                   "    full[:, rank * s:(rank + 1) * s] = local\n")],
           expect={"split_positions": ("fail", r"seq_len=3, cp=2, plain: the split loses tokens \[2\]"),
                   "unshard_sequence": ("fail", r"cp=2: rank[s]? .*tokens \[.*\] are lost"),
                   "gather_sequence": PASS}),
    Faulty("split_duplicates_tokens", options={"world_sizes": ()},
           why="equal shard sizes kept by moving the last shard back: its first tokens are on two ranks",
           edits=[("        return positions.tensor_split(cp)[rank]        # the first seq_len % cp ranks get one "
                   "token more\n",
                   "        size = -(-seq_len // cp)\n        start = min(rank * size, seq_len - size)\n"
                   "        return positions[start:start + size]\n")],
           expect={"split_positions": ("fail", r"seq_len=3, cp=2, plain: the split duplicates tokens \[1\] "
                                               r"\(token 1 is on ranks \[0, 1\]\)"),
                   "merge_partials": PASS}),
    Faulty("ring_concatenates_every_block", options=CP2,
           why="the ring passes blocks on, but grows the keys and values by concatenation and attends once at the end",
           edits=[("    out, lse = block_attention(q, k, v, positions, positions)\n",
                   "    all_k, all_v, all_pos = k, v, positions\n"),
                  ("        block = incoming\n        out_b, lse_b = block_attention(q, block[0], block[1], positions, "
                   "block[2])\n        out, lse = merge_partials(out, lse, out_b, lse_b)\n    return out\n",
                   "        block = incoming\n        all_k = torch.cat([all_k, block[0]], dim=1)\n"
                   "        all_v = torch.cat([all_v, block[1]], dim=1)\n"
                   "        all_pos = torch.cat([all_pos, block[2]])\n"
                   "    out, lse = block_attention(q, all_k, all_v, positions, all_pos)\n    return out\n")],
           expect={"ring_attention": ("fail", r"cp=2: .*rank [01] of the cp group gave block_attention 8 keys at once"
                                              r".*ring attention never holds the whole sequence's keys"),
                   "merge_partials": PASS}),
    Faulty("gather_backward_all_reduces", options=CP2,
           why="the gather's backward all-reduces the whole gradient and keeps its slice: twice a reduce-scatter's "
               "bytes",
           edits=[(GATHER_BACKWARD,
                   "        total = grad_output.contiguous().clone()\n"
                   "        dist.all_reduce(total, group=ctx.group)\n"
                   "        return total.chunk(cp, dim=1)[dist.get_rank(ctx.group)].contiguous(), None\n")],
           expect={"gather_sequence": ("fail", r"cp=2: .*backward of gather_sequence called all_reduce of 384 bytes.*2 "
                                               r"times the 192 bytes of a reduce-scatter"),
                   "cp_attention": PASS}),
    Faulty("gather_forward_all_reduces", options=CP2,
           why="the gather's forward all-reduces a zero-padded whole sequence (unshard's way): twice an all-gather's",
           edits=[("        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]\n"
                   "        dist.all_gather(parts, t.contiguous(), group=group)\n"
                   "        return torch.cat(parts, dim=1)\n",
                   "        cp, r, s = dist.get_world_size(group), dist.get_rank(group), t.shape[1]\n"
                   "        full = t.new_zeros(t.shape[0], cp * s, *t.shape[2:])\n"
                   "        full[:, r * s:(r + 1) * s] = t\n"
                   "        dist.all_reduce(full, group=group)\n        return full\n")],
           expect={"gather_sequence": ("fail", r"cp=2: .*forward of gather_sequence called all_reduce.*an all-reduce "
                                               r"of the whole \[B, cp\*s, F\] tensor sends about twice that"),
                   "cp_attention": PASS}),
    Faulty("attention_unshards_q", options=CP2,
           why="every rank's queries put together with unshard_sequence (an all-reduce), the whole S x S attention "
               "computed and this rank's rows kept",
           edits=[("    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])\n",
                   "    whole = unshard_sequence(q, positions, keys.shape[1], group)\n"
                   "    scores = whole[:, positions] @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])\n")],
           expect={"cp_attention": ("fail", r"cp=2: .*cp_attention gave 512 bytes of floating-point tensors to "
                                            r"all_reduce in forward.*the queries it attends with are its own shard"),
                   "unshard_sequence": PASS, "gather_sequence": PASS}),
    Faulty("grads_over_the_world", options=GRID,
           why="the grads all-reduced over every rank and divided by the world size, the groups ignored",
           edits=[("    ranks = dist.get_world_size(dp_group) * dist.get_world_size(cp_group)\n",
                   "    ranks = dist.get_world_size()\n"),
                  ("        dist.all_reduce(p.grad, group=dp_group)\n" + ALL_REDUCE_CP,
                   "        dist.all_reduce(p.grad)\n")],
           expect={"reduce_shared_grads": ("fail", r"4 ranks, tp=2 x cp=2 \(cp groups \[0, 2\] and \[1, 3\]\), group= "
                                                   r"given: .*averaged over all 4 ranks of the world, not over this "
                                                   r"rank's dp x cp ranks"),
                   "gather_sequence": PASS}),
    Faulty("ring_global_rank", options=GRID,
           why="the ring's place taken from the global rank (dist.get_rank() without the group)",
           edits=[("    cp, me = dist.get_world_size(group), dist.get_rank(group)\n",
                   "    cp, me = dist.get_world_size(group), dist.get_rank()\n")],
           expect={"ring_attention": ("fail", r"4 ranks, tp=2 x cp=2 .*ValueError: ring_attention sends to its own "
                                              r"rank .*dist\.get_rank\(group\)"),
                   "cp_attention": PASS}),
    Faulty("merge_exp_overflows", options={"world_sizes": ()},
           why="merge_partials takes exp of the lse values themselves: inf for large scores",
           edits=[("    lse = torch.logaddexp(lse_a, lse_b)\n"
                   "    # each part was divided by its own denominator exp(lse_x); rescale both to the joint one\n"
                   "    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * "
                   "out_b\n",
                   "    den_a, den_b = torch.exp(lse_a), torch.exp(lse_b)\n    lse = torch.log(den_a + den_b)\n"
                   "    out = (den_a.unsqueeze(-1) * out_a + den_b.unsqueeze(-1) * out_b)\n"
                   "    out = out / (den_a + den_b).unsqueeze(-1)\n")],
           expect={"merge_partials": ("fail", r"merge_partials gives nan or inf when the lse values are large"
                                              r".*subtract the maximum"),
                   "split_positions": PASS}),
    Faulty("ring_barrier_each_step", options=CP2, why="a barrier on the cp group at every step of the ring",
           edits=[("        block = incoming\n        out_b",
                   "        dist.barrier(group=group)\n        block = incoming\n        out_b")],
           expect={"ring_attention": ("fail", r"cp=2: .*ring_attention called 1 x barrier: .*no collective \(a barrier "
                                              r"is one too"),
                   "cp_attention": PASS}),
    Faulty("ring_blocking_by_parity", options=CP2,
           why="blocking send and recv, even ranks sending first and odd ones receiving first: no deadlock, but the "
               "transfers of a step run one after another",
           edits=[(RING_STEP, "        if me % 2 == 0:\n"
                              "            for t in block:\n                dist.send(t, nxt, group)\n"
                              "            for t in incoming:\n                dist.recv(t, prev, group)\n"
                              "        else:\n"
                              "            for t in incoming:\n                dist.recv(t, prev, group)\n"
                              "            for t in block:\n                dist.send(t, nxt, group)\n")],
           expect={"ring_attention": ("fail", r"cp=2: rank 1: .*received a block \(its wait returned\) before it "
                                              r"posted its own send of that step"),
                   "cp_attention": PASS}),
    Faulty("ring_sends_never_waited", options=CP2, why="the ring waits on its receives only, never on its sends",
           edits=[("        for request in dist.batch_isend_irecv(ops):\n            request.wait()\n",
                   "        for request in dist.batch_isend_irecv(ops)[len(block):]:   # the receives\n"
                   "            request.wait()\n")],
           expect={"ring_attention": ("fail", r"cp=2: .*rank 0 of the cp group returned from ring_attention without "
                                              r"waiting for 3 of its sends"),
                   "cp_attention": PASS}),
]

# Right in another style, that must pass: the ring turned the other way (each rank sends to the previous and receives
# from the next); a ring that posts the next transfer before computing with the block it has, then waits.
RIGHT = {
    "ring_reverse_direction": [
        ("    nxt, prev = [r if group is None else dist.get_global_rank(group, r) for r in ((me + 1) % cp, (me - 1) % "
         "cp)]\n",
         "    nxt, prev = [r if group is None else dist.get_global_rank(group, r) for r in ((me - 1) % cp, (me + 1) % "
         "cp)]\n")],
    "ring_overlaps_compute": [
        ("    out, lse = block_attention(q, k, v, positions, positions)\n", "    out = lse = None\n"),
        (RING_LOOP + "    return out\n",
         "    for step in range(cp):\n        requests, incoming = [], None\n"
         "        if step < cp - 1:   # pass this block on before computing with it\n"
         "            incoming = [torch.empty_like(t) for t in block]\n"
         "            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, nxt, group) for t in block]\n"
         "                                              + [dist.P2POp(dist.irecv, t, prev, group) for t in incoming])\n"
         "        out_b, lse_b = block_attention(q, block[0], block[1], positions, block[2])\n"
         "        out, lse = (out_b, lse_b) if out is None else merge_partials(out, lse, out_b, lse_b)\n"
         "        for request in requests:\n            request.wait()\n"
         "        requests = None\n        block = incoming\n    return out\n")],
}
