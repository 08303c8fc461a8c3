"""A classic-BPF seccomp filter for the code sandbox (bubblewrap loads it with `--seccomp FD`).

The filter forbids creating processes and reaching other processes or the kernel's wider
surface, and allows everything else:
- `fork`, `vfork`, `clone` without CLONE_THREAD: EPERM (threads stay allowed, so one process
  can never become two: no fork bomb, no background survivor, whatever the uid);
- `clone3`: ENOSYS (the C library then falls back to `clone`, which the rule above checks);
- `ptrace`, `process_vm_readv/writev`, `unshare`, `setns`, `mount`, `umount2`, `pivot_root`,
  `chroot`, `bpf`, `perf_event_open`, `userfaultfd`, `keyctl`, `add_key`, `request_key`,
  `io_uring_*`, `kexec_*`, `init_module`/`finit_module`, `open_by_handle_at`: EPERM;
- any other ABI than the native one (i386 `int 0x80` on x86_64, x32): every call EPERM.
Only x86_64 and aarch64 are known; `build_filter` returns None elsewhere (the caller then runs
without the filter and says so).
"""
from __future__ import annotations

import platform
import struct

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
CLONE_THREAD = 0x00010000
X32_BIT = 0x40000000

_ARCHES = {
    "x86_64": (0xC000003E, dict(
        clone=56, fork=57, vfork=58, clone3=435, ptrace=101, process_vm_readv=310,
        process_vm_writev=311, unshare=272, setns=308, mount=165, umount2=166, pivot_root=155,
        chroot=161, bpf=321, perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248,
        request_key=249, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
        kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313,
        open_by_handle_at=304, fsopen=430, fsmount=432, move_mount=429, open_tree=428)),
    "aarch64": (0xC00000B7, dict(
        clone=220, clone3=435, ptrace=117, process_vm_readv=270, process_vm_writev=271,
        unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, bpf=280,
        perf_event_open=241, userfaultfd=282, keyctl=219, add_key=217, request_key=218,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=104,
        kexec_file_load=294, init_module=105, finit_module=273, open_by_handle_at=265,
        fsopen=430, fsmount=432, move_mount=429, open_tree=428)),
}


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes | None:
    """The filter as bytes (struct sock_filter array), or None for an unknown architecture."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    arch, nr = _ARCHES[machine]
    denied = [v for k, v in nr.items() if k not in ("clone", "clone3")]
    # Layout: header, one JEQ per denied call (-> DENY), clone -> CLONE, clone3 -> NOSYS,
    # ALLOW, DENY, NOSYS, CLONE: ld arg0; jset CLONE_THREAD -> ALLOW2 : DENY2.
    body: list[tuple] = []
    for v in denied:
        body.append(("jeq", v, "deny"))
    body.append(("jeq", nr["clone"], "clone"))
    body.append(("jeq", nr["clone3"], "nosys"))
    head = [_ins(_LD_ABS_W, 4), _ins(_JEQ, arch, 1, 0), _ins(_RET, _ERRNO | EPERM), _ins(_LD_ABS_W, 0)]
    if machine == "x86_64":
        head += [_ins(_JGE, X32_BIT, 0, 1), _ins(_RET, _ERRNO | EPERM)]
    n = len(body)
    # positions (relative to the start of body): ALLOW = n, DENY = n+1, NOSYS = n+2, CLONE = n+3
    target = {"deny": n + 1, "nosys": n + 2, "clone": n + 3}
    out = list(head)
    for i, (_, value, label) in enumerate(body):
        out.append(_ins(_JEQ, value, target[label] - i - 1, 0))
    out += [
        _ins(_RET, _ALLOW),                    # n:   ALLOW
        _ins(_RET, _ERRNO | EPERM),            # n+1: DENY
        _ins(_RET, _ERRNO | ENOSYS),           # n+2: NOSYS
        _ins(_LD_ABS_W, 16),                   # n+3: CLONE: low 32 bits of the flags argument
        _ins(_JSET, CLONE_THREAD, 0, 1),
        _ins(_RET, _ALLOW),
        _ins(_RET, _ERRNO | EPERM),
    ]
    return b"".join(out)
