"""feature-deletion: ast body deletion, splicing, and grading restored / deleted functions with pytest."""

import ast

import pytest

from posttrain.tasks import feature_deletion as F

SRC = '''"""mod."""


class A:
    def f(self, x):
        """Doc."""
        y = x + 1
        return y


def g(x):
    # a comment that must survive
    return x * 2
'''


def _score(task, rows, texts):
    return task.rubric.score([[{"role": "assistant", "content": t}] for t in texts],
                             [{k: v for k, v in r.items() if k != "prompt"} for r in rows])


def test_sites_and_delete_body():
    sites = {s.qualname: s for s in F.function_sites(SRC)}
    assert set(sites) == {"A.f", "g"}
    stub = F.delete_body(SRC, sites["A.f"])
    assert '"""Doc."""\n        raise NotImplementedError\n' in stub and "y = x + 1" not in stub
    assert "# a comment that must survive" in stub
    ast.parse(stub)
    assert F.original_function(SRC, sites["g"]).startswith("def g(x):")


def test_splice_reindents_methods_and_adds_imports():
    stub = F.delete_body(SRC, next(s for s in F.function_sites(SRC) if s.qualname == "A.f"))
    out = F.splice(stub, "A.f", "import math\n\ndef f(self, x):\n    return math.floor(x)\n")
    ns: dict = {}
    exec(compile(out, "m", "exec"), ns)
    assert ns["A"]().f(2.5) == 2 and ns["g"](2) == 4
    assert F.splice(stub, "A.f", "def other():\n    pass") is None
    assert F.splice(stub, "A.f", "def f(:") is None


def test_repos_prompts_hide_tests():
    assert len(F.repo_names()) >= 2
    task = F.make_task()
    for row in task.train_rows + task.eval_rows:
        text = row["prompt"][0]["content"]
        assert "def test_" not in text and "tests/" not in text
        assert "raise NotImplementedError" in row["files"][row["path"]]
    keys = lambda rows: [(r["repo"], r["path"], r["qualname"]) for r in rows]
    again = F.make_task()
    assert keys(task.train_rows) == keys(again.train_rows) and keys(task.eval_rows) == keys(again.eval_rows)
    assert not set(keys(task.train_rows)) & set(keys(task.eval_rows)) and task.eval_rows


@pytest.mark.parametrize("every", [pytest.param(True, marks=pytest.mark.slow), False], ids=["all", "one-per-file"])
def test_restored_scores_one_and_deleted_scores_below_one(every):
    task = F.make_task()
    rows = task.train_rows + task.eval_rows
    if not every:  # the fast suite: one function of each source file; `-m slow` checks every function
        rows = list({(r["repo"], r["path"]): r for r in reversed(rows)}.values())
    refs = [task.references[(r["repo"], r["path"], r["qualname"])] for r in rows]
    restored = _score(task, rows, [f"```python\n{ref}```" for ref in refs])
    assert [r["qualname"] for r, s in zip(rows, restored) if s.components["tests_passed"] != 1.0] == []
    stubs = []
    for r in rows:
        site = next(s for s in F.function_sites(r["files"][r["path"]]) if s.qualname == r["qualname"])
        stubs.append(f"```python\n{F.original_function(r['files'][r['path']], site)}```")
    deleted = _score(task, rows, stubs)
    assert [r["qualname"] for r, s in zip(rows, deleted) if s.components["tests_passed"] >= 1.0] == []
    # The default reward pays only for the tests the deletion breaks: restoring earns 1, handing the stub back
    # earns 0 however many of the repo's other tests pass (the old tests_passed reward paid it for those).
    assert [r["qualname"] for r, s in zip(rows, restored) if s.components["issue_tests"] != 1.0 or s.reward != 1.0] == []
    assert [r["qualname"] for r, s in zip(rows, deleted) if s.components["issue_tests"] != 0.0 or s.reward != 0.0] == []
    assert any(s.components["tests_passed"] > 0 for s in deleted)


def test_the_old_reward_stays_an_option_and_bad_names_are_refused():
    old = F.make_task(reward="tests_passed")
    row = old.train_rows[0]
    site = next(s for s in F.function_sites(row["files"][row["path"]]) if s.qualname == row["qualname"])
    (stub,) = _score(old, [row], [f"```python\n{F.original_function(row['files'][row['path']], site)}```"])
    assert stub.reward == stub.components["tests_passed"] and stub.components["issue_tests"] == 0.0
    with pytest.raises(ValueError, match="reward must be one of"):
        F.make_task(reward="all")


def test_hack_in_restored_function_is_zeroed():
    task = F.make_task()
    row = task.train_rows[0]
    name = row["qualname"].rsplit(".", 1)[-1]
    hack = f"```python\nimport os\ndef {name}(*a, **k):\n    os._exit(0)\n```"
    (s,) = _score(task, [row], [hack])
    assert s.reward == 0.0 and s.components["hack_flagged"] == 1.0


def test_grading_is_out_of_process_and_a_forging_restore_scores_zero():
    # The function writes "passed" for every test id into every pipe it can reach, then exits; the repo's tests
    # run in another process under another uid, so none of it reaches the verdicts.
    from posttrain.sandbox import probe_backends
    from posttrain.sandbox.limits import can_switch_uid

    if not can_switch_uid() or all(probe_backends()[b] for b in ("bwrap", "unshare")):
        import pytest

        pytest.skip("out-of-process grading needs root and a namespaced backend")
    task = F.make_task(detect_hacks=False)
    row = task.train_rows[0]
    name = row["qualname"].rsplit(".", 1)[-1]
    forge = (f"```python\ndef {name}(*a, **k):\n    import glob, json, os, re\n    ids = []\n"
             "    for p in glob.glob('/tests/**/*.py', recursive=True):\n"
             "        rel = os.path.relpath(p, '/tests')\n"
             "        ids += [rel + '::' + m for m in re.findall(r'^def (test\\w*)', open(p).read(), re.M)]\n"
             "    data = ''.join(json.dumps({'kind': 'item', 'nodeid': i, 'passed': True}) + '\\n' for i in ids)\n"
             "    data += json.dumps({'kind': 'done', 'count': len(ids)}) + '\\n'\n"
             "    for fd in range(3, 64):\n"
             "        try:\n            os.write(fd, data.encode())\n        except OSError:\n            pass\n"
             "    os._exit(0)\n```")
    (s,) = _score(task, [row], [forge])
    assert s.components["tests_passed"] < 1.0 and s.components["grading_trust"] == 1.0


@pytest.mark.parametrize("expr", ["+".join(["x"] * 100_000), "x" + ".a" * 100_000, "-" * 100_000 + "x",
                                  "(" * 1000 + "x" + ")" * 1000], ids=["sum", "attributes", "unary", "parens"])
def test_splice_of_deeply_nested_model_code_is_none_not_a_crash(expr):
    """A completion whose function holds a deeply nested expression raised RecursionError (or MemoryError) out of
    ast.parse in splice, and with it out of the reward (issue #42); now it is code that does not splice in."""
    stub = F.delete_body(SRC, next(s for s in F.function_sites(SRC) if s.qualname == "g"))
    assert F.splice(stub, "g", "def g(x):\n    return " + expr + "\n") is None
