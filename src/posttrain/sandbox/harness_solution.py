"""Runs INSIDE the sandbox, as a uid of its own: the solution process of out-of-process pytest grading.

It imports the solution's modules and answers the test process's requests (import, getattr, setattr, call,
and a fixed set of operators) over two pipes. It never sees the result channel: the fd is closed before this
process starts, and the test process runs under another uid, so /proc/<pid>/fd of it is out of reach. Whatever
the solution does here (patch builtins, exit, lie) changes only the answers it gives.

usage: python -I -B harness_solution.py REQUEST_FD REPLY_FD WORK_DIR
"""

import builtins
import importlib
import itertools
import operator
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's dir out
import harness_wire as wire  # pyright: ignore[reportMissingImports]  # a sibling script, on sys.path in the sandbox

OPS = {
    "len": len,
    "bool": bool,
    "str": str,
    "repr": repr,
    "contains": operator.contains,
    "getitem": operator.getitem,
    "setitem": operator.setitem,
    "delitem": operator.delitem,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "neg": operator.neg,
    "iter": lambda o: list(itertools.islice(iter(o), wire.MAX_ITEMS)),
    "enter": lambda o: type(o).__enter__(o),
    "exit": lambda o, *a: type(o).__exit__(o, *a),
}


class Objects:
    """Reference numbers for the objects the test process holds. Kept alive for the whole run, so a number
    always means the same object (exception classes are matched by it).

    `by_id` is the one map by object identity in posttrain, on purpose: it numbers the solution's own objects,
    which may define `__eq__` / `__hash__` to lie, so only identity is safe, and every object it numbers is held in
    `by_ref` for the whole run, so no id can be reused for another object."""

    def __init__(self):
        self.by_ref = {}
        self.by_id = {}

    def ref_of(self, obj):
        n = self.by_id.get(id(obj))
        if n is None:
            n = len(self.by_ref) + 1
            self.by_ref[n] = obj
            self.by_id[id(obj)] = n
        out = {"ref": n, "type": str(getattr(type(obj), "__qualname__", "?"))[:200]}
        if isinstance(obj, type) and issubclass(obj, BaseException):
            base = next((c for c in obj.__mro__ if getattr(builtins, c.__name__, None) is c), BaseException)
            out.update(exc=base.__name__, name=str(obj.__name__)[:200], builtin=base is obj)
        return out

    def from_ref(self, x):
        n = x.get("ref")
        if type(n) is not int or n not in self.by_ref:
            raise wire.WireError(f"unknown reference {n!r}")
        return self.by_ref[n]


def handle(objs, msg):
    op = msg.get("op")
    dec = lambda v: wire.decode(v, objs.from_ref)
    if op == "import":
        name = msg.get("name")
        if type(name) is not str or not all(p.isidentifier() for p in name.split(".")):
            raise ImportError(f"bad module name {name!r}")
        return importlib.import_module(name)
    obj = objs.from_ref(msg)
    if op == "getattr":
        return getattr(obj, str(msg.get("name")))
    if op == "setattr":
        return setattr(obj, str(msg.get("name")), dec(msg.get("value")))
    if op == "delattr":
        return delattr(obj, str(msg.get("name")))
    if op == "call":
        return obj(*dec(msg.get("args", {"list": []})), **dec(msg.get("kwargs", {"dict": []})))
    if op in OPS:
        return OPS[op](obj, *dec(msg.get("args", {"list": []})))
    raise wire.WireError(f"unknown op {op!r}")


def describe(objs, e):
    try:
        msg = str(e)[:2000]
    except BaseException:  # noqa: BLE001 - a solution's __str__ may raise anything
        msg = ""
    return {"cls": objs.ref_of(type(e)), "msg": msg}


def flush_output():
    """Print output reaches the host before the answer does: once the last answer is in, the run may end and
    this process be killed, and a pipe's block buffer would die with it (seen under load in CI)."""
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is None:  # started without that stream: nothing to flush
            continue
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or replaced stream only loses the solution's own output
            pass


def main():
    req_fd, reply_fd, work_dir = sys.argv[1:4]
    keep = sorted({0, 1, 2, int(req_fd), int(reply_fd)})
    for lo, hi in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")]):
        os.closerange(lo + 1, hi)  # anything else inherited (the result fd above all) is gone before solution code
    requests = os.fdopen(int(req_fd), "rb")
    replies = os.fdopen(int(reply_fd), "wb")
    # Appended, not prepended: solution files must not shadow the stdlib.
    sys.path.append(work_dir)
    objs = Objects()
    for line in requests:
        msg = wire.loads(line)
        try:
            reply = {"id": msg.get("id"), "ok": wire.encode(handle(objs, msg), objs.ref_of)}
        except BaseException as e:  # noqa: BLE001 - SystemExit from solution code is an answer too
            reply = {"id": msg.get("id"), "raise": describe(objs, e)}
        flush_output()
        replies.write(wire.dumps(reply))
        replies.flush()


if __name__ == "__main__":
    main()
