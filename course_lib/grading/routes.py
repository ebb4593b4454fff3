"""The course map's routes (course_lib.lessons.course_map, the README's table) under the names ``--route`` takes,
and the exercises each route grades.

An exercise belongs to a route when the notebook that teaches it (course_lib.registry) is on the route, so a new
exercise joins the routes of its notebook without an edit here. ``course grade --route one-day`` grades those.
"""
from course_lib.lessons.course_map import ROUTES as MAP
from course_lib.registry import EXERCISES

NAMES = {"half day": "half-day", "one day": "one-day", "one day, debugging focus": "one-day-debugging"}
# self-study: every notebook, in order: every exercise
ROUTES: dict[str, tuple[str, ...]] = {**{NAMES[name]: notebooks for name, notebooks, _ in MAP}, "self-study": ()}


def route_exercises(route: str) -> list[str]:
    """The exercises of ``route``, in the course's order."""
    notebooks = ROUTES[route]
    return [name for name, e in EXERCISES.items() if not notebooks or e.notebook[:2] in notebooks]
