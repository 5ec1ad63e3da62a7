"""Runs INSIDE the sandbox, in the test process: the solution's modules as proxies to the solution process.

`import inventory.store` in a pristine test file gets a module whose attributes are fetched from the solution
process (harness_solution.py). Plain values (see harness_wire.py) arrive as fresh builtin objects; everything
else is a `Remote` reference whose attribute access, calls and operators are requests. No code from the solution
runs here. Where a test meets a solution object, the solution still answers (its `==` between two of its own
objects, its `len`, its `str`), as any test of that object must ask it; but a solution object never equals a
value of the test's own (`Remote == 3` is False), so an always-equal object cannot pass an `assert f() == 3`.

Limits, by design: a test cannot subclass a solution class, use isinstance against one, or pass its own
functions or objects into the solution (they would have to run on this side).
"""

import builtins
import importlib.abc
import importlib.machinery
import os
import select
import time
import types

import harness_wire as wire  # pyright: ignore[reportMissingImports]  # a sibling script, on sys.path in the sandbox

MAX_REPLY = 16 << 20
NOT_MAPPED = {
    "BaseException",
    "StopIteration",
    "StopAsyncIteration",
    "GeneratorExit",
    "KeyboardInterrupt",
    "SystemExit",
}
SAFE_DUNDER_ATTRS = {"__name__", "__qualname__", "__doc__"}


class RemoteFailure(Exception):
    """The solution process raised something that is not an ordinary exception, died, hung or broke protocol."""


class Connection:
    """Requests to the solution process, one at a time, each bounded by `timeout_s`. The first broken reply,
    timeout or EOF marks it dead: every later request fails, so a solution cannot desynchronise the stream."""

    def __init__(self, wfd, rfd, timeout_s):
        self.wfd, self.rfd, self.timeout_s = wfd, rfd, timeout_s
        os.set_blocking(wfd, False)
        os.set_blocking(rfd, False)
        self.seq = 0
        self.dead = None
        self.timed_out = False  # the link died of a deadline (not a broken reply or an exit)
        self.buf = b""
        self.proxies = {}

    def _die(self, why):
        self.dead = why
        return RemoteFailure(f"solution process unavailable: {why}")

    def _send(self, data, deadline):
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.wfd], [], left)[1]:
                self.timed_out = True
                raise self._die("timed out sending a request")
            try:
                data = data[os.write(self.wfd, data) :]
            except BlockingIOError:
                continue
            except OSError as e:
                raise self._die(f"request pipe closed ({e.strerror})") from None

    def _line(self, deadline):
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                self.timed_out = True
                raise self._die(f"no answer within {self.timeout_s}s")
            try:
                chunk = os.read(self.rfd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise self._die("the solution process exited")
            self.buf += chunk
            if len(self.buf) > MAX_REPLY:
                raise self._die("reply too large")
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def request(self, op, **fields):
        if self.dead:
            raise RemoteFailure(f"solution process unavailable: {self.dead}")
        self.seq += 1
        deadline = time.monotonic() + self.timeout_s
        self._send(wire.dumps({"id": self.seq, "op": op, **fields}), deadline)
        try:
            msg = wire.loads(self._line(deadline))
            if msg.get("id") != self.seq:
                raise wire.WireError("reply out of order")
            if "ok" in msg:
                return wire.decode(msg["ok"], self.from_ref)
            if type(msg.get("raise")) is dict:
                exc = self.exception(msg["raise"])
            else:
                raise wire.WireError("reply is neither a value nor an exception")
        except (wire.WireError, RecursionError, ValueError, TypeError) as e:
            raise self._die(f"broken reply: {e}") from None
        raise exc

    def encode(self, value):
        def ref_of(x):
            if type(x) is Remote and object.__getattribute__(x, "_c") is self:
                return {"ref": object.__getattribute__(x, "_ref")}
            raise TypeError(
                f"cannot pass {type(x).__name__} to the solution process (only plain data and "
                "the solution's own objects cross)"
            )

        return wire.encode(value, ref_of)

    def from_ref(self, x):
        n = x["ref"]
        if type(n) is not int:
            raise wire.WireError("bad reference")
        if n not in self.proxies:
            self.proxies[n] = exception_class(x) if "exc" in x else Remote(self, n, str(x.get("type"))[:200])
        return self.proxies[n]

    def exception(self, info):
        cls = wire.decode(info.get("cls"), self.from_ref)
        msg = info.get("msg") if type(info.get("msg")) is str else ""
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            return RemoteFailure(f"the solution raised a non-exception: {msg}")
        try:
            return cls(msg)
        except Exception:  # noqa: BLE001 - some builtin exceptions take fixed arguments
            return RemoteFailure(f"{cls.__name__}: {msg}")


def exception_class(x):
    """A local class for a solution exception class: the builtin itself, or a subclass of its nearest builtin
    base. Non-Exception bases (SystemExit, pytest's Skipped...) become RemoteFailure: a test fails, never skips."""
    base_name = x.get("exc") if type(x.get("exc")) is str else ""
    base = getattr(builtins, base_name, None) if base_name not in NOT_MAPPED else None
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = RemoteFailure
    if x.get("builtin") is True and base is not RemoteFailure:
        return base
    name = x.get("name") if type(x.get("name")) is str and x["name"].isidentifier() else "SolutionError"
    return type(name, (base,), {"__module__": "solution"})


def _op(name, remote_only=False):
    def method(self, *args):
        if remote_only and not (type(args[0]) is Remote and object.__getattribute__(args[0], "_c") is self._c):
            return NotImplemented  # a solution object never compares equal to the test's own values
        c = object.__getattribute__(self, "_c")
        return c.request(name, ref=object.__getattribute__(self, "_ref"), args=c.encode(list(args)))

    return method


class Remote:
    """A solution object. Identity (and so hashing) is the reference number; everything else is a request."""

    __slots__ = ("_c", "_ref", "_type")

    def __init__(self, c, ref, type_name):
        for k, v in (("_c", c), ("_ref", ref), ("_type", type_name)):
            object.__setattr__(self, k, v)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in SAFE_DUNDER_ATTRS:
            raise AttributeError(name)
        return self._c.request("getattr", ref=self._ref, name=name)

    def __setattr__(self, name, value):
        self._c.request("setattr", ref=self._ref, name=name, value=self._c.encode(value))

    def __delattr__(self, name):
        self._c.request("delattr", ref=self._ref, name=name)

    def __call__(self, *args, **kwargs):
        return self._c.request(
            "call", ref=self._ref, args=self._c.encode(list(args)), kwargs=self._c.encode(dict(kwargs))
        )

    def __iter__(self):
        return iter(self._c.request("iter", ref=self._ref, args={"list": []}))

    def __hash__(self):
        return hash(("remote", self._ref))

    def __repr__(self):
        try:
            r = self._c.request("repr", ref=self._ref, args={"list": []})
        except Exception:  # noqa: BLE001 - pytest calls repr while reporting; never fail there
            r = None
        return r if type(r) is str else f"<solution {self._type} #{self._ref}>"

    __str__ = _op("str")
    __len__, __bool__, __contains__ = _op("len"), _op("bool"), _op("contains")
    __getitem__, __setitem__, __delitem__ = _op("getitem"), _op("setitem"), _op("delitem")
    __eq__, __ne__ = _op("eq", remote_only=True), _op("ne", remote_only=True)
    __lt__, __le__ = _op("lt", remote_only=True), _op("le", remote_only=True)
    __gt__, __ge__ = _op("gt", remote_only=True), _op("ge", remote_only=True)
    __add__, __sub__, __mul__ = _op("add"), _op("sub"), _op("mul")
    __truediv__, __floordiv__, __mod__, __neg__ = _op("truediv"), _op("floordiv"), _op("mod"), _op("neg")
    __enter__, __exit__ = _op("enter"), _op("exit")


class RemoteModule(types.ModuleType):
    """A solution module: attributes not set on this side are fetched from the solution process."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        conn, ref = self.__dict__["_ptsb_conn"], self.__dict__["_ptsb_ref"]
        return conn.request("getattr", ref=ref, name=name)


class SolutionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the solution's top-level names become RemoteModules. Installed last on sys.meta_path, so
    the stdlib and pytest always win over a solution file of the same name."""

    def __init__(self, conn, top_names):
        self.conn, self.tops = conn, set(top_names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.tops:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        try:
            remote = self.conn.request("import", name=spec.name)
        except Exception as e:  # noqa: BLE001 - any failure to import is an ImportError to the test
            raise ImportError(f"solution module {spec.name}: {type(e).__name__}: {e}") from None
        if type(remote) is not Remote:
            raise ImportError(f"solution module {spec.name}: not a module")
        mod = RemoteModule(spec.name)
        mod.__dict__.update(_ptsb_conn=self.conn, _ptsb_ref=object.__getattribute__(remote, "_ref"))
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass
