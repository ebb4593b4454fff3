"""DDP in six steps: the checker (check), the probe inside each rank (probe), the step diff (stepdiff)."""
