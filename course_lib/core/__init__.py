"""The shared core of the course tools: launching ranks, process trees, the rank-process toolkit,
the check report, loading a learner's file, and where things are (sources and workspace)."""
