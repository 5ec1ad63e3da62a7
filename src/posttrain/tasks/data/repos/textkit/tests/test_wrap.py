from textkit.wrap import truncate, wrap_words


def test_truncate():
    assert truncate("hello", 10) == "hello"
    assert truncate("hello world", 8) == "hello..."
    assert truncate("abcdef", 4, marker="~") == "abc~"


def test_wrap_words():
    assert wrap_words("the quick brown fox", 10) == ["the quick", "brown fox"]
    assert wrap_words("", 5) == []
    assert wrap_words("supercalifragilistic a", 5) == ["supercalifragilistic", "a"]
