"""Run untrusted code with isolation and limits; grade it outside the sandbox. Does not import torch.

run_command(["python3", "main.py"], {"main.py": "print(1)"}, SandboxConfig())
grade_function(code, "add", [{"args": [1, 2], "expected": 3}], SandboxConfig())
"""

from posttrain.sandbox.backends import detect_backend, probe_backends
from posttrain.sandbox.config import GradeResult, RunResult, SandboxConfig
from posttrain.sandbox.grading import grade_function, grade_pytest
from posttrain.sandbox.pool import SandboxPool
from posttrain.sandbox.run import run_command
from posttrain.sandbox.tools import SandboxUnavailable

__all__ = [
    "GradeResult",
    "RunResult",
    "SandboxConfig",
    "SandboxPool",
    "SandboxUnavailable",
    "detect_backend",
    "grade_function",
    "grade_pytest",
    "probe_backends",
    "run_command",
]
