"""One Report from the records of a check: one verdict per item, the most telling failure's message."""
from collections import defaultdict

from course_lib.checking.protocol import plugin
from course_lib.core.report import MISSING, Report, Verdict

HANG_HINT = ("a collective or a send that not every rank matches waits forever; check that every rank makes the same "
             "calls in the same order, and that every send has a receive on the rank it names")


def summarise(report: Report, spec, records: list, general: list[str]) -> Report:
    """Per item of ``spec.ITEMS``: pass when every case on every rank passed, else the first failure (the smallest
    world size first, a hang before an error, a rank's own error before 'another rank failed')."""
    worlds = list(dict.fromkeys(r.world for r in records))
    by_item: dict = defaultdict(list)
    for rec in records:
        by_item[rec.item].append(rec)
    p = plugin(spec)
    for item in p.ITEMS:
        recs = by_item.get(item)
        if not recs:
            continue
        missing = [v for r in recs for v in r.verdicts.values() if v.get("missing")]
        failing = [r for r in recs if r.failed]
        if missing:
            report.verdicts.append(Verdict(item, MISSING, missing[0]["message"]))
        elif not failing:
            report.add(item, True, p.pass_text(item, recs) if p.pass_text else first_text(recs))
        else:
            first = min(failing, key=lambda r: (worlds.index(r.world), r.ended != "hung", only_others(r),
                                                recs.index(r)))
            hints = p.HANG_HINTS
            msg = describe(first, hints.get(item, hints.get(None, HANG_HINT)))
            if p.hint:
                msg += p.hint(item, first, recs)
            earlier = [v.item for v in report.verdicts
                       if v.result != "pass" and v.item in p.BUILT_ON.get(item, ())]
            if earlier:
                which = "that" if len(earlier) == 1 else "those"
                msg += f"\n({item} is built on {', '.join(earlier)}: fix {which} first)"
            report.add(item, False, msg)
    for text in general:
        report.add("check run", False, text)
    return report


def first_text(recs) -> str:
    return next((v["message"] for r in recs for v in r.verdicts.values() if v["message"]), "")


def only_others(rec) -> bool:
    return all(v.get("other") for v in rec.verdicts.values() if not v["ok"])


def describe(rec, hang_hint: str) -> str:
    """The message of one failed case: a rank's exception first (a partner waiting on that rank is its
    consequence), else a hang with where each rank waited (and what the ranks that returned got wrong), else the
    first rank's own failure, else how the launch ended."""
    bad = {r: v for r, v in sorted(rec.verdicts.items()) if not v["ok"]}
    own = {r: v for r, v in bad.items() if not v.get("other")} or bad
    missing = sorted(set(range(rec.world)) - set(rec.verdicts))
    head = f"{rec.label}: " if rec.label else ""
    if rec.ended == "hung" and not any(v.get("kind") == "error" for v in own.values()):
        # ranks that saw a partner's connection close waited too: the hang is the fault, not the closed socket
        gone = {r: v for r, v in own.items() if v.get("kind") == "peer_gone"}
        wrong = {r: v for r, v in own.items() if r not in gone}
        return hang(rec, head, sorted(missing + list(gone)), gone, hang_hint) + (
            "\n" + first_of(wrong, "") if wrong else "")
    if own and missing and rec.ended and rec.ended != "hung" and all(v.get("kind") == "peer_gone"
                                                                     for v in own.values()):
        return crashed(rec, head, missing) + "\n" + first_of(own, "then ")
    if own:   # a rank's own error first; a partner whose connection closed only waited on a rank that failed
        shown = {r: v for r, v in own.items() if v.get("kind") != "peer_gone"} or own
        gone = [f"rank {r} was waiting at {v['where']} (until its partner's connection closed)"
                for r, v in own.items() if r not in shown and v.get("where")]
        return "\n".join([first_of(shown, head), *gone, *whereabouts(rec, missing)])
    if missing and rec.ended and rec.ended != "hung":   # no rank returned: each ended inside the call (all aborted)
        return crashed(rec, head, missing)
    return f"{head}{rec.ended}"


def whereabouts(rec, missing: list[int]) -> list[str]:
    """Where each rank that gave no verdict was: died (of a signal, at its line), waiting (at its line), or not
    known (it waited on a partner that gave up)."""
    died, lines, unknown = getattr(rec, "died", {}), [], []
    for r in missing:
        if died.get(r):
            lines.append(f"rank {r} died at {died[r]}")
        elif rec.stuck.get(r):
            lines.append(f"rank {r} was waiting at {rec.stuck[r]}")
        else:
            unknown.append(r)
    if unknown:
        lines.append(f"ranks {unknown} did not return (waiting on a partner that gave up)")
    return lines


def crashed(rec, head: str, ranks: list[int]) -> str:
    """Ranks whose process ended inside a case (gloo aborts on a size mismatch): they are the fault, and the
    partners' closed connection its consequence; their own last lines say why."""
    first, *tail = rec.ended.splitlines()       # "a rank exited during the case (exit codes)", the ranks' last lines
    mine = [line for line in tail if line.startswith(tuple(f"rank {r}: " for r in ranks))]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
    died = getattr(rec, "died", {})
    at = f" at {died[ranks[0]]}" if len(ranks) == 1 and died.get(ranks[0]) else ""
    lines = [] if at else [f"rank {r} died at {died[r]}" for r in ranks if died.get(r)]
    return "\n".join([f"{head}{who} ended during the call{at} ({first})", *lines, *mine])


def first_of(verdicts: dict, head: str) -> str:
    """'HEAD rank 1: message' (or 'ranks [0, 1] (rank 0 shown): ...') for the lowest failing rank."""
    r0, v = next(iter(verdicts.items()))
    who = f"rank {r0}" if len(verdicts) == 1 else f"ranks {sorted(verdicts)} (rank {r0} shown)"
    return f"{head}{who}: {v['message']}"


def hang(rec, head: str, ranks: list[int], gone: dict, hint: str) -> str:
    returned = sorted(set(range(rec.world)) - set(ranks))
    waited = rec.waited or rec.seconds     # the real wait (a record made by hand may have only the deadline)
    if getattr(rec, "deadlock", False):
        lines = [f"{head}did not finish: a deadlock, ranks {ranks} did not return"
                 + (f" (ranks {returned} did, and waited for them)" if returned else "")
                 + f"; every rank was waiting on another and none finished a call (seen after {waited:.0f} s)"]
    else:
        lines = [f"{head}did not finish (deadlock or hang): ranks {ranks} did not return within {waited:.0f} s"
                 + (f" (ranks {returned} did)" if returned else "")]
    for r in ranks:
        if rec.stuck.get(r):
            lines.append(f"rank {r} was waiting at {rec.stuck[r]}")
        elif gone.get(r, {}).get("where"):
            lines.append(f"rank {r} was waiting at {gone[r]['where']} (until its partner's connection closed)")
        elif r in rec.stuck:
            lines.append(f"rank {r} was waiting outside your file (in the checker's own calls)")
    lines.append("hint: " + hint)
    return "\n".join(lines)
