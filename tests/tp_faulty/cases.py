"""Faulty tensor-parallel submissions that `course check tp` must catch, at the right piece and with the right
reason (tests/faulty.py says how a case is declared; tests/test_tp_checker.py runs them).

Most are the solution with mistakes typed in; one case holds mistakes in pieces that do not build on each
other, so each must be named on its own. Two are whole files written in their own style. ``("pass", "")``:
that piece must still pass.
"""
from faulty import Faulty

TP2 = {"world_sizes": (2,)}
PASS = ("pass", "")

# numpy-style grid: the LAST name of order varies fastest (used twice)
LAST_FASTEST = [("    strides = [math.prod(shape[:i]) for i in range(len(shape))]",
                 "    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]")]
ROW_BIAS_ONCE = ("        if self.bias is not None:\n"
                 "            y = y + self.bias                            # once, after the sum (not tp times)\n")
ROW_PARTIAL = "        partial = F.linear(x, self.weight)               # X_r B_r: one term of the sum"

# ParallelMLP gathers the whole activation between its layers (to log it) by a way other than dist.all_gather:
# correct numbers and gradients, one collective more than column-then-row needs; the checker must count it
FC2 = "input_is_parallel=True, group=group)\n"
MLP_KEEP_GROUP = ("hidden_size, bias=bias, " + FC2, "hidden_size, bias=bias, " + FC2 + "        self.group = group\n")


def mlp_gathers(gather: str) -> tuple:
    return ("        return self.fc2(F.gelu(self.fc1(x)))",
            "        h = F.gelu(self.fc1(x))\n"
            "        tp, r = dist.get_world_size(self.group), dist.get_rank(self.group)\n"
            + gather +
            "        parts[r] = h   # our own slice keeps its autograd history\n"
            "        full = torch.cat(parts, -1)   # the whole activation, to log its statistics\n"
            "        return self.fc2(full.chunk(tp, -1)[r])")


ATTENTION_SPLIT = "            return y.view(b, t, self.local_heads, self.head_dim).transpose(1, 2)\n"
ATTENTION_SDPA = ("        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), "
                  "heads(self.v(x)))\n")

WITH_FUNCOL = ("import torch.distributed as dist\n",
               "import torch.distributed as dist\nimport torch.distributed._functional_collectives as funcol\n")

# Mistakes only a measure shows (meter.py): a shard that is a view of the whole weight, a whole-size copy kept, a
# collective that sends more than the pattern needs (the values and gradients are all right)
COL_W = "        self.weight = nn.Parameter(torch.empty(out_per_rank, in_features))"
ROW_W = "        self.weight = nn.Parameter(torch.empty(out_features, in_per_rank))"
F_FWD = "        return x.clone()   # identity (a copy, so that autograd sees a new tensor)"
G_FWD = "        out = x.clone()\n        dist.all_reduce(out, group=group)\n        return out"
GATHER = "            y = gather_from_parallel_region(y, self.group)"
ROW_BIAS = "            y = y + self.bias                            # once, after the sum (not tp times)"
QKV = ("        self.q = ColumnParallelLinear(hidden_size, hidden_size, group=group)\n"
       "        self.k = ColumnParallelLinear(hidden_size, hidden_size, group=group)\n"
       "        self.v = ColumnParallelLinear(hidden_size, hidden_size, group=group)\n"
       "        self.proj = RowParallelLinear(hidden_size, hidden_size, input_is_parallel=True, group=group)")
ROOT0 = "dist.get_global_rank(group, 0) if group else 0"

CASES = [
    Faulty("f_forward+g_backward+last_fastest", options=TP2,
           why="f all-reduces in forward; g all-reduces in backward; the last name of order varies fastest",
           edits=[("        ctx.group = group\n"
                   "        return x.clone()   # identity (a copy, so that autograd sees a new tensor)",
                   "        ctx.group = group\n        out = x.clone()\n"
                   "        dist.all_reduce(out, group=group)\n        return out"),
                  ("        return grad_output, None   # identity",
                   "        grad = grad_output.clone()\n"
                   "        dist.all_reduce(grad, group=ctx.group)\n        return grad, None"),
                  ("    def forward(ctx, x, group):\n        out = x.clone()",
                   "    def forward(ctx, x, group):\n        ctx.group = group\n        out = x.clone()"),
                  *LAST_FASTEST],
           expect={"copy_to_parallel_region": ("fail", "must be the identity: it returned tp times the input"),
                   "reduce_from_parallel_region": ("fail", "must be the identity: it all-reduces"),
                   "RowParallelLinear": ("fail", "tp times serial"),
                   "rank_groups": ("fail", "LAST name of order varies fastest")}),
    Faulty("f_backward+g_forward+ignore_order", options=TP2,
           why="f's backward is the identity; g's forward is the identity; rank_groups ignores order",
           edits=[("        grad = grad_output.clone()\n"
                   "        dist.all_reduce(grad, group=ctx.group)\n        return grad, None",
                   "        return grad_output, None"),
                  ("    def forward(ctx, x, group):\n        out = x.clone()\n"
                   "        dist.all_reduce(out, group=group)\n        return out",
                   "    def forward(ctx, x, group):\n        return x.clone()"),
                  ("    names = order.lower().split(\"-\")\n", "    names = \"tp-cp-pp-dp\".split(\"-\")\n")],
           expect={"copy_to_parallel_region": ("fail", "backward of copy_to_parallel_region must all-reduce"),
                   "ColumnParallelLinear": ("fail", "input grads are this rank's part only"),
                   "reduce_from_parallel_region": ("fail", "returned its input unchanged"),
                   "RowParallelLinear": ("fail", "missing reduction"),
                   "ParallelMLP": ("fail", "fix those first"),
                   "rank_groups": ("fail", "order argument is ignored")}),
    Faulty("f_average+row_bias_every_rank", options=TP2,
           why="f's backward divides by tp; the row-parallel bias is added on every rank before the all-reduce",
           edits=[("        dist.all_reduce(grad, group=ctx.group)\n",
                   "        dist.all_reduce(grad, group=ctx.group)\n        grad /= dist.get_world_size(ctx.group)\n"),
                  (ROW_PARTIAL, "        partial = F.linear(x, self.weight, self.bias)"),
                  (ROW_BIAS_ONCE, "")],
           expect={"copy_to_parallel_region": ("fail", "averages the gradients"),
                   "reduce_from_parallel_region": PASS,
                   "RowParallelLinear": ("fail", "bias added tp times"), "rank_groups": PASS}),
    Faulty("column_input_dim+row_bias_rank0", options=TP2,
           why="column-parallel weight split by input features; row-parallel bias added on rank 0 only",
           edits=[("        self.weight = nn.Parameter(torch.empty(out_per_rank, in_features))",
                   "        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp))"),
                  (ROW_PARTIAL, "        partial = F.linear(x, self.weight, "
                                "self.bias if dist.get_rank(self.group) == 0 else None)"),
                  (ROW_BIAS_ONCE, "")],
           expect={"ColumnParallelLinear": ("fail", "split along the input dimension instead of the output dimension"),
                   "RowParallelLinear": ("fail", "bias gets no gradient"),
                   "copy_to_parallel_region": PASS, "reduce_from_parallel_region": PASS}),
    Faulty("gather_ignored+row_output_dim", options=TP2,
           why="gather_output=True does nothing; row-parallel weight split by output features",
           edits=[("        if self.gather_output:\n            y = gather_from_parallel_region(y, self.group)\n", ""),
                  ("        self.weight = nn.Parameter(torch.empty(out_features, in_per_rank))",
                   "        self.weight = nn.Parameter(torch.empty(out_features // tp, in_features))")],
           expect={"ColumnParallelLinear": ("fail", "gather_output=True is ignored"),
                   "RowParallelLinear": ("fail", "split along the output dimension instead of the input dimension")}),
    Faulty("row_bias_split", options=TP2, why="the row-parallel bias is split over the ranks",
           edits=[("        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None",
                   "        self.bias = nn.Parameter(torch.empty(out_features // tp)) if bias else None")],
           expect={"RowParallelLinear": ("fail", "bias is split"), "ColumnParallelLinear": PASS}),
    # bias=False: the cases with a bias cannot show these
    Faulty("column_ignores_bias_false", options=TP2, why="ColumnParallelLinear makes a bias whatever bias= says",
           edits=[("        self.bias = nn.Parameter(torch.empty(out_per_rank)) if bias else None\n",
                   "        self.bias = nn.Parameter(torch.empty(out_per_rank))\n")],
           expect={"ColumnParallelLinear": ("fail", r"ColumnParallelLinear\(bias=False\): \.bias is \[6\]; with "
                                                    r"bias=False there is none"),
                   "RowParallelLinear": PASS, "ParallelSelfAttention": PASS}),
    Faulty("row_adds_none_bias", options=TP2, why="RowParallelLinear adds its bias without asking whether it has one",
           edits=[(ROW_BIAS_ONCE, "        y = y + self.bias\n")],
           expect={"RowParallelLinear": ("fail", r"RowParallelLinear\(bias=False\): forward raised TypeError.*"
                                                 r"tp\.py:{line:        y = y + self.bias}.*if self\.bias is not None"),
                   "ColumnParallelLinear": PASS, "ParallelSelfAttention": PASS}),
    Faulty("mlp_ignores_bias", options=TP2, why="ParallelMLP does not pass bias on to its layers",
           edits=[("ffn_hidden_size, bias=bias, gather_output=False", "ffn_hidden_size, gather_output=False"),
                  ("hidden_size, bias=bias, input_is_parallel=True", "hidden_size, input_is_parallel=True")],
           expect={"ParallelMLP": ("fail", r"ParallelMLP\(bias=False\): \.fc1\.bias is \[8\]; .*must pass bias on "
                                           r"to both layers"),
                   "ColumnParallelLinear": PASS, "RowParallelLinear": PASS}),
    Faulty("row_bias_shared_before_g", options=TP2,
           why="RowParallelLinear adds bias/tp on every rank before the all-reduce: the forward is right, the bias "
               "grad is 1/tp of serial",
           edits=[(ROW_PARTIAL, "        partial = F.linear(x, self.weight, None if self.bias is None else "
                                "self.bias / dist.get_world_size(self.group))"),
                  (ROW_BIAS_ONCE, "")],
           expect={"RowParallelLinear": ("fail", r"bias grads are 1/tp of serial: .*add the whole bias once, after "
                                                 r"reduce_from_parallel_region"),
                   "ColumnParallelLinear": PASS}),
    Faulty("attention_causal", options=TP2, why="attention with a causal mask: the exercise's has none",
           edits=[(ATTENTION_SDPA, ATTENTION_SDPA.replace("heads(self.v(x)))", "heads(self.v(x)), is_causal=True)"))],
           expect={"ParallelSelfAttention": ("fail", r"Your output matches a causal mask"),
                   "ParallelMLP": PASS}),
    Faulty("mlp_gathers+attention_heads", options=TP2,
           why="the MLP gathers between its layers; attention mixes up the head and head_dim axes",
           edits=[("gather_output=False, group=group)\n        self.fc2 = RowParallelLinear(ffn_hidden_size, "
                   "hidden_size, bias=bias, input_is_parallel=True",
                   "gather_output=True, group=group)\n        self.fc2 = RowParallelLinear(ffn_hidden_size, "
                   "hidden_size, bias=bias, input_is_parallel=False"),
                  (ATTENTION_SPLIT.rstrip("\n"),
                   "            return y.view(b, t, self.head_dim, self.local_heads).transpose(1, 3).transpose(2, 3)")],
           expect={"ParallelMLP": ("fail", "communicates more than it needs in forward"),
                   "ParallelSelfAttention": ("fail", "differs from serial multi-head attention"),
                   "ColumnParallelLinear": PASS, "RowParallelLinear": PASS}),
    Faulty("attention_scale_hidden", options=TP2,
           why="attention written out by hand, the scores divided by sqrt(hidden_size) instead of sqrt(head_dim)",
           edits=[(ATTENTION_SDPA, "        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))\n"
                                   "        scores = q @ k.transpose(-2, -1) / x.shape[-1] ** 0.5\n"
                                   "        out = scores.softmax(dim=-1) @ v\n")],
           expect={"ParallelSelfAttention": ("fail", r"forward output differs from serial multi-head attention with 4 "
                                                     r"heads \(max \|difference\| = .*\); the serial reference: per head "
                                                     r"softmax\(q k\^T / sqrt\(head_dim\)\) v, head_dim = hidden_size/"
                                                     r"num_heads = 8/4 = 2;.*Your output matches the scores scaled by "
                                                     r"1/sqrt\(hidden_size\) = 1/sqrt\(8\) instead of 1/sqrt\(head_dim\)"),
                   "ParallelMLP": PASS, "RowParallelLinear": PASS}),
    Faulty("attention_no_transpose", options=TP2,
           why="the heads split with .view(b, t, heads, head_dim) and no .transpose(1, 2): attention over the heads",
           edits=[(ATTENTION_SPLIT, ATTENTION_SPLIT.replace(".transpose(1, 2)", ""))],
           expect={"ParallelSelfAttention": ("fail", r"differs from serial multi-head attention.*the serial reference: "
                                                     r".*\.view\(b, t, heads, head_dim\)\.transpose\(1, 2\).*Your output "
                                                     r"matches the heads split without \.transpose\(1, 2\) \(and merged "
                                                     r"back with it\): attention runs across the heads"),
                   "ParallelMLP": PASS}),
    Faulty("mlp_relu", options=TP2, why="ReLU instead of GELU between the MLP's layers",
           edits=[("        return self.fc2(F.gelu(self.fc1(x)))", "        return self.fc2(F.relu(self.fc1(x)))")],
           expect={"ParallelMLP": ("fail", "uses ReLU"), "ParallelSelfAttention": PASS}),
    Faulty("group_ignored+last_fastest", options={"world_sizes": (2, 4)},
           why="f and g all-reduce over all ranks, not the group; the last name of order varies fastest",
           edits=[("        dist.all_reduce(grad, group=ctx.group)", "        dist.all_reduce(grad)"),
                  ("        dist.all_reduce(out, group=group)", "        dist.all_reduce(out)"), *LAST_FASTEST],
           expect={"copy_to_parallel_region": ("fail", "tp=2 groups inside 4 ranks"),
                   "reduce_from_parallel_region": ("fail", r"pass group=\.\.\. to every collective"),
                   "rank_groups": ("fail", "LAST name"), "init_rank_groups": ("fail", "fix that first")}),
    Faulty("syntax_error", options=TP2, why="a missing colon",
           edits=[("def copy_to_parallel_region(x, group=None):", "def copy_to_parallel_region(x, group=None)")],
           expect={"tp.py": ("fail", "does not load")}),
    # hangs: the checker must name the piece, say it did not finish, and go on to the next pieces
    # (a deadlock is reported as soon as every rank waits on another: "a deadlock" comes from the ranks' own
    # reports, never from the deadline, which stays the default so that a late report fails the pattern)
    Faulty("f_backward_only_rank0_reduces", options=TP2,
           why="only rank 0 calls f's all-reduce in backward",
           edits=[("        dist.all_reduce(grad, group=ctx.group)\n",
                   "        if dist.get_rank(ctx.group) == 0:\n            dist.all_reduce(grad, group=ctx.group)\n")],
           expect={"copy_to_parallel_region": ("fail", r"did not finish: a deadlock, ranks \[0\] did not return "
                                                       r"\(ranks \[1\] did.*\nrank 0 was waiting at tp\.py:"
                                                       r"{line:            dist.all_reduce(grad, group=ctx.group)}"),
                   "reduce_from_parallel_region": PASS, "RowParallelLinear": PASS}),
    Faulty("init_groups_rank0_only", options={"world_sizes": (4,)},
           why="only rank 0 creates the groups, as a coordinator would; new_group waits for every rank",
           edits=[("    for kind in NAMES:\n        for ranks in grid[kind]:\n",
                   "    for kind in NAMES if rank == 0 else ():\n        for ranks in grid[kind]:\n")],
           expect={"init_rank_groups": ("fail", r"4 ranks, tp=2 x dp=2: did not finish: a deadlock, ranks \[0\] did "
                                                r"not return \(ranks \[1, 2, 3\] did, and waited for them\).*"
                                                r"\nrank 0 was waiting at tp\.py:{line:group = dist.new_group(ranks)}"
                                                r".*\nhint: every rank must call dist.new_group for EVERY group.*\n"
                                                r"ranks \[1, 2, 3\] \(rank 1 shown\): init_rank_groups\(.*\) must return a dict .*got \{\}"),
                   "rank_groups": PASS, "ParallelMLP": PASS}),
    Faulty("init_groups_only_own", options={"world_sizes": (4,), "case_timeout": 10},
           why="each rank creates only the groups it is a member of",
           edits=[("        for ranks in grid[kind]:\n"
                   "            group = dist.new_group(ranks)   # on every rank, in the same order\n"
                   "            if rank in ranks:\n                mine[kind] = group",
                   "        for ranks in grid[kind]:\n            if rank in ranks:\n"
                   "                mine[kind] = dist.new_group(ranks)")],
           # gloo either waits for the missing new_group (stuck) or pairs the calls wrongly (a wrong sum): both FAIL
           expect={"init_rank_groups": ("fail", "did not finish|not created the same way on every rank"),
                   "rank_groups": PASS, "ParallelMLP": PASS}),
    # whole files: written in their own style, not as edits of the solution
    Faulty("functional_allreduce", file="functional_allreduce.py", options=TP2,
           why="g built on torch.distributed.nn.functional.all_reduce, whose backward all-reduces too",
           expect={"reduce_from_parallel_region": ("fail", "must be the identity: it all-reduces"),
                   "RowParallelLinear": ("fail", "tp times serial"),
                   "ColumnParallelLinear": ("fail", "all-gather's backward must keep this rank's slice"),
                   "copy_to_parallel_region": PASS, "rank_groups": PASS}),
    Faulty("matmul_transposed", file="matmul_transposed.py", options=TP2,
           why="weights stored [in, out] as in the paper; a numpy grid with the last name fastest",
           expect={"ColumnParallelLinear": ("fail", r"\[in_features, out_features/tp\]"),
                   "RowParallelLinear": ("fail", r"\[in_features/tp, out_features\]"),
                   "rank_groups": ("fail", "LAST name"),
                   "copy_to_parallel_region": PASS, "reduce_from_parallel_region": PASS}),
    # collectives reached another way than dist.NAME are counted too
    Faulty("mlp_gathers_process_group_object", options=TP2,
           why="the MLP all-gathers its activation through the ProcessGroup object (dist.group.WORLD.allgather)",
           edits=[MLP_KEEP_GROUP, mlp_gathers("        parts = [torch.empty_like(h) for _ in range(tp)]\n"
                                              "        group = self.group or dist.group.WORLD\n"
                                              "        group.allgather([parts], [h.detach()]).wait()\n")],
           expect={"ParallelMLP": ("fail", r"communicates more than it needs in forward: .*all_gather"),
                   "ColumnParallelLinear": PASS, "RowParallelLinear": PASS}),
    Faulty("mlp_gathers_distributed_c10d", options=TP2,
           why="the MLP all-gathers its activation with torch.distributed.distributed_c10d.all_gather",
           edits=[MLP_KEEP_GROUP, mlp_gathers("        parts = [torch.empty_like(h) for _ in range(tp)]\n"
                                              "        torch.distributed.distributed_c10d.all_gather("
                                              "parts, h.detach(), group=self.group)\n")],
           expect={"ParallelMLP": ("fail", r"communicates more than it needs in forward: .*all_gather"),
                   "ColumnParallelLinear": PASS, "RowParallelLinear": PASS}),
    Faulty("mlp_gathers_functional_collective", options=TP2,
           why="the MLP all-gathers its activation with the functional collectives (funcol.all_gather_tensor)",
           edits=[WITH_FUNCOL, MLP_KEEP_GROUP,
                  mlp_gathers("        group = self.group or dist.group.WORLD\n"
                              "        parts = list(funcol.all_gather_tensor(h.detach(), 0, group).chunk(tp, 0))\n")],
           expect={"ParallelMLP": ("fail", r"communicates more than it needs in forward: .*all_gather"),
                   "ColumnParallelLinear": PASS, "RowParallelLinear": PASS}),
    # measured, not seen in the values: memory kept and numbers sent
    Faulty("column_weight_view+row_scatter_by_allreduce", options=TP2,
           why="the column shard is a view of the whole weight (the whole stays alive); the row layer slices a whole "
               "input after f, so its backward all-reduces a zero-padded whole gradient instead of all-gathering",
           edits=[(COL_W, "        full = torch.empty(out_features, in_features)   # the whole weight, on every rank\n"
                          "        self.weight = nn.Parameter(full.chunk(tp, 0)[dist.get_rank(group)])"),
                  ("            x = scatter_to_parallel_region(x, self.group)",
                   "            tp, r = _world(self.group)\n            n = x.shape[-1] // tp\n"
                   "            x = copy_to_parallel_region(x, self.group)[..., r * n:(r + 1) * n]")],
           expect={"ColumnParallelLinear": ("fail", r"ColumnParallelLinear keeps \d+ bytes per rank where its shards "
                                                    r"and their gradients need \d+: \.weight \[6, 8\] is a view of a "
                                                    r"tensor of 96 numbers"),
                   "RowParallelLinear": ("fail", r"input_is_parallel=False\): values and gradients are right, but its "
                                                 r"backward sends 60 numbers per rank where 30 are enough.*all-gather"),
                   "copy_to_parallel_region": PASS, "reduce_from_parallel_region": PASS}),
    Faulty("row_weight_view+f_forward_broadcast", options=TP2,
           why="the row shard is a view of the whole weight; f's forward broadcasts the input from the group's first "
               "rank (every rank holds it already)",
           edits=[(ROW_W, "        self.weight = nn.Parameter(torch.empty(out_features, in_features)"
                          ".chunk(tp, 1)[dist.get_rank(group)])"),
                  (F_FWD, f"        out = x.clone()\n        dist.broadcast(out, {ROOT0}, group=group)\n"
                          "        return out")],
           expect={"copy_to_parallel_region": ("fail", r"forward sends 12 numbers per rank where 0 are enough: f's "
                                                       r"forward is the identity.*broadcast of 24 numbers"),
                   "RowParallelLinear": ("fail", r"\.weight \[8, 6\] is a view of a tensor of 96 numbers"),
                   "reduce_from_parallel_region": PASS}),
    Faulty("column_gather_by_allreduce+attention_keeps_whole", options=TP2,
           why="gather_output=True all-reduces a zero-padded whole output; attention keeps the whole q, k, v weights",
           edits=[(GATHER, "            tp, r = _world(self.group)\n"
                           "            full = torch.zeros(*y.shape[:-1], y.shape[-1] * tp, dtype=y.dtype)\n"
                           "            full[..., r * y.shape[-1]:(r + 1) * y.shape[-1]] = y\n"
                           "            y = reduce_from_parallel_region(full, self.group)"),
                  (QKV, QKV + "\n        self.qkv_whole = torch.empty(3 * hidden_size, hidden_size)   # to init from")],
           expect={"ColumnParallelLinear": ("fail", r"gather_output=True\): values and gradients are right, but its "
                                                    r"forward sends 60 numbers per rank where 30 are enough"),
                   "ParallelSelfAttention": ("fail", r"keeps \d+ bytes per rank .*: \.qkv_whole \[24, 8\]"),
                   "RowParallelLinear": PASS, "copy_to_parallel_region": PASS}),
    Faulty("column_gathers_weights+row_broadcasts_bias", options=TP2,
           why="gather_output=True all-gathers the weights and computes the whole output; the row layer broadcasts "
               "its bias every step",
           edits=[("        x = copy_to_parallel_region(x, self.group)       # f: the backward sums dL/dx over the "
                   "ranks\n",
                   "        if self.gather_output:   # the whole weight, the whole output: no f needed\n"
                   "            w = gather_from_parallel_region(self.weight.t(), self.group).t()\n"
                   "            return F.linear(x, w, gather_from_parallel_region(self.bias, self.group))\n"
                   "        x = copy_to_parallel_region(x, self.group)\n"),
                  (ROW_BIAS, f"            dist.broadcast(self.bias.data, {ROOT0.replace('group', 'self.group')}, "
                             "group=self.group)\n" + ROW_BIAS)],
           expect={"ColumnParallelLinear": ("fail", r"forward sends 54 numbers per rank where 30 are enough.*"
                                                    r"all_gather of 96 numbers"),
                   "RowParallelLinear": ("fail", r"forward sends 44 numbers per rank where 40 are enough.*"
                                                 r"broadcast of 8 numbers"),
                   "copy_to_parallel_region": PASS, "reduce_from_parallel_region": PASS}),
    Faulty("g_allgather_sum+column_keeps_whole+attention_all_heads", options={"world_sizes": (4,)},
           why="g all-gathers then sums (tp/2 times the numbers of an all-reduce); the column layer keeps a whole "
               "copy of the weight; attention gathers q, k, v and computes every head on every rank",
           edits=[(G_FWD, "        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]\n"
                          "        dist.all_gather(parts, x.contiguous(), group=group)\n"
                          "        return torch.stack(parts).sum(0)"),
                  (COL_W, COL_W + "\n        self.master_weight = torch.empty(out_features, in_features)"),
                  (QKV, QKV.replace("hidden_size, group=group)", "hidden_size, gather_output=True, group=group)")
                   .replace("input_is_parallel=True", "input_is_parallel=False") + "\n        self.heads = num_heads"),
                  ("            return y.view(b, t, self.local_heads, self.head_dim)",
                   "            return y.view(b, t, self.heads, self.head_dim)"),
                  ("reshape(b, t, self.local_heads * self.head_dim)", "reshape(b, t, self.heads * self.head_dim)")],
           expect={"reduce_from_parallel_region": ("fail", r"tp=4: .*forward sends 72 numbers per rank where 36 are "
                                                           r"enough.*all_gather of 96 numbers"),
                   "ColumnParallelLinear": ("fail", r"\.master_weight \[12, 8\]"),
                   "ParallelSelfAttention": ("fail", r"forward sends \d+ numbers per rank where 120 are enough.*"
                                                     r"all_gather of 320 numbers"),
                   "copy_to_parallel_region": PASS}),
    Faulty("gather_backward_allreduce+row_bias_grad_allreduce", options=TP2,
           why="the all-gather's backward averages the gradient over the ranks before keeping its slice; the row "
               "layer's bias averages its gradient over the group (both the same numbers: the grads are replicated)",
           edits=[("        return grad_output.chunk(tp, dim=-1)[rank].contiguous(), None",
                   "        g = grad_output.clone()\n        dist.all_reduce(g, group=ctx.group)\n"
                   "        return (g / tp).chunk(tp, dim=-1)[rank].contiguous(), None"),
                  ("        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None",
                   "        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None\n"
                   "        if bias:   # replicated: keep its gradient the same on every rank\n"
                   "            self.bias.register_hook(lambda g: funcol.all_reduce(g, 'avg', group or dist.group.WORLD))")
                  , WITH_FUNCOL],
           expect={"ColumnParallelLinear": ("fail", r"gather_output=True\): .*backward sends 100 numbers per rank where "
                                                    r"40 are enough.*keeps this rank's slice"),
                   "RowParallelLinear": ("fail", r"backward sends 8 numbers per rank where 0 are enough.*bias's "
                                                 r"gradient is already the same"),
                   "copy_to_parallel_region": PASS, "reduce_from_parallel_region": PASS}),
]
