"""Letter grades from final averages."""

CUTOFFS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


def letter(final):
    """'A' from 90 up, 'B' from 80 up to 90, 'C' from 70, 'D' from 60, 'F' below 60."""
    for cutoff, grade in CUTOFFS:
        if final >= cutoff:
            return grade
    return "F"
