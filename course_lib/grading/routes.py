"""The course map's routes (the README's table) as sets of notebooks, and the exercises each route grades.

An exercise belongs to a route when the notebook that teaches it (course_lib.registry) is on the route, so a new
exercise joins the routes of its notebook without an edit here. ``course grade --route one-day`` grades those.
"""
from course_lib.registry import EXERCISES

HALF_DAY = ("00", "01", "02", "03", "04")
ROUTES: dict[str, tuple[str, ...]] = {
    "half-day": HALF_DAY,
    "one-day": HALF_DAY + ("05", "06"),
    "one-day-debugging": HALF_DAY + ("07", "05"),
    "self-study": (),     # every notebook, in order: every exercise
}


def route_exercises(route: str) -> list[str]:
    """The exercises of ``route``, in the course's order."""
    notebooks = ROUTES[route]
    return [name for name, e in EXERCISES.items() if not notebooks or e.notebook[:2] in notebooks]
