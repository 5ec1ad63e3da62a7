"""`posttrain serve --tool-parser / --reasoning-parser` (cli/serve_cmds.py): a name no registry holds is refused
with the names known, before the model loads."""

from typer.testing import CliRunner

from posttrain.cli.app import app


def test_an_unknown_parser_is_refused_before_the_model_loads(monkeypatch):
    from posttrain.sampling import openai_server

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(openai_server, "build_model_app", no_load)
    r = CliRunner().invoke(app, ["serve", "--model", "tiny-random", "--tool-parser", "gpt"])
    assert r.exit_code == 2 and "unknown tool parser 'gpt'" in r.output and "qwen3_coder" in r.output
    r = CliRunner().invoke(app, ["serve", "--model", "tiny-random", "--reasoning-parser", "r1"])
    assert r.exit_code == 2 and "unknown reasoning parser 'r1'" in r.output


def test_the_parsers_reach_the_app(monkeypatch):
    from posttrain.sampling import http_serve, openai_server

    seen = {}
    monkeypatch.setattr(openai_server, "build_model_app", lambda *a, **k: seen.update(k) or object())
    monkeypatch.setattr(http_serve, "run_forever", lambda *a, **k: None)
    r = CliRunner().invoke(app, ["serve", "--model", "tiny-random", "--tool-parser", "llama3",
                                 "--reasoning-parser", "none"])
    assert r.exit_code == 0, r.output
    assert (seen["tool_parser"], seen["reasoning_parser"]) == ("llama3", "none")
