"""One base for every error a user can cause (posttrain.errors.PosttrainError), caught once by the CLI: it prints
`error: <message>` and the fix, exits 2, and shows no traceback. Every exception class the package defines is
either such an error or on the commented allow-list of internal ones below."""

import ast
import builtins
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import posttrain
from posttrain.cli import app
from posttrain.errors import PosttrainError

SRC = Path(posttrain.__file__).parent

# Exceptions that are not the user's to fix: each fails one sample, request, tool call or episode and is caught
# there, steers control flow, or reports an infrastructure fault whose chained cause (the traceback) is the
# diagnosis. Anything not listed here must derive from PosttrainError.
INTERNAL = {
    # model output that fails one sample (bounded parsing of model text)
    "posttrain.bounded.BoundedError": "model text too large, deep, slow or invalid: that sample fails",
    "posttrain.bounded.BoundedTimeout": "a BoundedError",
    "posttrain.bounded.WorkerDied": "a BoundedError: the parse worker died on that sample",
    "posttrain.tasks.drawing_render.RenderError": "a model-written drawing program failed: that sample fails",
    "posttrain.tasks.drawing_gate._Refused": "the drawing gate's way out of its AST walk",
    "posttrain.rewards.answer_scores.GoldError": "caught per sample in rewards/named.py: that sample fails",
    "posttrain.rewards.answer_scores.CountedScore": "a scorer's way to return a score with a counter",
    "posttrain.rewards.rubric.RewardTimeout": "a reward function ran past its time: that sample fails",
    "posttrain.rewards.rubric.PartialRewardFailure": "a reward scored some samples: the others fail",
    "posttrain.sampling.context.ContextOverflow": "one prompt does not fit the context: that sample fails",
    "posttrain.sampling.openai_sampler.OpenAIReplyError": "one malformed server reply: that request's samples fail",
    "posttrain.envs.openenv_client.OpenEnvError": "an env server failed one episode: it fails, the run goes on",
    "posttrain.envs.tools.ToolError": "a tool's answer to the model ('error: ...'), never raised out of call_tool",
    "posttrain.envs.faults.InjectedFault": "raised on purpose by FaultyEnv (fault-injection tests)",
    "posttrain.guidance.guided_hint._FirstPrompt": "control flow: stops a render at its first prompt",
    "posttrain.auto.proposers.ProposalRejected": "an LLM proposal that cannot run: the proposer asks again",
    # the HTTP server's answers to a client (status codes), never raised to the command line
    "posttrain.sampling.openai_requests.BadRequest": "a 400 answer to a client",
    "posttrain.sampling.openai_requests.ContextLengthExceeded": "a 400 answer to a client",
    "posttrain.sampling.openai_requests.HTTPError": "a 5xx answer to a client",
    "posttrain.sampling.http_serve._BodyTooLarge": "a 413 answer to a client",
    # the sandbox's wire between host and solution process (its own protocol errors; a solution's timeout)
    "posttrain.sandbox.channel.ChannelError": "the solution process broke the channel protocol: that sample fails",
    "posttrain.sandbox.harness_wire.WireError": "a message broke the encoding rules: that sample fails",
    "posttrain.sandbox.harness_remote.RemoteFailure": "the solution process died, hung or broke protocol",
    "posttrain.sandbox.harness_function.CaseTimeout": "a BaseException so a solution's except cannot swallow it",
    # infrastructure: workers, ranks, engines and pools that died or lost sync; the chained cause is the diagnosis
    "posttrain.envs.tools.EnvWorkerLost": "an env worker died: the episode runs again on a live one",
    "posttrain.cluster.ray_episodes.EnvWorkerPoolError": "every env worker retired past cluster.max_restarts",
    "posttrain.cluster.ray_sampler.SamplerPoolError": "every sampler actor retired, or a share failed too often",
    "posttrain.cluster.server_processes.ServerPoolError": "every vLLM server retired, or a push failed too often",
    "posttrain.cluster.server_processes.ServerFailed": "one server failed a call: the caller restarts it",
    "posttrain.cluster.vllm_server_calls.RequestRejected": "a server refused a request posttrain built: a bug",
    "posttrain.training.distributed.TrainerRankError": "a trainer rank died; its chained cause says why",
    "posttrain.sampling.weight_ipc.WeightSyncError": "a weight push or pull timed out after its retries",
    "posttrain.sampling.shm_blocks.TornReadError": "a shared-memory weight copy kept changing under its reader",
    "posttrain.sampling.vllm_engine.StaleEngineError": "the engine serves another version than pushed: a bug",
}

# Not posttrain's code: the repositories a task's model edits (tasks/data/repos/*), and entry points that run.
SKIP_PREFIXES = ("posttrain.tasks.data.",)


def _exception_classes() -> tuple[dict[str, type], dict[str, list[str]]]:
    """Every exception class defined at the top of a posttrain module: the imported ones by name, and for a
    module that cannot be imported here (an optional dependency missing) its classes' base names, read from the
    source."""
    found: dict[str, type] = {}
    unimported: dict[str, list[str]] = {}
    for m in pkgutil.walk_packages(posttrain.__path__, "posttrain."):
        if m.name.endswith("__main__") or m.name.startswith(SKIP_PREFIXES):
            continue
        try:
            mod = importlib.import_module(m.name)
        except ImportError:  # an optional dependency (httpx, fastapi, ...) or a sandbox script's sibling import
            path = SRC.joinpath(*m.name.split(".")[1:])
            path = path / "__init__.py" if m.ispkg else path.with_suffix(".py")
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    unimported[f"{m.name}.{node.name}"] = [ast.unparse(b).split(".")[-1] for b in node.bases]
            continue
        for c in vars(mod).values():
            if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == mod.__name__:
                found[f"{c.__module__}.{c.__qualname__}"] = c
    return found, unimported


def test_every_error_class_is_a_posttrain_error_or_allow_listed():
    found, unimported = _exception_classes()
    assert len(found) > 40  # the walk reached the package
    user = {n.rsplit(".", 1)[1] for n, c in found.items() if issubclass(c, PosttrainError)}
    known = {n.rsplit(".", 1)[1] for n in found} | {
        e.__name__ for e in vars(builtins).values() if inspect.isclass(e) and issubclass(e, BaseException)
    }
    unchecked = []
    for name, bases in unimported.items():  # read from source: an exception class by its bases' names
        if not set(bases) & known and not name.rsplit(".", 1)[1].endswith(("Error", "Exception", "Overflow")):
            continue
        if name not in INTERNAL and not set(bases) & (user | {"PosttrainError"}):
            unchecked.append(f"{name}({', '.join(bases)})")
        found.setdefault(name, Exception)  # for the stale-entry check below
    bad = [
        f"{n}{[b.__name__ for b in c.__mro__[1:-2]]}"
        for n, c in sorted(found.items())
        if inspect.isclass(c) and c is not Exception and n not in INTERNAL and not issubclass(c, PosttrainError)
    ]
    assert not bad + unchecked, (
        "derive these from posttrain.errors.PosttrainError, or list them in INTERNAL with why: "
        + ", ".join(bad + unchecked)
    )
    stale = sorted(set(INTERNAL) - set(found))
    assert not stale, f"INTERNAL lists classes that no longer exist: {stale}"
    for n in INTERNAL:  # an internal error that became a user's error is taken off the list
        if n in found and inspect.isclass(found[n]) and found[n] is not Exception:
            assert not issubclass(found[n], PosttrainError), f"{n} is a PosttrainError: take it off INTERNAL"


def test_builtin_bases_callers_catch_are_kept():
    """Multiple inheritance keeps the old base: code that catches ValueError / RuntimeError / KeyError still does."""
    from posttrain.algos.registry import UnknownName
    from posttrain.config import ConfigError
    from posttrain.models.load import ModelLoadError

    assert issubclass(ConfigError, ValueError) and issubclass(ModelLoadError, RuntimeError)
    assert issubclass(UnknownName, KeyError) and str(UnknownName("no such loss")) == "no such loss"


def test_hint_is_the_message_then_the_fix():
    class Fixable(PosttrainError):
        fix = "do the thing"

    assert Fixable("it broke\n  the detail").hint() == "it broke\n  the detail\n  fix: do the thing"
    assert PosttrainError("").hint() == "PosttrainError"
    long = PosttrainError("x" * 10_000 + "\n" + "line\n" * 500).hint()
    assert len(long) < 5_000 and long.count("\n") < 50  # a huge message is cut, not dumped


# ---- the command line: one `error:` line (and the fix), exit 2, no traceback ----------------------------------

runner = CliRunner()
FAST = [
    "model.name=tiny-random",
    "model.threads=1",
    "logging.tensorboard=false",
    "logging.console=false",
    "loop.eval_prompts=2",
    "loop.save_every=0",
    "loop.prompts_per_step=2",
    "loop.eval_before=false",
    "loop.steps=1",
    "algorithm.num_generations=2",
]


def _teacher_with_another_tokenizer(tmp_path: Path) -> Path:
    from posttrain.models.tiny import tiny_random_model

    d = tmp_path / "teacher"
    model, tok = tiny_random_model(seed=1)
    tok.add_tokens(["<extra_token>"])
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """error name -> (overrides that reach it in a real run, what its message says)."""
    return {
        "WarmStartError": (["warm_start.steps=2"], "no demonstrations"),
        "TeacherError": (
            [f"algorithm.teacher.model={_teacher_with_another_tokenizer(tmp_path)}"],
            "different tokenizer",
        ),
        "VocabularyError": (
            ["algorithm.rised.enabled=true", f"algorithm.rised.vocabulary={tmp_path}/none.yaml"],
            "cannot read the tag vocabulary",
        ),
    }


def _assert_one_error_line(r, expect: str) -> None:
    out = r.output
    assert r.exit_code == 2, (r.exit_code, out, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception  # the error was caught, not raised out of the CLI
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expect in errors[0], out
    assert "Traceback" not in out


@pytest.mark.parametrize("error", ["WarmStartError", "TeacherError", "VocabularyError"])
@pytest.mark.parametrize("command", ["train", "ttrl"])
def test_a_user_error_in_a_run_is_one_line_and_exit_2(tmp_path, command, error):
    overrides, expect = _cases(tmp_path)[error]
    if command == "train":
        args = ["train", "task.name=count-a", *FAST, f"run.output_dir={tmp_path}/runs", *overrides]
    else:  # ttrl: `train` on a task's unlabelled prompts; the task comes from --task
        args = ["ttrl", "--task", "count-a", *FAST, f"run.output_dir={tmp_path}/runs", *overrides]
    _assert_one_error_line(runner.invoke(app, args), expect)


def test_the_fix_is_printed_under_the_error_and_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    import posttrain.loop

    class Fixable(PosttrainError):
        fix = "set loop.steps=2"

    def fixable(*a, **kw):
        raise Fixable("the run cannot start\nbecause of this")

    monkeypatch.setattr(posttrain.loop, "train", fixable)
    r = runner.invoke(app, ["train", *FAST, f"run.output_dir={tmp_path}"])
    _assert_one_error_line(r, "the run cannot start")
    assert "because of this" in r.output and "  fix: set loop.steps=2" in r.output

    def bug(*a, **kw):
        raise RuntimeError("a bug in posttrain")

    monkeypatch.setattr(posttrain.loop, "train", bug)
    r = runner.invoke(app, ["train", *FAST, f"run.output_dir={tmp_path}"])
    assert isinstance(r.exception, RuntimeError)  # not a user's error: not dressed up as one


def test_the_real_command_line_shows_no_traceback(tmp_path):
    """As a user meets it: a subprocess, stderr read as printed."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "posttrain.cli",
            "train",
            "task.name=count-a",
            *FAST,
            f"run.output_dir={tmp_path}",
            "warm_start.steps=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.count("error:") == 1, r.stderr[-2000:]
    assert "no demonstrations" in r.stderr
