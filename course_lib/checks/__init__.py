"""Checkers of the learner's work: one module per exercise (ddp, allreduce, tp), one report type."""
