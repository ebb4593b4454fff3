"""Instructor tools: release (exercises from solutions), the notebook runner, the environment report, data."""
