"""Sandbox settings and the plain result records that every backend returns."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Backend = Literal["auto", "bwrap", "unshare", "unsafe"]


def _default_python() -> str:
    # The interpreter that runs posttrain is the one most likely to have what solutions and pytest need.
    exe = sys.executable
    if exe and os.path.exists(exe):
        return exe
    return "/usr/bin/python3"


class SandboxConfig(BaseModel):
    """Isolation and limits for one sandboxed run. Every run gets a fresh copy of these limits."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend = "auto"
    allow_unsafe: bool = Field(default=False, description="permit the limits-only backend, which hides no host files")
    timeout_s: float = Field(default=10.0, gt=0, description="wall clock for the whole run, process tree included")
    cpu_s: int | None = Field(default=None, gt=0, description="RLIMIT_CPU per process; default: ceil(timeout_s) + 1")
    case_timeout_s: float | None = Field(default=None, gt=0, description="grade_function: wall clock per case")
    memory_mb: int = Field(default=512, gt=0, description="RLIMIT_AS per process")
    max_procs: int = Field(default=32, gt=0, description="RLIMIT_NPROC (processes plus threads) for the run's own uid")
    max_file_mb: int = Field(default=16, gt=0, description="RLIMIT_FSIZE: largest file a process may write")
    max_open_files: int = Field(default=64, gt=3, description="RLIMIT_NOFILE")
    tmpfs_mb: int = Field(default=64, gt=0, description="size of the fresh work dir (also holds /tmp)")
    max_inodes: int = Field(default=8192, gt=64, description="files and dirs the work dir's tmpfs may hold")
    run_memory_mb: int = Field(
        default=1024,
        gt=0,
        description="cgroup memory limit for the whole run: every process, "
        "tmpfs, shared memory, memfd and kernel objects together",
    )
    max_output_bytes: int = Field(default=65536, ge=0, description="stdout and stderr are each cut at this many bytes")
    max_result_bytes: int = Field(default=4 << 20, gt=0, description="cap on the grading result channel")
    python: str = Field(
        default_factory=_default_python, description="interpreter used inside; its prefix is bound read-only"
    )
    concurrency: int = Field(default=2, ge=1, description="SandboxPool: runs at once")
    staging_dir: str | None = Field(
        default=None, description="host dir for per-run staging folders; default: the temp dir"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables inside (after clearing)")

    def cpu_limit_s(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 1


@dataclass
class RunResult:
    """What came back from one sandboxed command. Nothing here is trusted as a reward."""

    stdout: str
    stderr: str
    exit_code: int | None  # 128+N when the command died from signal N
    timed_out: bool
    killed: bool  # we killed it at the deadline, or it died from a signal (limits end processes that way)
    duration_s: float
    isolation: str  # "bwrap" | "unshare" | "unsafe"
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    uid: int | None = None  # the run's own uid on the host (None when not root: the caller's uid was kept)
    error: str | None = None  # set when the sandbox itself could not start
    oom_killed: bool = False  # the kernel killed a process of the run at the run's cgroup memory limit
    # Defences that could not be used for this run, each with the reason ("seccomp", "cgroup", "inode_cap",
    # "private_staging", "separate_uids"). Empty on a fully equipped machine.
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class GradeResult:
    """Outcome of grading; computed outside the sandbox from the solution's outputs and hidden expectations.

    `trust` says where the verdict came from: "out-of-process" when the solution never ran in the process that
    decided or reported it (values compared on the host, or tests run in a separate process under another
    uid); "in-process" when the solution shared that process, so a solution written against the harness could
    forge it.
    """

    score: float
    passed: int
    total: int
    per_case: list[bool]
    isolation: str
    error: str | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    run: RunResult | None = field(default=None, repr=False)  # the underlying run, for logs and hack detectors
    trust: str = "out-of-process"
    # grade_pytest: each statically found test id -> passed (every case of it passed). Lets a task reward the tests
    # an issue breaks without paying for the ones the untouched code already passes (coding-agent's issue_tests).
    # None: no verdict per test (the run timed out, was killed, or its report was broken or tampered with; and
    # for grade_function). "Unknown", never "all failed": a repair task's baseline must not be read from it.
    per_test: dict[str, bool] | None = None
