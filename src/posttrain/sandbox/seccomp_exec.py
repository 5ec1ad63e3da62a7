"""Runs INSIDE the sandbox, as root, in the launch chain of backends without `bwrap --seccomp` (unshare): load
the compiled seccomp program from a file, then exec the rest of the chain. The filter is inherited by every
process the run starts and cannot be removed. Stdlib only (started with `python -I -S`).

usage: python -I -S seccomp_exec.py FILTER.bpf -- COMMAND...
"""

import ctypes
import os
import sys

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def main():
    path, sep, *cmd = sys.argv[1:]
    if sep != "--" or not cmd:
        sys.exit("usage: seccomp_exec.py FILTER.bpf -- COMMAND...")
    with open(path, "rb") as f:
        prog = f.read()
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        sys.exit(f"seccomp_exec: loading the filter failed: {os.strerror(err)}")  # fail closed: nothing runs
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
