"""Data parallelism written by the learner (notebook 10): the checker of own_ddp.py and the notebook's timing runs."""
