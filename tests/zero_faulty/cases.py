"""Faulty ZeRO submissions that `course check zero` must catch, at the right piece and with the right reason
(tests/faulty.py says how a case is declared; tests/test_zero_checker.py runs them).

Each is the solution with the mistakes learners make typed in. ``("pass", "")``: that piece must still pass.
"""
from faulty import Faulty

W2 = {"world_sizes": (2,)}
PASS = ("pass", "")
AVERAGE = "        grad /= self.world                       # DDP averages the gradients: sum / W\n"
RS_STEP = ("        send_i, recv_i = (rank - step - 1) % world, (rank - step - 2) % world\n"
           "        buf = incoming[: chunks[recv_i].numel()]\n")
GATHER = ("        flat = self.shard.new_empty(self.numel)\n"
          "        self.all_gather(self.shard, flat, self.group)\n")
FREE = ("        if self.stage == 2:\n"
        "            for p in self.params:                # each rank keeps only its shard's gradient\n"
        "                p.grad = None\n")

CASES = [
    Faulty("averages_twice", options=W2, why="the reduce-scattered gradient is divided by W twice",
           edits=[(AVERAGE, AVERAGE + "        grad /= self.world\n")],
           expect={"ZeRO-1": ("fail", r"step 1 with SGD.*1/W = 1/2 of DDP's: the gradient is divided by W twice"),
                   "ZeRO-2": ("fail", "divided by W twice"), "reduce_scatter": PASS, "all_gather": PASS}),
    Faulty("sums_not_averages", options=W2, why="the gradient is summed over the ranks, not averaged",
           edits=[(AVERAGE, "")],
           expect={"ZeRO-1": ("fail", "W = 2 times DDP's: DDP averages the gradients"), "reduce_scatter": PASS}),
    Faulty("shard_floor", options=W2,
           why="every shard is n // W long: for n not divisible by W the last elements belong to no rank",
           edits=[("    return rank * n // world, (rank + 1) * n // world",
                   "    size = n // world\n    return rank * size, (rank + 1) * size")],
           expect={"shard_range": ("fail", r"elements \d+\.\.\d+ belong to no rank \(n is not divisible by W"),
                   "reduce_scatter": PASS, "all_gather": PASS,   # right for the shards shard_range gives
                   "ZeRO-1": ("fail", r"elements 100\.\.100.*belong to no rank's shard \(shard_range\)")}),
    Faulty("shard_ceil_overlap", options=W2, why="shards of ceil(n/W) that start at rank * floor(n/W): they overlap",
           edits=[("    return rank * n // world, (rank + 1) * n // world",
                   "    return rank * (n // world), min(n, rank * (n // world) + -(-n // world))")],
           expect={"shard_range": ("fail", "an overlap")}),
    Faulty("no_all_gather", options=W2, why="each rank writes back only its own updated shard: nothing is gathered",
           edits=[(GATHER, "        flat = flatten([p.detach() for p in self.params])\n"
                           "        flat[self.start:self.stop] = self.shard\n")],
           expect={"ZeRO-1": ("fail", r"only this rank's shard \(\d+\.\.\d+\) of the parameters was updated.*"
                                      r"all-gather"),
                   "ZeRO-2": ("fail", "all-gather the updated shards"), "all_gather": PASS}),
    Faulty("full_optimizer_state", options=W2,
           why="the inner optimizer holds the whole flat vector: the update is right, the memory is DDP's",
           edits=[("            self.shard = flatten([p.detach() for p in self.params])[self.start:self.stop].clone()",
                   "            self.full = flatten([p.detach() for p in self.params]).clone()\n"
                   "            self.shard = self.full[self.start:self.stop]"),
                  ("        self.optimizer = optimizer_class([self.shard], **defaults)",
                   "        self.optimizer = optimizer_class([self.full], **defaults)"),
                  ("        self.shard.grad = grad\n",
                   "        self.full.grad = torch.zeros_like(self.full)\n"
                   "        self.all_gather(grad, self.full.grad, self.group)\n")],
           expect={"ZeRO-1": ("fail", r"optimizer state on rank \d: \d+ bytes .*DDP's optimizer holds \d+ \(ratio 1\.00"
                                      r".*over this rank's shard only"),
                   "ZeRO-2": ("fail", "ratio 1.00")}),
    Faulty("reduce_scatter_by_all_reduce", options=W2,
           why="reduce_scatter all-reduces the whole vector, then slices it",
           edits=[("    incoming = flat.new_empty(max(c.numel() for c in chunks))\n",
                   "    dist.all_reduce(flat, group=group)\n    return chunks[rank].clone()\n")],
           expect={"reduce_scatter": ("fail", r"reduce_scatter calls dist\.all_reduce: write it with point-to-point"),
                   "all_gather": PASS,
                   "ZeRO-1": ("pass", "the library's collectives"), "ZeRO-2": ("pass", "the library's collectives")}),
    # measured: the all-reduce's bytes (library collectives counted as a ring sends them) and the all-gather's
    Faulty("stage2_all_reduce", options=W2, why="the optimizer all-reduces the whole gradient, then takes its shard: "
                                                "1.5x DDP's traffic, at stage 1 as at stage 2",
           edits=[("        grad = self.reduce_scatter(grads, self.group)\n",
                   "        dist.all_reduce(grads, group=self.group)\n"
                   "        grad = grads[self.start:self.stop].clone()\n")],
           expect={"ZeRO-1": ("fail", r"rank \d sent 1,208 B in one step\(\) \(measured: 400 B handed to "
                                      r"point-to-point sends; dist\.all_reduce of 101 elements \(808 B\).*at most "
                                      r"816 B.*\(1\.5x here\)\. An all-reduce of a tensor sends twice what a "
                                      r"reduce-scatter or an all-gather of it does"),
                   "ZeRO-2": ("fail", r"dist\.all_reduce of 101 elements.*\(1\.5x here\)")}),
    Faulty("gather_by_all_reduce", options=W2, why="the updated shards gathered by an all-reduce of a zero-padded "
                                                   "vector: 1.5x DDP's traffic",
           edits=[(GATHER, "        flat = self.shard.new_zeros(self.numel)\n"
                           "        flat[self.start:self.stop] = self.shard\n"
                           "        dist.all_reduce(flat, group=self.group)\n")],
           expect={"ZeRO-1": ("fail", r"dist\.all_reduce of 101 elements \(808 B\).*\(1\.5x here\)\. An all-reduce "
                                      r"of a tensor sends twice what a reduce-scatter or an all-gather of it does"),
                   "ZeRO-2": ("fail", r"\(1\.5x here\)")}),
    Faulty("stage2_keeps_grads", options=W2, why="stage 2 never frees the full-size gradients",
           edits=[(FREE, "")],
           expect={"ZeRO-1": PASS,
                   "ZeRO-2": ("fail", r"keeps the full-size gradients after step\(\) \(\d+ of \d+ bytes")}),
    Faulty("ring_from_05", options=W2, why="notebook 05's reduce-scatter as it was: rank r ends with chunk r+1",
           edits=[(RS_STEP, "        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world\n"
                            "        buf = incoming[: chunks[recv_i].numel()]\n")],
           expect={"reduce_scatter": ("fail", r"rank 0 \(shard 0\.\.504\): the finished sum in flat is rank 1's shard"
                                              r".*\(r-step-1\)"),
                   "ZeRO-1": ("pass", "the library's collectives")}),
    # the deadline stays the default: "a deadlock" comes from the ranks' own reports, as soon as both wait
    Faulty("all_gather_blocking_send", options=W2,
           why="blocking send before recv on every rank: a deadlock under gloo",
           edits=[("        sendrecv(chunks[send_i], right, chunks[recv_i], left, group)\n",
                   "        dist.send(chunks[send_i], right, group=group)\n"
                   "        dist.recv(chunks[recv_i], left, group=group)\n")],
           expect={"all_gather": ("fail", r"did not finish: a deadlock, ranks \[0, 1\] did not return; every rank "
                                          r"was waiting on another.*\nrank 0 was waiting at zero\.py:"
                                          r"{line:dist.send(chunks[send_i]}.*\nrank 1 was waiting at zero\.py:"
                                          r"{line:dist.send(chunks[send_i]}"),
                   "reduce_scatter": PASS, "ZeRO-1": ("pass", "the library's collectives")}),
    Faulty("syntax_error", options=W2, why="a missing colon",
           edits=[("def shard_range(n, rank, world):", "def shard_range(n, rank, world)")],
           expect={"zero.py": ("fail", "does not load: SyntaxError")}),
]

# Mistakes the values cannot show: measured (memory held, bytes sent) or counted (which collectives ran).
CASES += [
    Faulty("stage2_grads_in_attribute", options=W2,
           why="stage 2 frees p.grad but keeps the full-size gradient in an attribute of another name",
           edits=[("        del grads\n", "        self.full_grads = grads\n")],
           expect={"ZeRO-2": ("fail", r"ZeRO-2 on rank \d holds [\d,]+ B of tensors beyond the parameters after "
                                      r"step\(\); its count is [\d,]+ B.*zero\.full_grads \(101 elements, 808 B\)"),
                   "ZeRO-1": ("fail", r"zero\.full_grads \(101 elements"), "reduce_scatter": PASS}),
    # kept where no attribute of the optimizer leads: the checker measures what step() made and left alive
    Faulty("stage2_grads_in_class_attribute", options=W2,
           why="stage 2 keeps the full-size gradient in a class attribute (type(self).last_grads)",
           edits=[("        del grads\n", "        type(self).last_grads = grads\n")],
           expect={"ZeRO-2": ("fail", r"ZeRO-2 on rank \d holds [\d,]+ B .*The largest: class attribute "
                                      r"ZeroOptimizer\.last_grads \(101 elements, 808 B\)"),
                   "ZeRO-1": ("fail", r"class attribute ZeroOptimizer\.last_grads"), "reduce_scatter": PASS}),
    Faulty("stage2_grads_in_global_list", options=W2,
           why="stage 2 appends the full-size gradient to a module-level list",
           edits=[("        del grads\n", "        KEPT.append(grads)\n"),
                  ("def flatten(tensors):", "KEPT = []\n\n\ndef flatten(tensors):")],
           expect={"ZeRO-2": ("fail", r"The largest: an item of global KEPT \(101 elements, 808 B\)"),
                   "ZeRO-1": ("fail", r"an item of global KEPT")}),
    Faulty("stage2_grads_in_closure", options=W2,
           why="stage 2 keeps the full-size gradient in a closure (self.kept = lambda: grads)",
           edits=[("        del grads\n", "        self.kept = lambda: grads\n")],
           expect={"ZeRO-2": ("fail", r"The largest: a variable of a closure \(101 elements, 808 B\)"),
                   "ZeRO-1": ("fail", r"a variable of a closure")}),
    Faulty("all_reduce_by_own_ring", options=W2,
           why="the gradient is reduce-scattered, then all-gathered whole (an all-reduce, as DDP's) and sliced",
           edits=[("        grad = self.reduce_scatter(grads, self.group)\n",
                   "        grad = self.reduce_scatter(grads, self.group)\n"
                   "        whole = torch.zeros_like(grads)\n"
                   "        self.all_gather(grad, whole, self.group)\n"
                   "        grad = whole[self.start:self.stop].clone()\n")],
           expect={"ZeRO-1": ("fail", r"rank \d sent [\d,]+ B in one step\(\).*must not send more \(1\.5x here\)"),
                   "ZeRO-2": ("fail", r"\(1\.5x here\)"), "reduce_scatter": PASS, "all_gather": PASS}),
]

# Right values, more bytes on the wire than ZeRO's reduce-scatter + all-gather: measured, the library's collectives too.
CASES += [
    Faulty("gather_by_all_reduce", options=W2,
           why="the parameters are gathered by all-reducing a zero-padded full vector: each rank sends all of it",
           edits=[(GATHER, "        flat = self.shard.new_zeros(self.numel)\n"
                           "        flat[self.start:self.stop] = self.shard\n"
                           "        dist.all_reduce(flat, group=self.group)\n")],
           expect={"ZeRO-1": ("fail", r"sent 1,216 B in one step\(\) \(measured: 408 B handed to point-to-point sends; "
                                      r"dist\.all_reduce of 101 elements \(808 B\)"),
                   "ZeRO-2": ("fail", r"dist\.all_reduce of 101 elements"), "all_gather": PASS}),
    Faulty("gathers_optimizer_state", options=W2,
           why="step() all-gathers the optimizer state too (with the library's all-gather), then drops it",
           edits=[(GATHER, GATHER + "        for v in self.optimizer.state[self.shard].values():\n"
                                    "            if torch.is_tensor(v) and v.dim():\n"
                                    "                torch_all_gather(v, v.new_zeros(self.numel), self.group)\n")],
           expect={"ZeRO-1": ("fail", r"sent 1,216 B .*dist\.all_gather_into_tensor of 102 elements \(816 B\).*"
                                      r"\(1\.5x here\)\.$"),
                   "ZeRO-2": ("fail", r"dist\.all_gather_into_tensor of 102 elements")}),
    Faulty("reduce_scatters_twice", options=W2,
           why="the gradient is reduce-scattered twice (the first result unused), once by the library",
           edits=[("        grad = self.reduce_scatter(grads, self.group)\n",
                   "        torch_reduce_scatter(grads.clone(), self.group)\n"
                   "        grad = self.reduce_scatter(grads, self.group)\n")],
           expect={"ZeRO-1": ("fail", r"dist\.reduce_scatter_tensor of 102 elements \(816 B\).*\(1\.5x here\)"),
                   "ZeRO-2": ("fail", r"dist\.reduce_scatter_tensor of 102 elements")}),
    # the checker's model is float64: a float32 step() shows a conversion to float64 on the way
    Faulty("sends_float64", options=W2, why="the gradient is reduce-scattered in float64 whatever the model's dtype",
           edits=[("        grad = self.reduce_scatter(grads, self.group)\n",
                   "        grad = self.reduce_scatter(grads.double(), self.group).to(grads.dtype)\n")],
           expect={"ZeRO-1": ("fail", r"with the model in float32 \(the same step\(\) sent no more than its count in "
                                      r"float64\): rank \d sent 608 B .*at most 408 B \(2 \(W-1\)/W n elements of 4 B.*"
                                      r"converted to float64 they cost twice the bytes"),
                   "ZeRO-2": ("fail", r"with the model in float32"), "reduce_scatter": PASS}),
]

# Right values, more collectives than the step needs, or the wrong stage: counted and measured.
CASES += [
    Faulty("extra_all_reduce", options=W2,
           why="step() all-reduces one number more (a check that every rank holds the same parameters): it fits in "
               "the byte count's slack, but is a collective the step does not need",
           edits=[("        unflatten_into(flat, self.params)\n",
                   "        unflatten_into(flat, self.params)\n"
                   "        dist.all_reduce(flat.sum().reshape(1), group=self.group)   # every rank the same?\n")],
           expect={"ZeRO-1": ("fail", r"step\(\) ran dist\.all_reduce of 1 element \(8 B\) besides the "
                                      r"reduce-scatter and the all-gather"),
                   "ZeRO-2": ("fail", r"dist\.all_reduce of 1 element"), "reduce_scatter": PASS, "all_gather": PASS}),
    Faulty("stage1_frees_grads", options=W2, why="stage 1 frees the full-size gradients too, as only stage 2 should",
           edits=[("        if self.stage == 2:\n", "        if self.stage >= 1:\n")],
           expect={"ZeRO-1": ("fail", r"stage 1 freed the full-size gradients in step\(\): that is stage 2's"),
                   "ZeRO-2": PASS}),
]

# Only W = 4 shows these: a rank's two ring neighbours differ, and the world splits into two groups of 2.
W4 = {"world_sizes": (4,)}
CASES += [
    Faulty("group_ignored", options=W4, why="step() calls reduce_scatter and all_gather without self.group",
           edits=[("        grad = self.reduce_scatter(grads, self.group)\n",
                   "        grad = self.reduce_scatter(grads)\n"),
                  ("        self.all_gather(self.shard, flat, self.group)\n",
                   "        self.all_gather(self.shard, flat)\n")],
           expect={"ZeRO-1": ("fail", r"W=4: .*two groups of 2, rank \d in \[\d, \d\]: rank \d sent to or received from "
                                      r"rank \d of the whole world, outside its group.*pass self\.group"),
                   "ZeRO-2": ("fail", r"outside its group"), "reduce_scatter": PASS, "all_gather": PASS}),
    Faulty("reduce_scatter_owner_by_owner", options=W4,
           why="reduce_scatter: each owner in turn receives every other rank's chunk, blocking send/recv: right "
               "values and bytes, not a ring",
           edits=[(RS_STEP + "        sendrecv(chunks[send_i], right, buf, left, group)\n        chunks[recv_i] += buf\n",
                   "        pass\n"
                   "    for owner in range(world):\n"
                   "        for src in range(world):\n"
                   "            if rank == owner and src != rank and chunks[owner].numel():\n"
                   "                buf = incoming[: chunks[owner].numel()]\n"
                   "                dist.recv(buf, peer(group, src), group=group)\n"
                   "                chunks[owner] += buf\n"
                   "            elif rank == src and src != owner and chunks[owner].numel():\n"
                   "                dist.send(chunks[owner].contiguous(), peer(group, owner), group=group)\n")],
           expect={"reduce_scatter": ("fail", r"reduce_scatter, W=4: the values are right, but rank 0 sent to ranks "
                                              r"\[1, 2, 3\] and received from \[1, 2, 3\]: .*ring"),
                   "all_gather": PASS}),
]

# Right values, but a claim the check must not make: these pass, and the verdict says what really ran.
HONEST = [
    Faulty("calls_torch_collectives", options=W2,
           why="ZeroOptimizer ignores collectives=\"mine\" and calls the library's collectives",
           edits=[('                                                "torch": (torch_reduce_scatter, torch_all_gather)}'
                   '[collectives]',
                   '                                                "torch": (torch_reduce_scatter, torch_all_gather)}'
                   '["torch"]')],
           expect={"ZeRO-1": ("pass", r"\(on dist\.\w+, dist\.\w+, which step\(\) called directly although it was "
                                      r"given collectives=\"mine\""),
                   "ZeRO-2": ("pass", "called directly although")}),
    Faulty("all_gather_wrong_direction", options=W2,
           why="the all-gather ring sends left and receives from the right: right at W=2 only",
           edits=[("        sendrecv(chunks[send_i], right, chunks[recv_i], left, group)\n",
                   "        sendrecv(chunks[send_i], left, chunks[recv_i], right, group)\n")],
           expect={"all_gather": ("pass", r"only W=2 ran: .*a ring that turns the wrong way gives the same result; "
                                          r"W=4 would show it"),
                   "reduce_scatter": ("pass", "only W=2 ran")}),
    Faulty("parameters_not_contiguous", options=W2,
           why="right, with every matrix kept transposed in memory (the checker once view()ed the parameters)",
           edits=[("        self.params = [p for p in params if p.requires_grad]\n",
                   "        self.params = [p for p in params if p.requires_grad]\n"
                   "        for p in self.params:\n"
                   "            if p.dim() == 2:\n"
                   "                p.data = p.data.t().contiguous().t()\n")],
           expect={"ZeRO-1": ("pass", r"AdamW state on rank 0 / DDP's"), "ZeRO-2": ("pass", r"AdamW state")}),
    Faulty("reduce_and_broadcast_per_shard", options=W2,
           why="right, on the library's reduce and broadcast, one call per shard: the bytes of a reduce-scatter and "
               "an all-gather",
           edits=[("        grad = self.reduce_scatter(grads, self.group)\n",
                   "        grad = None\n"
                   "        for r, (a, b) in enumerate(shards(self.numel, self.world)):\n"
                   "            piece = grads[a:b].clone()\n"
                   "            dist.reduce(piece, peer(self.group, r), group=self.group)\n"
                   "            grad = piece if r == self.rank else grad\n"),
                  (GATHER, "        flat = self.shard.new_empty(self.numel)\n"
                           "        flat[self.start:self.stop] = self.shard\n"
                           "        for r, (a, b) in enumerate(shards(self.numel, self.world)):\n"
                           "            piece = flat[a:b].clone()\n"
                           "            dist.broadcast(piece, peer(self.group, r), group=self.group)\n"
                           "            flat[a:b] = piece\n")],
           expect={"ZeRO-1": ("pass", r"dist\.broadcast, dist\.reduce.*sent by rank 0 in one step\(\): W=2: 808 B"),
                   "ZeRO-2": ("pass", r"sent by rank 0 in one step\(\): W=2: 808 B")}),
]
