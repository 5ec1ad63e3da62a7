from gradebook.letters import letter


def test_cutoffs_are_inclusive():
    assert [letter(x) for x in (95, 90, 89.9, 80, 70, 60, 59.9)] == ["A", "A", "B", "B", "C", "D", "F"]
