"""Fitting text into a width."""


def truncate(text, width, marker="..."):
    """`text` if it fits in `width`, else cut so that the result plus `marker` is exactly `width` long."""
    if len(text) <= width:
        return text
    return text[: max(0, width - len(marker))] + marker


def wrap_words(text, width):
    """Greedy word wrap: a list of lines, each at most `width` long unless a single word is longer."""
    lines = []
    line = ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines
