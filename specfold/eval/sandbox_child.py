"""Child side of the code sandbox: token, limits, a Python guard, the program, then the verdict.

Run only as a script by `sandbox.run_program` (`python -I -S -B sandbox_child.py PROGRAM KEY=VALUE...`).
Standard library only: under `-I` the specfold package is not importable here.

Order of events (the invariants):
1. the pass token is read from its pipe (`token_fd`) and that pipe is closed: from here on the
   token exists only as a local variable of `main`, in the main thread;
2. resource limits (address space, CPU seconds, file size, open files, no core dumps, processes
   when not root) with soft == hard, so the program cannot raise them back;
3. the program is compiled (a syntax error is a failure), the guard installed (see
   `install_guard`), and the program's code runs in a second thread started from C objects only
   (`_thread.start_new_thread(tuple, (itertools.chain(...),))`, see `worker_chain`): that thread
   has no Python frame of this file, so `sys._getframe()` walks from the program end at the
   program; the chain's last step releases a lock (`done`) only if the program's code returned;
4. the main thread (SIGINT ignored, so no Python signal handler runs there) blocks in C until
   the worker's chain is over (a weakref callback in the worker thread wakes it), disables the garbage collector (no finalizer of the program runs
   in the main thread), and only if `done` was released writes `PASS <token>` to `result_fd`.
   Any exception (SystemExit included) or the process dying first means no verdict line, i.e. a
   failure.
The program cannot read the token (not in argv, environ, any file or open fd, nor any object it
can reach: the main thread's frame is reachable only through `sys._current_frames` and `gc`,
which the guard removes without keeping the originals) and cannot release `done` (referenced only
from the C chain). What stays possible is in-process subversion below Python's object model
(raw memory reads or writes) or of the test's semantics (an object whose == is always true):
see docs/EVAL.md. The OS layer (bubblewrap, seccomp) contains the program either way.
"""
import builtins
import io
import os
import resource
import sys

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
    """A replacement that keeps no reference to the function it replaces."""

    def deny(*args, **kwargs):
        raise PermissionError(f"sandbox: {what} is disabled")

    return deny


def _guard_files(root: str) -> None:
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
            if any(kwargs.get(k) is not None for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")):
                raise PermissionError("sandbox: dir_fd file operations are disabled")
            check(*args[:nargs])
            return fn(*args, **kwargs)

        return wrapper

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

    import _io
    import posix

    builtins.open = io.open = _io.open = guarded_open
    os.open = posix.open = guarded_os_open
    io.FileIO = _io.FileIO = GuardedFileIO
    one = ("remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs", "truncate", "chmod",
           "chown", "lchown", "lchmod", "chflags", "lchflags", "mkfifo", "mknod", "utime", "chdir",
           "chroot", "setxattr", "removexattr", "symlink")
    for mod in (os, posix):
        for name in one:
            if hasattr(mod, name):
                setattr(mod, name, path_guarded(getattr(mod, name), 2 if name == "symlink" else 1))
        for name in ("rename", "renames", "replace"):
            if hasattr(mod, name):
                setattr(mod, name, path_guarded(getattr(mod, name), 2))


def _guard_processes_and_network() -> None:
    """subprocess goes through _posixsubprocess.fork_exec and os.posix_spawn, both disabled here;
    socket.socket subclasses _socket.socket, whose construction is refused."""
    import _socket
    import posix

    for mod in (os, posix):
        for name in ("link", "fchmod", "fchown", "ftruncate", "fork", "forkpty", "system", "popen",
                     "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                     "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp",
                     "spawnlpe", "posix_spawn", "posix_spawnp", "kill", "killpg", "setsid",
                     "setpgid", "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid",
                     "pidfd_open", "_exit", "abort"):
            if hasattr(mod, name):
                setattr(mod, name, _denied(f"os.{name}"))
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = _denied("fork_exec")
    except ImportError:
        pass
    resource.setrlimit = _denied("resource.setrlimit")
    if hasattr(resource, "prlimit"):
        resource.prlimit = _denied("resource.prlimit")

    class NoSocket(_socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("sandbox: network (socket) is disabled")

    _socket.socket = _socket.SocketType = NoSocket
    mods = [_socket] + ([sys.modules["socket"]] if "socket" in sys.modules else [])
    for mod in mods:
        for name in ("socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo",
                     "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
            if hasattr(mod, name):
                setattr(mod, name, _denied(f"network ({name})"))


def _guard_introspection() -> None:
    """Remove what reaches other threads' frames or arbitrary objects, and what rebuilds modules.

    Builtin modules are imported first, so that `_imp.create_builtin` (a fresh copy of `posix`,
    `sys` or `gc` with the original functions) can go."""
    import _imp
    import gc

    for name in sys.builtin_module_names:
        if name not in sys.modules:
            try:
                __import__(name)
            except ImportError:
                pass
    for name in ("_current_frames", "_current_exceptions", "settrace", "setprofile"):
        if hasattr(sys, name):
            setattr(sys, name, _denied(f"sys.{name}"))
    for name in ("get_objects", "get_referrers", "get_referents"):
        setattr(gc, name, _denied(f"gc.{name}"))
    threading = sys.modules.get("threading")  # imported later, it calls the sys functions above
    for name in ("settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads"):
        if threading is not None and hasattr(threading, name):
            setattr(threading, name, _denied(f"threading.{name}"))
    for name in ("create_builtin", "exec_builtin", "init_frozen"):  # extension modules stay importable
        if hasattr(_imp, name):
            setattr(_imp, name, _denied(f"_imp.{name}"))


def install_guard(root: str) -> None:
    """Second layer (best effort, under the OS sandbox): files, processes, network, introspection."""
    _guard_files(os.path.realpath(root))
    _guard_processes_and_network()
    _guard_introspection()
    for name in ("ctypes", "_ctypes", "pty", "_testcapi", "_testinternalcapi", "_xxsubinterpreters"):
        sys.modules[name] = None  # import raises ImportError


def parse_config(args: list[str]) -> dict:
    """`key=value` arguments: integers, `guard` (0/1) and `site` (os.pathsep-separated folders)."""
    cfg: dict = {}
    for a in args:
        key, _, value = a.partition("=")
        cfg[key] = [p for p in value.split(os.pathsep) if p] if key == "site" else int(value)
    return cfg


def worker_chain(code, ns, done, queue):
    """The worker thread's whole job as one C iterator, and a weak reference that reports its end.

    The chain (no Python frame of this file runs in it) runs the program, flushes the original
    stdout/stderr and releases `done`; its last part iterates a set that nothing else holds.
    That set dies when the chain is exhausted or, after an exception, when the thread drops the
    chain: either way in the worker thread, whose weakref callback (`queue.put`, C code) then
    wakes the main thread."""
    import _weakref
    import itertools

    anchor = set()
    ended = _weakref.ref(anchor, queue.put)
    flushes = [itertools.starmap(f.flush, [()]) for f in (sys.stdout, sys.stderr) if f is not None]
    chain = itertools.chain(itertools.starmap(exec, [(code, ns)]), *flushes,
                            itertools.starmap(done.release, [()]), iter(anchor))
    return chain, ended


def main() -> None:
    import _queue
    import _signal
    import _thread

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # no Python signal handler runs in main
    prog_path, cfg = sys.argv[1], parse_config(sys.argv[2:])
    token = os.read(cfg["token_fd"], 256).strip()
    os.close(cfg["token_fd"])
    import gc

    result_fd, write, real_exit, gc_disable = cfg["result_fd"], os.write, os._exit, gc.disable
    set_limits(cfg)
    sys.path.extend(cfg.get("site", ()))
    with open(prog_path, encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "program.py", "exec")
    except BaseException:  # noqa: BLE001 - a program that does not compile fails
        import traceback

        traceback.print_exc()
        real_exit(1)
    if cfg.get("guard", 1):
        install_guard(os.getcwd())
    sys.argv = ["program.py"]
    done, queue = _thread.allocate_lock(), _queue.SimpleQueue()
    done.acquire()
    chain, ended = worker_chain(code, {"__name__": "__main__", "__builtins__": builtins}, done, queue)
    del code
    ok = False
    try:
        _thread.stack_size(64 * MIB)
        _thread.start_new_thread(tuple, (chain,))
        del chain
        queue.get()  # blocks in C until the worker is over (see worker_chain)
        gc_disable()  # from here on no finalizer of the program can run in this thread
        ok = done.acquire(False)
    except BaseException:  # noqa: BLE001 - anything going wrong in the main thread is a failure
        ok = False
    if ok:
        try:
            write(result_fd, b"PASS " + token + b"\n")
        except BaseException:  # noqa: BLE001
            real_exit(1)
    real_exit(0 if ok else 1)


if __name__ == "__main__":
    main()
