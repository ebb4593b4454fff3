"""The cases of ``course check ownddp`` (course_lib.checking runs them): one per DDP variant of the learner's
own_ddp.py, on W = 2 and 3 ranks.

Each rank's model starts from a seed of its own (a missing broadcast shows) and must equal, after every step, a
single-process run of rank 0's model on the whole batch. What the values cannot show is measured
(course_lib.owndp.record): the ``Recorder`` sees the all-reduces and broadcasts (number, size), their waits (each
async one waited on, its tensor left alone until then) and when backward produced each gradient; ``held`` counts
the tensors and handles the wrapper keeps from one step to the next.
"""
import functools

from course_lib import checking
from course_lib.checking import case as harness
from course_lib.checking.case import Case, Fail, flat, need
from course_lib.checking.learner import explain
from course_lib.checking.summary import first_text
from course_lib.owndp.order import FINISH, early_launch_problem, reordered_model
from course_lib.owndp.record import Recorder, held

FILE = LOAD_ITEM = "own_ddp.py"
LOAD_TEXT = "{file} does not load: {error}{at}"
ITEMS = ("naive", "flat", "overlapped", "bucketed")
CLASSES = {"naive": "NaiveDDP", "flat": "FlatDDP", "overlapped": "OverlappedDDP", "bucketed": "BucketedDDP"}
WORLDS = (2, 3)
GUARD = ((), "count")    # nothing forbidden; the Recorder sees the all-reduces and broadcasts
HANG_HINTS = {None: "every rank must issue the same collectives in the same order: a collective that one rank "
                    "skips (an `if` on the rank, a gradient only one rank has) leaves the others waiting in theirs"}
STEPS = 3
ATOL = 1e-9
LR = 0.1
MIB = 2 ** 20
# bucket caps in bytes for the plain model (203 float64 parameters: the last layer's 27, the middle one's 104,
# the first one's 72): 1, 2 and 3 buckets; half an element off an exact fit, so that closing a bucket at
# ">= cap" or at "> cap" agree. 1052 B (the parameters from the last up to 0.bias: 1048 B, 1144 B with it) gives
# buckets of 143 and 60 elements; read as 1e6-byte MB (1003 B), 131 and 72
CAPS = {1: 25 * MIB, 2: 1052, 3: 212}
TIED_CAP = 212       # tied model: 3 buckets, the first holding the unused layer (sent only by the flush)
HINT_HOOK = "register hooks only on parameters with requires_grad (self.params): a frozen one cannot take a hook"
HINT_NONE = ("a parameter that forward did not use (the tied model has one) has no gradient on any rank: its .grad "
             "is None; skip it (if p.grad is None: continue), as the optimizer does")
check = functools.partial(checking.check, "ownddp")   # course check ownddp PATH, from Python


def cases(world: int) -> list[Case]:
    return [Case(v, v, functools.partial(case_variant, variant=v), f"W={world}") for v in ITEMS]


def pass_text(item: str, recs) -> str:
    worlds = ", ".join(str(w) for w in sorted({r.world for r in recs}))
    return f"W={worlds}: {first_text(recs)}"


class Ctx(harness.Ctx):
    """The harness's Ctx with the Recorder (one per process), which the learner's module calls through."""

    def __init__(self, mod, path, guard, sync, passed):
        super().__init__(mod, path, guard, sync, passed)
        self.rec = Recorder.installed(sync)
        self.rec.bind(mod)


# ---- models and data -----------------------------------------------------------------------------------------
def plain_model(seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).double()


def tied_model(seed):
    import torch

    class Tied(torch.nn.Module):
        """Tokens -> embedding -> hidden -> frozen -> logits through the embedding's own weight."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(11, 6)
            self.hidden = torch.nn.Linear(6, 6)
            self.frozen = torch.nn.Linear(6, 6).requires_grad_(False)
            self.unused = torch.nn.Linear(6, 3)          # forward never calls it: no gradient on any rank
            self.out = torch.nn.Linear(6, 11, bias=False)
            self.out.weight = self.embed.weight          # tied: one parameter, used twice
            self.register_buffer("scale", torch.rand(6, dtype=torch.float64) + 0.5)   # random: a rank's own

        def forward(self, tokens):
            return self.out(self.frozen(torch.tanh(self.hidden(self.embed(tokens))) * self.scale))

    torch.manual_seed(seed)
    return Tied().double()


def batch(kind, step, world):
    """The global batch of ``step``: 4 samples per rank, rank r's are rows 4r..4r+3."""
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    if kind != "tied":
        return torch.randn(4 * world, 5, generator=g, dtype=torch.float64), \
            torch.randn(4 * world, 3, generator=g, dtype=torch.float64)
    return torch.randint(0, 11, (4 * world, 5), generator=g), torch.randint(0, 11, (4 * world, 5), generator=g)


def loss_of(kind, model, x, y):
    import torch.nn.functional as F
    if kind != "tied":
        return F.mse_loss(model(x), y)
    return F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))


def reference_buckets(sizes, cap, itemsize=8):
    """Element counts of the buckets the module docstring's rule makes from parameters of ``sizes`` (float64;
    ``itemsize=1``: sizes and buckets in bytes)."""
    out, current = [], 0
    for n in reversed(sizes):
        current += n
        if current * itemsize >= cap:
            out.append(current)
            current = 0
    return out + ([current] if current else [])


# ---- one variant -----------------------------------------------------------------------------------------------
def wrap(c, variant, model, cap):
    cls = need(c.mod, CLASSES[variant], FILE)
    try:
        return cls(model, bucket_size_mb=cap / MIB) if variant == "bucketed" else cls(model)
    except RuntimeError as e:
        if "hook on a tensor that doesn't require gradient" in str(e):
            raise Fail(f"{CLASSES[variant]}({c.model_kind} model): {explain(e, c.path, FILE)}: {HINT_HOOK}") from None
        raise


def params_differ(c, ddp_model, ref, buffers=False):
    """Names of the parameters (with ``buffers``, and "the buffer NAME" of the buffers) of the learner's model that
    differ from ``ref``'s."""
    import torch
    pairs = [(n, p, q) for (n, p), q in zip(ddp_model.named_parameters(), ref.parameters())]
    if buffers:
        pairs += [(f"the buffer {n}", b, q) for (n, b), q in zip(ddp_model.named_buffers(), ref.buffers())]
    return [n for n, p, q in pairs if not torch.allclose(p.detach(), q.detach(), rtol=0, atol=ATOL)]


def update_ratio(d, r):
    """The learner's update ``d`` as a multiple of the single-process one ``r``; None if it is not one."""
    import torch
    if float(r.norm()) == 0:
        return None
    ratio = float(d @ r / (r @ r))
    return ratio if torch.allclose(d, ratio * r, atol=1e-9) else None


def train(c, variant, kind, cap):
    """STEPS steps of the learner's wrapper next to the single-process run; returns (the recorder's logs of the
    first and the last step, the sizes of the parameters that require a gradient, the same with 0 for those that got
    none)."""
    import torch
    make = {"plain": plain_model, "tied": tied_model, "reordered": reordered_model}[kind]
    c.model_kind = kind
    ref = make(100)                          # rank 0's initial model: what every rank must start from
    model = make(100 + c.r)
    c.rec.grads(model)
    c.rec.take()
    ddp = wrap(c, variant, model, cap)
    c.agree_or_fail(_broadcast_problem(c, variant, kind, model, ref))
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    logs, kept = [], []
    for step in range(STEPS):
        x, y = batch(kind, step, c.world)
        mine = slice(4 * c.r, 4 * c.r + 4)
        before, ref_before = flat(model.parameters()), flat(ref.parameters())
        c.rec.take()
        loss_of(kind, ddp, x[mine], y[mine]).backward()
        c.rec.log.append(FINISH)
        _finish(c, ddp)
        unwaited = c.rec.unwaited()
        logs.append(c.rec.take())
        opt.step()
        opt.zero_grad()
        loss_of(kind, ref, x, y).backward()
        sizes = [p.numel() if p.grad is not None else 0 for p in ref.parameters() if p.requires_grad]
        every = [p.numel() for p in ref.parameters() if p.requires_grad]
        ref_opt.step()
        ref_opt.zero_grad()
        kept.append(held(ddp))
        label = f"{kind} model, W={c.world}, step {step + 1}"
        problem = wait_problem(unwaited, label) or early_launch_problem(logs[-1], label, sum(every) - sum(sizes))
        wrong = params_differ(c, model, ref)
        if wrong and not problem:
            ratio = update_ratio(flat(model.parameters()) - before, flat(ref.parameters()) - ref_before)
            problem = _step_problem(c, kind, step, wrong, ratio)
            sent = bucket_problem(logs[-1], every, cap, f"{kind} model") if variant == "bucketed" else None
            problem += f"\n{sent}" if sent else ""
        c.agree_or_fail(problem)
    label = f"{kind} model, W={c.world}"
    c.agree_or_fail(broadcast_step_problem(logs, sum(b.numel() for b in model.buffers()), label)
                    or kept_problem(kept[-2], kept[-1], label))
    return (logs[0], logs[-1]), every, sizes


def _finish(c, ddp):
    """The learner's finish_gradient_synchronization; a None gradient it trips over (AttributeError on
    None.div_, TypeError from a flatten) is said with what it means, not as a bare AttributeError."""
    try:
        ddp.finish_gradient_synchronization()
    except (AttributeError, TypeError) as e:
        if "NoneType" not in str(e):
            raise
        raise Fail(f"{c.model_kind} model: {explain(e, c.path, FILE)}: {HINT_NONE}") from None


def _broadcast_problem(c, variant, kind, model, ref):
    wrong = params_differ(c, model, ref, buffers=True)
    if not wrong or c.r == 0:
        return None
    differ = "differs" if len(wrong) == 1 else "differ"
    return (f"{kind} model, rank {c.r}: right after wrapping it, {', '.join(wrong)} {differ} from rank 0's: broadcast "
            "every parameter and buffer from rank 0 in NaiveDDP.__init__ (frozen ones too), so that every rank "
            "starts from the same model")


def _step_problem(c, kind, step, wrong, ratio):
    label = f"{kind} model, W={c.world}, rank {c.r}, after step {step + 1}"
    if ratio is not None and abs(ratio - c.world) < 1e-6 * c.world:
        return f"{label}: the update is W = {c.world} times the single-process one: divide the summed gradient by W"
    if ratio is not None and abs(ratio * c.world - 1) < 1e-6:
        return f"{label}: the update is 1/W of the single-process one: the gradient is divided by W twice"
    return (f"{label}: {', '.join(wrong)} differ from a single-process run on the whole batch (its gradients "
            "were not all averaged over the ranks before optimizer.step())")


# ---- what the log says ----------------------------------------------------------------------------------------
def all_reduces(log):
    return [e for e in log if e[0] == "all_reduce"]


def overlap_problem(log, name):
    """None when the first all-reduce started before backward's last gradient and nothing waited during backward."""
    grads = [i for i, e in enumerate(log) if e[0] == "grad"]
    launched = [i for i, e in enumerate(log) if e[0] == "all_reduce"]
    if not grads or not launched:
        return None
    last = grads[-1]
    if launched[0] > last:
        return (f"{name}: the first all-reduce started after backward's last gradient: nothing overlaps backward "
                "(launch it from the hook, as soon as the gradient is ready)")
    waited = [i for i, e in enumerate(log) if e[0] == "wait" or (e[0] == "all_reduce" and not e[2])]
    if waited and waited[0] < last:
        return (f"{name}: an all-reduce is waited on during backward (in the hook): backward stops until it is done, "
                "so nothing overlaps; keep the handle and wait in finish_gradient_synchronization")
    return None


def count_problem(variant, log, sizes, got_grad, label):
    """None when the step issued the all-reduces the variant should (their number and sizes), else why not:
    ``sizes`` of the parameters that require grad, ``got_grad`` the same with 0 for those that got no gradient
    (naive and flat may send those as zeros)."""
    got = [e[1] for e in all_reduces(log)]
    used = [n for n in got_grad if n]
    if variant == "naive" and sorted(got) not in (sorted(used), sorted(sizes)):
        return (f"{label}: {len(got)} all-reduces of {got} elements in one step; NaiveDDP sends one per gradient, "
                f"of {used} elements: once for each parameter of self.params that has one (a frozen one is never sent)")
    if variant == "flat" and (len(got) != 1 or got[0] not in (sum(used), sum(sizes))):
        return (f"{label}: {len(got)} all-reduces of {got} elements in one step; FlatDDP sends one, of every "
                f"gradient ({sum(used)} elements)")
    if variant == "overlapped" and sorted(got) != sorted(used):
        return (f"{label}: {len(got)} all-reduces of {got} elements in one step; OverlappedDDP sends one per "
                f"gradient, of {used} elements")
    return None


def wait_problem(unwaited, label):
    """None when every async all-reduce of the step had its handle waited on (or used) by the end of
    finish_gradient_synchronization."""
    never, changed, launched = unwaited
    if changed:
        return (f"{label}: the tensors of {changed} of the {launched} async all-reduces launched in the step were "
                "changed in place before their wait(): the all-reduce may still be reading and writing them; "
                "wait first, then divide or copy")
    if not never:
        return None
    return (f"{label}: {never} of the {launched} async all-reduces launched in the step were never waited on when "
            "finish_gradient_synchronization returned: optimizer.step() may read a gradient still being summed "
            "(they need not finish in the order they started); wait on every handle there")


def broadcast_step_problem(logs, buffer_elements, label):
    """None unless a step broadcast more elements than the model's buffers (torch's DDP broadcasts those in every
    forward; the parameters, only once)."""
    for step, log in enumerate(logs, 1):
        sent = [e[1] for e in log if e[0] == "broadcast"]
        if sum(sent) > buffer_elements and any(e[0] == "reduce" for e in log):
            return (f"{label}, step {step}: {sum(e[0] == 'reduce' for e in log)} reduces and {len(sent)} broadcasts "
                    "during the step: a reduce to rank 0 then a broadcast from it is what one all-reduce does "
                    "(every rank gets the sum), in one call per gradient: use dist.all_reduce")
        if sum(sent) > buffer_elements:
            return (f"{label}, step {step}: {len(sent)} broadcasts of {sum(sent)} elements during the step: broadcast "
                    "once, in NaiveDDP.__init__; after that the averaged gradients keep every rank's parameters "
                    "equal, and a broadcast in every step sends the whole model again")
    return None


def kept_problem(before, after, label):
    """None unless an attribute of the wrapper holds more tensors and handles after the last step than after the
    one before: something every step appends is never dropped."""
    grew = [name for name in after if after[name] > before.get(name, 0)]
    if not grew:
        return None
    name = grew[0]
    return (f"{label}: self.{name} holds {before.get(name, 0)} tensors and all-reduce handles after step {STEPS - 1} "
            f"and {after[name]} after step {STEPS}: what a step adds there is never dropped, so memory grows with "
            "every step; clear it once the step is done (in finish_gradient_synchronization)")


def bucket_problem(log, sizes, cap, label):
    got = [e[1] for e in all_reduces(log)]
    want = reference_buckets(sizes, cap)
    if sorted(got) == sorted(want):
        return None
    text = (f"{label}, bucket_size_mb={cap / MIB:.6g} ({cap} bytes): {len(got)} all-reduces of {got} elements; "
            f"expected {len(want)} buckets of {want}")
    if sorted(got) == sorted(reference_buckets(sizes, cap * 1e6 / MIB)):
        return text + (f": those are the buckets of a cap of bucket_size_mb * 1e6 bytes ({cap * 1e6 / MIB:.1f}); "
                       "bucket_size_mb is in MiB, as torch's bucket_cap_mb: the cap is bucket_size_mb * 2**20 bytes")
    if sorted(got) == sorted(reference_buckets(sizes[::-1], cap)):
        return text + (": those are buckets built from the first parameter; build them from the last "
                       "(reversed(self.params)), the order in which backward produces the gradients")
    if len(got) < len(want):
        return text + (": a bucket was never sent. One that holds a parameter with no gradient never fills up: "
                       "send it in finish_gradient_synchronization")
    return text + (": walk the parameters from the last to the first and close a bucket once it holds at least "
                   "bucket_size_mb MiB (2**20 bytes)")


def case_variant(c, variant):
    """Every check of one variant; returns the pass text."""
    runs = [("plain", CAPS[3]), ("tied", TIED_CAP)] if variant == "bucketed" else [("plain", 0), ("tied", 0)]
    if variant == "bucketed":
        runs += [("plain", CAPS[1]), ("plain", CAPS[2]), ("reordered", CAPS[1])]
    for kind, cap in runs:
        (first, log), sizes, used = train(c, variant, kind, cap)
        label = f"{kind} model, W={c.world}"
        problem = (bucket_problem(log, sizes, cap, label) if variant == "bucketed"
                   else count_problem(variant, log, sizes, used, label))
        if problem is None and variant in ("overlapped", "bucketed") and (variant == "overlapped" or cap < CAPS[1]):
            problem = overlap_problem(log, label)
            if problem and overlap_problem(first, label) is None:
                problem = (f"{label}: the all-reduces overlapped backward in step 1 but not in step {STEPS}: what the "
                           "hooks count or mark in a step (self.ready, ...) is not reset once the step is done; "
                           "reset it in finish_gradient_synchronization")
        c.agree_or_fail(problem)
    what = {"naive": "one all-reduce per gradient", "flat": "one all-reduce of all gradients",
            "overlapped": "one async all-reduce per gradient, the first during backward",
            "bucketed": "one async all-reduce per bucket (1, 2, 3 buckets as sized), the first during backward, "
                        "none before its gradients (also with parameters used in another order than registered)"}
    return (f"equals one process on the whole batch for {STEPS} steps (plain model; tied weights, frozen "
            f"and unused parameters, a buffer); {what[variant]}")
