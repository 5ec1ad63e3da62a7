"""Converting identifiers between naming styles."""


def snake_to_camel(name):
    """'hello_big_world' -> 'helloBigWorld'. Empty parts (double underscores) are dropped."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    return parts[0].lower() + "".join(p.capitalize() for p in parts[1:])


def camel_to_snake(name):
    """'helloBigWorld' -> 'hello_big_world'. Every upper-case letter starts a new word."""
    out = []
    for ch in name:
        if ch.isupper():
            if out:
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def kebab_case(text):
    """'Hello Big  World' -> 'hello-big-world': lower-case words joined by single hyphens."""
    return "-".join(w.lower() for w in text.split())
