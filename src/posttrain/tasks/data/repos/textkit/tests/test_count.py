from textkit.count import char_histogram, most_common_word, word_count


def test_word_count():
    assert word_count("one two  three") == 3
    assert word_count("") == 0


def test_char_histogram():
    assert char_histogram("a ba") == {"a": 2, "b": 1}
    assert char_histogram("") == {}


def test_most_common_word():
    assert most_common_word("the cat and The hat") == "the"
    assert most_common_word("a b") == "a"
    assert most_common_word("x y y") == "y"
    assert most_common_word("") is None
