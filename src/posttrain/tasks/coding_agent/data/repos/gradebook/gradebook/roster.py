"""A class roster: students' scores, finals and the ranking."""

from gradebook.letters import letter
from gradebook.scores import weighted

WEIGHTS = {"homework": 0.3, "exams": 0.7}
DROP_LOWEST = {"homework": 1}  # the worst homework does not count


class Roster:
    def __init__(self):
        self.students = {}  # name -> {part: [scores]}

    def record(self, name, part, score):
        """Add one score (0-100) for a part of WEIGHTS."""
        if part not in WEIGHTS:
            raise ValueError(f"unknown part {part!r}")
        if not 0 <= score <= 100:
            raise ValueError("scores are 0-100")
        self.students.setdefault(name, {p: [] for p in WEIGHTS})[part].append(score)

    def final(self, name):
        """The weighted final average of `name`, rounded to one decimal."""
        return round(weighted(self.students[name], WEIGHTS, DROP_LOWEST), 1)

    def ranking(self):
        """(name, final, letter) for every student: best final first, equal finals by name A-Z."""
        rows = [(name, self.final(name)) for name in self.students]
        rows.sort(key=lambda r: (-r[1], r[0]))
        return [(name, final, letter(final)) for name, final in rows]
