"""Counting words and characters."""


def word_count(text):
    """Number of whitespace-separated words in `text`."""
    return len(text.split())


def char_histogram(text):
    """Dict of character -> count, spaces excluded."""
    hist = {}
    for ch in text:
        if ch == " ":
            continue
        hist[ch] = hist.get(ch, 0) + 1
    return hist


def most_common_word(text):
    """The most frequent lower-cased word; the earliest one wins ties; None for empty text."""
    words = [w.lower() for w in text.split()]
    if not words:
        return None
    counts = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    best = words[0]
    for w in words:
        if counts[w] > counts[best]:
            best = w
    return best
