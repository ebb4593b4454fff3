"""Cases run in one process: ``split_positions`` (every rank's share, asked rank by rank) and ``merge_partials``."""
from __future__ import annotations

from course_lib.checking.case import Fail
from course_lib.cp import reference
from course_lib.tp.numerics import close, diff, rand

MAX_SEQ = 13


def _as_positions(got, what):
    import torch
    try:
        t = torch.as_tensor(got)
    except Exception:
        raise Fail(f"{what} must return a LongTensor of positions; it returned {type(got).__name__}") from None
    if t.dim() != 1 or (t.numel() and t.is_floating_point()):
        raise Fail(f"{what} must return a 1-D LongTensor of positions; it returned {t.dtype} of shape {list(t.shape)}")
    return t.long()


def _tokens_once(shares, seq_len, cp, mode):
    """Every token 0..S-1 on exactly one rank: name the lost and the duplicated ones."""
    import torch
    where = f"seq_len={seq_len}, cp={cp}, {mode}"
    every = torch.cat(shares) if shares else torch.empty(0, dtype=torch.long)
    outside = sorted({int(p) for p in every if not 0 <= int(p) < seq_len})
    if outside:
        raise Fail(f"{where}: positions {outside} are outside 0..{seq_len - 1}")
    count = torch.bincount(every, minlength=seq_len)
    lost = (count == 0).nonzero().flatten().tolist()
    if lost:
        raise Fail(f"{where}: the split loses tokens {lost} (no rank holds them; S is not divisible by cp: the "
                   f"remainder must go somewhere, e.g. one more token on the first S % cp ranks)")
    dup = (count > 1).nonzero().flatten().tolist()
    if dup:
        holders = [r for r, s in enumerate(shares) if dup[0] in s.tolist()]
        raise Fail(f"{where}: the split duplicates tokens {dup} (token {dup[0]} is on ranks {holders})")


def case_split(ctx):
    fn = ctx.need("split_positions")
    for cp in range(1, 5):
        for seq_len in range(cp, MAX_SEQ + 1):
            for balanced in (False, True):
                mode = "balanced" if balanced else "plain"
                shares = [_as_positions(fn(seq_len, cp, r, balanced=balanced), f"split_positions({seq_len}, {cp}, "
                                        f"{r}, balanced={balanced})") for r in range(cp)]
                _tokens_once(shares, seq_len, cp, mode)
                for r, s in enumerate(shares):
                    if s.numel() > 1 and not bool((s[1:] > s[:-1]).all()):
                        raise Fail(f"seq_len={seq_len}, cp={cp}, {mode}: rank {r}'s positions {s.tolist()} are not "
                                   f"ascending")
                (_balanced if balanced else _plain)(shares, seq_len, cp)
    return None


def _plain(shares, seq_len, cp):
    sizes = [s.numel() for s in shares]
    flat = [p for s in shares for p in s.tolist()]
    if flat != list(range(seq_len)):
        raise Fail(f"seq_len={seq_len}, cp={cp}, plain: each rank must hold a contiguous block, rank 0 first; got "
                   f"{[s.tolist() for s in shares]}")
    if max(sizes) - min(sizes) > 1:
        raise Fail(f"seq_len={seq_len}, cp={cp}, plain: shard sizes {sizes} differ by more than one (the last rank "
                   f"is short or idle); give the remainder one token each to the first ranks (tensor_split's rule)")


def _balanced(shares, seq_len, cp):
    want = [reference.positions(seq_len, cp, r, balanced=True).tolist() for r in range(cp)]
    got = [s.tolist() for s in shares]
    if got != want:
        raise Fail(f"seq_len={seq_len}, cp={cp}, balanced: expected {want} (of 2*cp={2 * cp} chunks, "
                   f"torch.tensor_split's sizes, rank r holds chunks r and {2 * cp - 1}-r), got {got}")


def case_merge(ctx):
    import torch
    fn = ctx.need("merge_partials")
    q, k, v = rand(1, 2, 3, 4), rand(2, 2, 8, 4), rand(3, 2, 8, 4)
    q_pos, k_pos = torch.tensor([2, 5, 7]), torch.arange(8)
    a, b = slice(0, 3), slice(3, 8)          # query 0 (position 2) sees nothing of block b: lse_b = -inf there
    out_a, lse_a = reference.block(q, k[:, a], v[:, a], q_pos, k_pos[a])
    out_b, lse_b = reference.block(q, k[:, b], v[:, b], q_pos, k_pos[b])
    want = reference.attention(q, k, v, q_pos, k_pos)
    want_lse = torch.logaddexp(lse_a, lse_b)
    got = fn(out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone())
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Fail("merge_partials must return a tuple (out, lse)")
    out, lse = got
    if not close(out, want):
        if close(out, (out_a + out_b) / 2):
            raise Fail("merge_partials averages the two partial outputs: each was normalised over its own block, so "
                       "they must be weighed by their share of the joint softmax denominator, exp(lse_x - lse) with "
                       "lse = logaddexp(lse_a, lse_b): the log-sum-exp correction")
        if out is not None and torch.isnan(out).any():
            raise Fail("merge_partials returns nan where a block is fully masked (its lse is -inf): torch.logaddexp "
                       "and exp(lse_b - lse) give 0 weight there without special cases")
        raise Fail(f"merge_partials: out differs from the softmax over both blocks; {diff(out, want)}")
    if not close(lse, want_lse):
        raise Fail(f"merge_partials: lse must be the log of the joint denominator, logaddexp(lse_a, lse_b); "
                   f"{diff(lse, want_lse)}")
    return None
