"""Runs INSIDE the sandbox (stdlib only, started with `python -I`): call the solution on each case's inputs.

It knows no expected values. Each case's return value goes out as one JSON line on the result fd (then a
closing record with the count), encoded by a strict encoder that accepts only exact builtin types, so an
always-equal object or a `str` subclass cannot pass as anything. The grader outside compares; a run with no
closing record (crash, exit, timeout) scores 0.

usage: python -I harness_function.py RESULT_FD CASES_JSON SOLUTION_PY ENTRY_POINT CASE_TIMEOUT_S
"""

import json
import math
import os
import signal
import sys
import types

MAX_DEPTH = 200


def to_plain(x, depth=0):
    """A fresh copy of x built only from exact None/bool/int/float/str/list/dict (tuples become lists), or raise."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        return x
    if t is float:
        if not math.isfinite(x):
            raise ValueError("non-finite float")
        return x
    if t is list or t is tuple:
        return [to_plain(v, depth + 1) for v in x]
    if t is dict:
        out = {}
        for k, v in x.items():
            if type(k) is not str:
                raise TypeError(f"dict key of type {type(k).__name__}")
            out[k] = to_plain(v, depth + 1)
        return out
    raise TypeError(f"unsupported return type {t.__module__}.{t.__qualname__}")


class CaseTimeout(BaseException):
    """BaseException so that a solution's bare `except Exception` does not swallow it."""


def _alarm(signum, frame):
    raise CaseTimeout()


def main():
    fd, cases_path, code_path, entry, case_timeout = sys.argv[1:6]
    out = os.fdopen(int(fd), "w", buffering=1)

    def emit(obj):
        out.write(json.dumps(obj, allow_nan=False) + "\n")
        out.flush()

    # Read everything we need before any solution code runs.
    with open(cases_path) as f:
        raw_cases = [json.dumps(c) for c in json.load(f)]
    with open(code_path) as f:
        code = f.read()
    mod = types.ModuleType("solution")
    mod.__file__ = os.path.join(os.getcwd(), "solution.py")
    sys.modules["solution"] = mod
    sys.path.append(os.getcwd())
    try:
        exec(compile(code, "solution.py", "exec"), mod.__dict__)
        fn = getattr(mod, entry)
        if not callable(fn):
            raise TypeError(f"{entry} is not callable")
    except BaseException as e:  # noqa: BLE001 - report and stop: nothing can pass without the function
        emit({"load_error": f"{type(e).__name__}: {e}"[:500]})
        emit({"done": 0})
        return
    signal.signal(signal.SIGALRM, _alarm)
    for i, raw in enumerate(raw_cases):
        case = json.loads(raw)  # fresh inputs per case: a mutating solution cannot leak state into the next case
        try:
            signal.setitimer(signal.ITIMER_REAL, float(case_timeout))
            try:
                value = to_plain(fn(*case.get("args", []), **case.get("kwargs", {})))
                line = json.dumps({"i": i, "v": value}, allow_nan=False)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures of this case too
            line = json.dumps({"i": i, "err": type(e).__name__})
        out.write(line + "\n")
        out.flush()
    emit({"done": len(raw_cases)})  # the host scores nothing without this closing record


if __name__ == "__main__":
    main()
