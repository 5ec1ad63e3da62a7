"""The seccomp filter every bwrap run gets: syscalls a graded program never needs are refused with an errno.

Built once per process through libseccomp (the `pyseccomp` ctypes binding) and handed to `bwrap --seccomp FD`
as compiled BPF. The default action is ALLOW: this is a deny list of kernel surface, not a full allow list,
because the interpreter, pytest and solutions use a broad and changing set of ordinary syscalls. Only the
native architecture is in the filter, so a syscall made through another ABI (int 0x80 on x86_64) is killed by
libseccomp's bad-arch action. docs/sandbox.md renders DENIED as its table; change both together.
"""

from __future__ import annotations

import errno
import functools
import tempfile

# (syscall, reason). Each is refused with EPERM unless noted in ERRNOS.
DENIED: list[tuple[str, str]] = [
    (
        "unshare",
        "new namespaces: a nested user namespace gives the run CAP_SYS_ADMIN over its own mounts, so it "
        "could mount a tmpfs outside tmpfs_mb and reach kernel code paths meant for root",
    ),
    ("setns", "joining another namespace"),
    (
        "clone3",
        "its flags live in memory a filter cannot read, so namespace flags cannot be checked; ENOSYS "
        "makes libc fall back to clone, whose flags are checked",
    ),
    ("mount", "mounting needs a namespace we refuse anyway; defence in depth"),
    ("umount2", "as mount"),
    ("pivot_root", "as mount"),
    ("chroot", "as mount"),
    ("fsopen", "new mount API"),
    ("fsmount", "new mount API"),
    ("fsconfig", "new mount API"),
    ("move_mount", "new mount API"),
    ("open_tree", "new mount API"),
    ("mount_setattr", "new mount API"),
    ("add_key", "kernel keyrings are per uid, not per namespace: keys outlive the run and other runs can read them"),
    ("request_key", "as add_key"),
    ("keyctl", "as add_key"),
    ("io_uring_setup", "io_uring performs socket and file operations without the syscalls this filter checks"),
    ("io_uring_enter", "as io_uring_setup"),
    ("io_uring_register", "as io_uring_setup"),
    ("bpf", "kernel programs and maps"),
    ("perf_event_open", "kernel and hardware introspection, a frequent source of kernel bugs"),
    ("userfaultfd", "used to stretch kernel race windows in exploits"),
    ("ptrace", "another process's memory: a run has no debugger to run"),
    ("process_vm_readv", "as ptrace"),
    ("process_vm_writev", "as ptrace"),
    ("kcmp", "as ptrace"),
    ("pidfd_getfd", "stealing another process's file descriptors"),
    ("name_to_handle_at", "file handles bypass path-based confinement"),
    ("open_by_handle_at", "as above"),
    ("fanotify_init", "filesystem-wide event watches"),
    ("kexec_load", "root-only kernel control"),
    ("kexec_file_load", "as kexec_load"),
    ("init_module", "as kexec_load"),
    ("finit_module", "as kexec_load"),
    ("delete_module", "as kexec_load"),
    ("reboot", "as kexec_load"),
    ("swapon", "as kexec_load"),
    ("swapoff", "as kexec_load"),
    ("acct", "as kexec_load"),
    ("quotactl", "as kexec_load"),
    ("syslog", "kernel log"),
    ("settimeofday", "host clock"),
    ("clock_settime", "host clock"),
    ("adjtimex", "host clock"),
    ("clock_adjtime", "host clock"),
    ("personality", "READ_IMPLIES_EXEC and similar legacy modes"),
]
ERRNOS = {"clone3": errno.ENOSYS}
# Namespace flags refused in clone(2) (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
CLONE_NS_FLAGS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000]
# Socket families a graded program may use: unix, inet, inet6, netlink (libc's getaddrinfo asks the kernel for
# local addresses over it). The rest (vsock reaches the VM host and no namespace covers it; packet, alg,
# bluetooth, rds, tipc, xdp...) get EAFNOSUPPORT, as if the kernel had no support.
ALLOWED_FAMILIES = (1, 2, 10, 16)
FAMILY_CAP = 64


@functools.lru_cache(maxsize=1)
def build() -> tuple[bytes | None, str | None]:
    """(BPF program, None), or (None, why the filter cannot be built here)."""
    try:
        import pyseccomp as sc
    except ImportError as e:
        return None, f"pyseccomp not installed ({e}); pip install pyseccomp"
    except OSError as e:  # the binding loads libseccomp.so.2 at import
        return None, f"libseccomp not found ({e}); apt-get install libseccomp2"
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        for name, _ in DENIED:
            try:
                f.add_rule(sc.ERRNO(ERRNOS.get(name, errno.EPERM)), name)
            except (OSError, ValueError, RuntimeError):
                pass  # a syscall this kernel/libseccomp does not know cannot be called either
        for flag in CLONE_NS_FLAGS:
            f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        for call in ("socket", "socketpair"):
            for fam in range(FAMILY_CAP):
                if fam not in ALLOWED_FAMILIES:
                    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, fam))
            # Families past the table, and any value with high bits set (the kernel reads an int).
            f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.GE, FAMILY_CAP))
        with tempfile.TemporaryFile() as tmp:  # libseccomp writes to a real fd
            f.export_bpf(tmp)
            tmp.seek(0)
            return tmp.read(), None
    except Exception as e:  # noqa: BLE001 - any failure means "no filter", reported, never a crash
        return None, f"building the seccomp filter failed: {type(e).__name__}: {e}"
