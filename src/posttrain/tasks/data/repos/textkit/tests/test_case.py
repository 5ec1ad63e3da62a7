from textkit.case import camel_to_snake, kebab_case, snake_to_camel


def test_snake_to_camel():
    assert snake_to_camel("hello_big_world") == "helloBigWorld"
    assert snake_to_camel("x") == "x"
    assert snake_to_camel("a__b") == "aB"
    assert snake_to_camel("") == ""


def test_camel_to_snake():
    assert camel_to_snake("helloBigWorld") == "hello_big_world"
    assert camel_to_snake("x") == "x"
    assert camel_to_snake("HTTP") == "h_t_t_p"


def test_kebab_case():
    assert kebab_case("Hello Big  World") == "hello-big-world"
    assert kebab_case("") == ""
