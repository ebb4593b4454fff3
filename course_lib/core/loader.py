"""Checkers of the learner's work: one module per exercise (ddp, allreduce, tp), one report type."""
import importlib.util


def import_path(path, name: str):
    """Import the file at ``path`` as module ``name`` (a learner's file is no package); errors propagate."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
