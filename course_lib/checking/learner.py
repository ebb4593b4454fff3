"""Where in the learner's file: the frame, the line, and one line that explains an exception."""
import os
import traceback


def learner_frame(frames, path: str) -> traceback.FrameSummary | None:
    """The innermost frame of ``frames`` that is in the learner's file ``path``; None when none is."""
    real = os.path.realpath(path)
    mine = [f for f in frames if os.path.realpath(f.filename) == real]
    return mine[-1] if mine else None


def learner_line(frames, path: str) -> str:
    """'allreduce.py:42 in ring_allreduce: dist.send(x, 1)' for the innermost frame in the learner's file."""
    f = learner_frame(frames, path)
    if f is None:
        return ""
    return f"{os.path.basename(path)}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


def error_where(exc: BaseException, path: str) -> str:
    """``learner_line`` for an exception; a SyntaxError has no frame there, only its line: 'file.py:LINE: text'."""
    if isinstance(exc, SyntaxError):
        return f"{os.path.basename(path)}:{exc.lineno}: {(exc.text or '').strip()}"
    return learner_line(traceback.extract_tb(exc.__traceback__), path)


def explain(exc: BaseException, path: str, shown: str) -> str:
    """One line for an exception the learner's code raised, pointing at their file (named ``shown``) when it can."""
    frame = learner_frame(traceback.extract_tb(exc.__traceback__), path)
    where = f" ({shown} line {frame.lineno}, in {frame.name})" if frame else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, NotImplementedError):    # a starter's stub: its words say what to write
        return f"not written yet: {text or 'NotImplementedError'}{where}"
    return f"{type(exc).__name__}: {text}{where}"
