"""The frame of the lessons' small checks: import the file, run each part on it, one Report."""
from course_lib.core.loader import import_path
from course_lib.core.report import Report


def run_parts(exercise: str, path, parts) -> Report:
    """Import the learner's file at ``path`` and let each ``part(module, report)`` add its verdicts."""
    report = Report(exercise, str(path))
    try:
        module = import_path(path, f"learner_{exercise}")
    except Exception as e:          # the learner's file: any error at import is the verdict
        report.add("import", False, f"{type(e).__name__}: {e}")
        return report
    for part in parts:
        part(module, report)
    return report
