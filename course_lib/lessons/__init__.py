"""Small helpers of the lessons: checks of the short exercises of notebooks 01 and 04, and a test of whether a
run is the run a lesson assumes (``runs``)."""
