"""`course check tp`: the solution passes, the starter fails per piece, each faulty submission is named right.

Faulty submissions come two ways: whole files in tests/tp_faulty/ (each with an EXPECT dict), and the
solution with one or two mistakes typed in (MUTATIONS below: old text -> new text, checked to apply).
Every run is real: gloo processes on 2 and 4 ranks.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import live_processes
from course_lib.checks import tp as tp_check
from course_lib.release import solution_view

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "06_tensor_parallel" / "tp.py"
EXERCISE = ROOT / "exercises" / "06_tensor_parallel" / "tp.py"
FAULTY = sorted((ROOT / "tests" / "tp_faulty").glob("*.py"))
PIECES = tp_check.ITEMS

# Single mistakes, typed into the solution: name -> [(old, new), ...]
EDITS = {
    "f_allreduces_forward": [(
        "        ctx.group = group\n        return x.clone()   # identity (a copy, so that autograd sees a new tensor)",
        "        ctx.group = group\n        out = x.clone()\n        dist.all_reduce(out, group=group)\n        return out")],
    "f_backward_identity": [(
        "        grad = grad_output.clone()\n        dist.all_reduce(grad, group=ctx.group)\n        return grad, None",
        "        return grad_output, None")],
    "f_backward_averages": [(
        "        dist.all_reduce(grad, group=ctx.group)\n",
        "        dist.all_reduce(grad, group=ctx.group)\n        grad /= dist.get_world_size(ctx.group)\n")],
    "g_identity_forward": [(
        "    def forward(ctx, x, group):\n        out = x.clone()\n        dist.all_reduce(out, group=group)\n        return out",
        "    def forward(ctx, x, group):\n        return x.clone()")],
    "g_backward_allreduces": [
        ("        return grad_output, None   # identity",
         "        grad = grad_output.clone()\n        dist.all_reduce(grad, group=ctx.group)\n        return grad, None"),
        ("    def forward(ctx, x, group):\n        out = x.clone()",
         "    def forward(ctx, x, group):\n        ctx.group = group\n        out = x.clone()")],
    "row_bias_on_every_rank": [
        ("        partial = F.linear(x, self.weight)               # X_r B_r: one term of the sum",
         "        partial = F.linear(x, self.weight, self.bias)"),
        ("        if self.bias is not None:\n            y = y + self.bias                            # once, after the sum (not tp times)\n",
         "")],
    "row_bias_rank0_only": [
        ("        partial = F.linear(x, self.weight)               # X_r B_r: one term of the sum",
         "        partial = F.linear(x, self.weight, self.bias if dist.get_rank(self.group) == 0 else None)"),
        ("        if self.bias is not None:\n            y = y + self.bias                            # once, after the sum (not tp times)\n",
         "")],
    "row_bias_split": [(
        "        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None",
        "        self.bias = nn.Parameter(torch.empty(out_features // tp)) if bias else None")],
    "row_split_on_output_dim": [(
        "        self.weight = nn.Parameter(torch.empty(out_features, in_per_rank))",
        "        self.weight = nn.Parameter(torch.empty(out_features // tp, in_features))")],
    "column_split_on_input_dim": [(
        "        self.weight = nn.Parameter(torch.empty(out_per_rank, in_features))",
        "        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp))")],
    "gather_output_ignored": [(
        "        if self.gather_output:\n            y = gather_from_parallel_region(y, self.group)\n", "")],
    "group_argument_ignored": [
        ("        dist.all_reduce(grad, group=ctx.group)", "        dist.all_reduce(grad)"),
        ("        dist.all_reduce(out, group=group)", "        dist.all_reduce(out)")],
    "mlp_gathers_between_layers": [(
        "gather_output=False, group=group)\n        self.fc2 = RowParallelLinear(ffn_hidden_size, hidden_size, bias=bias, "
        "input_is_parallel=True",
        "gather_output=True, group=group)\n        self.fc2 = RowParallelLinear(ffn_hidden_size, hidden_size, bias=bias, "
        "input_is_parallel=False")],
    "mlp_relu": [("        return self.fc2(F.gelu(self.fc1(x)))", "        return self.fc2(F.relu(self.fc1(x)))")],
    "attention_heads_mixed": [(
        "            return y.view(b, t, self.local_heads, self.head_dim).transpose(1, 2)",
        "            return y.view(b, t, self.head_dim, self.local_heads).transpose(1, 3).transpose(2, 3)")],
    "groups_last_name_fastest": [(
        "    strides = [math.prod(shape[:i]) for i in range(len(shape))]",
        "    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]")],
    "groups_ignore_order": [("    names = order.lower().split(\"-\")\n", "    names = \"tp-cp-pp-dp\".split(\"-\")\n")],
    "syntax_error": [("def copy_to_parallel_region(x, group=None):", "def copy_to_parallel_region(x, group=None)")],
}

# One checker run per row: mistakes in pieces that do not build on each other, so each must be named on its
# own. (mistakes, ranks to run on, {piece: words its message must contain, or None: must pass})
MUTATIONS = {
    "f_forward+g_backward+last_fastest": (
        ["f_allreduces_forward", "g_backward_allreduces", "groups_last_name_fastest"], (2,),
        {"copy_to_parallel_region": "must be the identity: it returned tp times the input",
         "reduce_from_parallel_region": "must be the identity: it all-reduces",
         "RowParallelLinear": "tp times serial",
         "rank_groups": "LAST name of order varies fastest"}),
    "f_backward+g_forward+ignore_order": (
        ["f_backward_identity", "g_identity_forward", "groups_ignore_order"], (2,),
        {"copy_to_parallel_region": "backward of copy_to_parallel_region must all-reduce",
         "ColumnParallelLinear": "input grads are this rank's part only",
         "reduce_from_parallel_region": "returned its input unchanged",
         "RowParallelLinear": "missing reduction",
         "ParallelMLP": "fix those first",
         "rank_groups": "order argument is ignored"}),
    "f_average+row_bias_every_rank": (
        ["f_backward_averages", "row_bias_on_every_rank"], (2,),
        {"copy_to_parallel_region": "averages the gradients", "reduce_from_parallel_region": None,
         "RowParallelLinear": "bias added tp times", "rank_groups": None}),
    "column_input_dim+row_bias_rank0": (
        ["column_split_on_input_dim", "row_bias_rank0_only"], (2,),
        {"ColumnParallelLinear": "split along the input dimension instead of the output dimension",
         "RowParallelLinear": "bias gets no gradient",
         "copy_to_parallel_region": None, "reduce_from_parallel_region": None}),
    "gather_ignored+row_output_dim": (
        ["gather_output_ignored", "row_split_on_output_dim"], (2,),
        {"ColumnParallelLinear": "gather_output=True is ignored",
         "RowParallelLinear": "split along the output dimension instead of the input dimension"}),
    "row_bias_split": (
        ["row_bias_split"], (2,), {"RowParallelLinear": "bias is split", "ColumnParallelLinear": None}),
    "mlp_gathers+attention_heads": (
        ["mlp_gathers_between_layers", "attention_heads_mixed"], (2,),
        {"ParallelMLP": "communicates more than it needs in forward",
         "ParallelSelfAttention": "differs from serial multi-head attention",
         "ColumnParallelLinear": None, "RowParallelLinear": None}),
    "mlp_relu": (["mlp_relu"], (2,), {"ParallelMLP": "uses ReLU", "ParallelSelfAttention": None}),
    "group_ignored+last_fastest": (
        ["group_argument_ignored", "groups_last_name_fastest"], (2, 4),
        {"copy_to_parallel_region": "tp=2 groups inside 4 ranks",
         "reduce_from_parallel_region": "pass group=... to every collective",
         "rank_groups": "LAST name", "init_rank_groups": "fix that first"}),
    "syntax_error": (["syntax_error"], (2,), {"tp.py": "does not load"}),
}

# hangs: the checker must name the piece, say it did not finish, and go on to the next pieces
HANGS = {
    "f_backward_only_rank0_reduces": ([(
        "        dist.all_reduce(grad, group=ctx.group)\n",
        "        if dist.get_rank(ctx.group) == 0:\n            dist.all_reduce(grad, group=ctx.group)\n")],
        (2,), {"copy_to_parallel_region": "did not finish", "reduce_from_parallel_region": None,
               "RowParallelLinear": None}),
    "init_groups_only_own": ([(
        "        for ranks in grid[kind]:\n            group = dist.new_group(ranks)   # on every rank, in the same order\n"
        "            if rank in ranks:\n                mine[kind] = group",
        "        for ranks in grid[kind]:\n            if rank in ranks:\n                mine[kind] = dist.new_group(ranks)")],
        (4,), {"init_rank_groups": "did not finish", "rank_groups": None, "ParallelMLP": None}),
}


def mutate(tmp_path, name, edits):
    text = solution_view(SOLUTION.read_text())
    for old, new in edits:
        assert old in text, f"mutation {name}: the solution no longer contains {old!r}"
        text = text.replace(old, new, 1)
    path = tmp_path / "tp.py"
    path.write_text(text)
    return path


def verdicts(report):
    return {v.item: v for v in report.verdicts}


def assert_expected(report, expect):
    got = verdicts(report)
    for piece, words in expect.items():
        assert piece in got, f"no verdict for {piece}:\n{report.text()}"
        if words is None:
            assert got[piece].result == "pass", f"{piece} should pass:\n{report.text()}"
        else:
            assert got[piece].result != "pass", f"{piece} should fail:\n{report.text()}"
            assert words in got[piece].message, f"{piece}: expected {words!r} in the message:\n{report.text()}"


@pytest.mark.slow
def test_solution_passes_every_piece():
    report = tp_check.check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(PIECES)


@pytest.mark.slow
def test_starter_fails_every_piece_with_its_message():
    report = tp_check.check(str(EXERCISE))
    got = verdicts(report)
    assert set(got) == set(PIECES), report.text()
    for piece, v in got.items():
        assert v.result == "fail", report.text()
    assert "NotImplementedError" in got["copy_to_parallel_region"].message
    assert "weight is None" in got["ColumnParallelLinear"].message
    assert "not written yet" in got["rank_groups"].message


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_mutation_named_with_reason(tmp_path, name):
    mistakes, ranks, expect = MUTATIONS[name]
    edits = [e for m in mistakes for e in EDITS[m]]
    report = tp_check.check(str(mutate(tmp_path, name, edits)), world_sizes=ranks)
    assert not report.passed
    assert_expected(report, expect)


def test_every_edit_is_used_and_applies():
    used = {m for mistakes, _, _ in MUTATIONS.values() for m in mistakes}
    assert used == set(EDITS)
    text = solution_view(SOLUTION.read_text())
    for name, edits in EDITS.items():
        for old, _ in edits:
            assert old in text, f"{name}: the solution no longer contains {old!r}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HANGS))
def test_hang_is_reported_and_nothing_survives(tmp_path, name):
    edits, ranks, expect = HANGS[name]
    path = mutate(tmp_path, name, edits)
    report = tp_check.check(str(path), case_timeout=10, world_sizes=ranks)
    assert_expected(report, expect)
    # every worker was stopped: no process still runs the learner's file
    left = live_processes(str(path))
    assert not left, f"processes left running: {left}"


@pytest.mark.slow
@pytest.mark.parametrize("path", FAULTY, ids=[p.stem for p in FAULTY])
def test_faulty_file_named_with_reason(path):
    spec = importlib.util.spec_from_file_location("faulty", path)
    # EXPECT is read without importing torch.distributed state: the module only defines things
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    report = tp_check.check(str(path), world_sizes=(2,))
    assert not report.passed
    assert_expected(report, mod.EXPECT)


def test_reference_rank_groups_matches_design_example():
    # DESIGN.md: 8 ranks, tp=4, dp=2
    g = tp_check.reference_rank_groups(8, tp=4, dp=2)
    assert g["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["cp"] == [[r] for r in range(8)]
    # dp fastest: consecutive ranks are data-parallel replicas
    g = tp_check.reference_rank_groups(8, tp=2, dp=4, order="dp-tp-cp-pp")
    assert g["dp"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and g["tp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_reference_rank_groups_partition_every_case():
    for world, tp, dp, cp, pp, order in tp_check.rank_group_cases():
        g = tp_check.reference_rank_groups(world, tp=tp, dp=dp, cp=cp, pp=pp, order=order)
        for kind, size in (("tp", tp), ("dp", dp), ("cp", cp), ("pp", pp)):
            assert sorted(r for grp in g[kind] for r in grp) == list(range(world))
            assert all(len(grp) == size for grp in g[kind])
        # groups of different kinds meet in exactly one rank when they meet at all (orthogonal axes)
        for a in g["tp"]:
            for b in g["dp"]:
                assert len(set(a) & set(b)) <= 1


def test_cli_exit_codes(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "tp", str(tmp_path / "nope.py")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file" in missing.stdout
