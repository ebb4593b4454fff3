"""The shared core of the course tools: the rank-process toolkit, the check report, a job's spec and the site
profile, loading a learner's file, and where things are (sources and workspace). Launching ranks and process trees
are course_lib.runtime's."""
