"""Child side of the code sandbox: privileges, token, limits, a Python guard, the program, the verdict.

Run only as a script by `sandbox.run_program` (`python -I -S -B child.py PROGRAM KEY=VALUE...`;
the parent passes its in-memory copy of this file). Standard library only: under `-I` the
specfold package is not importable here, and the file must stay one self-contained script.

Order of events (the invariants):
0. as root (bubblewrap run by root): drop to `drop_uid` for good (`drop_privileges`); in the weak
   mode: confine this process (`confine`: no new privileges, Landlock, seccomp, through ctypes,
   which is then unloaded); both before anything of the program is read;
1. the pass token is read from its pipe (`token_fd`) and that pipe is closed: from here on the
   token exists only as a local variable of `main`, in the main thread;
2. resource limits (address space, CPU seconds, file size, open files, no core dumps, threads)
   with soft == hard, so the program cannot raise them back;
3. the program is compiled (a syntax error is a failure), the guard installed (see
   `install_guard`), and the program's code runs in a second thread started from C objects only
   (`_thread.start_new_thread(tuple, (itertools.chain(...),))`, see `worker_chain`): that thread
   has no Python frame of this file but the reporter's (`make_reporter`, whose frame holds only
   the result fd), so `sys._getframe()` walks from the program end at the program; the chain's
   last step releases a lock (`done`) only if the program's code returned. The program's
   `__specfold_report__(k, value)` calls (the harness put them where the test's asserts were)
   send `R <k> <json>` lines (`encode`: plain data only) on `result_fd`;
4. the main thread (SIGINT ignored, so no Python signal handler runs there) blocks in C until
   the worker's chain is over (a weakref callback in the worker thread wakes it), disables the
   garbage collector (no finalizer of the program runs in the main thread), and only if `done`
   was released writes `PASS <token>` to `result_fd`. Any exception (SystemExit included) or the
   process dying first means no pass line, i.e. a failure.
The program cannot read the token (not in argv, environ, any file or open fd, nor any object it
can reach: the main thread's frame is reachable only through `sys._current_frames` and `gc`,
which the guard removes without keeping the originals) and cannot release `done` (referenced only
from the C chain). Reported values are judged by the harness against expected values this
process never sees, so an object whose == is always true, or a forged report, wins nothing.
What stays possible is in-process subversion of the asserts that still run here (docs/EVAL.md
lists them). The OS layer (bubblewrap, seccomp) contains the program either way.
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
        """Refuses to open a socket; wrapping an existing descriptor (socketpair) stays possible.
        No instance dict and no weakref slot, so `socket.socket` can add its own `__slots__`."""

        __slots__ = ()

        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None:
                raise PermissionError("sandbox: network (socket) is disabled")
            super().__init__(family, type, proto, fileno)

    _socket.socket = _socket.SocketType = NoSocket
    mods = [_socket] + ([sys.modules["socket"]] if "socket" in sys.modules else [])
    for mod in mods:  # socketpair stays: a connected pair reaches nothing (asyncio's self-pipe)
        for name in ("fromfd", "create_connection", "create_server", "getaddrinfo",
                     "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
            if hasattr(mod, name):
                setattr(mod, name, _denied(f"network ({name})"))


def _guard_introspection() -> None:
    """Remove what reaches other threads' frames or arbitrary objects, and what rebuilds modules.

    Builtin modules are imported first, so that `_imp.create_builtin` (a fresh copy of `posix`,
    `sys` or `gc` with the original functions) can go."""
    import _imp
    import gc

    import warnings

    with warnings.catch_warnings():  # e.g. spwd's DeprecationWarning where it is built in
        warnings.simplefilter("ignore")
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
    """`key=value` arguments: integers, or os.pathsep-separated paths for keys ending in `_paths`."""
    cfg: dict = {}
    for a in args:
        key, _, value = a.partition("=")
        cfg[key] = [p for p in value.split(os.pathsep) if p] if key.endswith("_paths") else int(value)
    return cfg


def drop_privileges(cfg: dict) -> None:
    """As root (bubblewrap run by root, in its own namespaces): become `drop_uid` for good before
    anything of the program is read. Exits when the switch did not take."""
    uid = cfg.get("drop_uid", -1)
    if uid < 0:
        return
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        print(f"sandbox: cannot drop root to uid {uid}: {e}", file=sys.stderr)
        os._exit(1)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        print(f"sandbox: still privileged after dropping to uid {uid}", file=sys.stderr)
        os._exit(1)


_LL_READ_DIR = 1 | 4 | 8            # landlock: EXECUTE | READ_FILE | READ_DIR
_LL_READ_FILE = 1 | 4               # EXECUTE | READ_FILE (rules on files take file rights only)
_LL_FILE_RIGHTS = 1 | 2 | 4 | (1 << 14) | (1 << 15)  # EXECUTE WRITE READ TRUNCATE IOCTL_DEV


def _landlock(libc, ctypes, read: list, write: list) -> int:
    """Confine this process (and anything it could start) with Landlock: read `read`, write
    `write`, nothing else of the filesystem; no TCP bind/connect (ABI >= 4); no signals or abstract
    unix sockets beyond itself (ABI >= 6). Returns the ABI used, 0 when Landlock is unavailable."""
    import struct

    sysc = libc.syscall
    sysc.restype = ctypes.c_long
    abi = sysc(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # landlock_create_ruleset(VERSION)
    if abi < 1:
        return 0
    fs = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    attr = struct.pack("=QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[:8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    rfd = sysc(444, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if rfd < 0:
        return 0
    rules = [(p, _LL_READ_DIR if os.path.isdir(p) else _LL_READ_FILE) for p in read]
    rules += [(p, fs if os.path.isdir(p) else fs & _LL_FILE_RIGHTS) for p in write]
    rules += [("/dev/null", 2 | 4 | ((1 << 15) if abi >= 5 else 0)), ("/dev/urandom", 4)]
    for path, rights in rules:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        rule = ctypes.create_string_buffer(struct.pack("=Qi", rights & fs, pfd), 12)
        r = sysc(445, ctypes.c_int(rfd), ctypes.c_int(1), rule, ctypes.c_uint32(0))
        os.close(pfd)
        if r != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    if sysc(446, ctypes.c_int(rfd), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(rfd)
    return abi


def _seccomp(libc, ctypes, fd: int) -> bool:
    """Load the parent's seccomp filter (the same one bubblewrap loads) from `fd`."""
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = Prog(len(data) // 8, data)
    return libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def confine(cfg: dict, strict: bool) -> dict:
    """The weak mode's OS layers, set up by the child itself before it reads the program (no
    bubblewrap): no new privileges, Landlock, seccomp. ctypes is used here and then unloaded.
    strict: exit when a layer the parent expects cannot be set up."""
    done = {"landlock": 0, "seccomp": 0}
    try:
        import ctypes
    except ImportError:
        if strict:
            print("sandbox: ctypes is missing, cannot confine the weak mode", file=sys.stderr)
            os._exit(1)
        return done
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if cfg.get("landlock", 1):
            done["landlock"] = _landlock(libc, ctypes, cfg.get("read_paths", []), cfg.get("write_paths", []))
            if strict and cfg.get("landlock") and not done["landlock"]:
                raise OSError("Landlock is not available")
        if cfg.get("seccomp_fd", -1) >= 0:
            done["seccomp"] = int(_seccomp(libc, ctypes, cfg["seccomp_fd"]))
            if strict and not done["seccomp"]:
                raise OSError("seccomp filter refused")
    except OSError as e:
        if strict:
            print(f"sandbox: cannot confine the weak mode: {e}", file=sys.stderr)
            os._exit(1)
    for name in [n for n in sys.modules if n == "ctypes" or n.startswith("ctypes.") or n == "_ctypes"]:
        sys.modules[name] = None
    return done


SMALL_INT = 1 << 62
MAX_DEPTH = 200


def encode(v, depth=0):
    """A JSON-able form of plain data (None, bool, int, float, complex, str, bytes, list, tuple,
    dict, set, frozenset, Fraction, Decimal; subclasses as their base type). Anything else raises
    TypeError: an object of the program's own class is not data (its `__eq__` could lie).
    Tags: {"I": hex} big int, {"C": [re, im]}, {"B": hex}, {"T": [...]}, {"S": [...]},
    {"FS": [...]}, {"D": [[k, v], ...]}, {"Q": [num, den]}, {"DEC": str}."""
    if depth > MAX_DEPTH:
        raise TypeError("nested too deeply")
    if v is None or v is True or v is False:
        return v
    if isinstance(v, int):
        v = int.__index__(v)
        return v if -SMALL_INT < v < SMALL_INT else {"I": hex(v)}
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, complex):
        return {"C": [v.real, v.imag]}
    if isinstance(v, (bytes, bytearray)):
        return {"B": bytes(v).hex()}
    d = depth + 1
    if isinstance(v, list):
        return [encode(x, d) for x in list.__iter__(v)]
    if isinstance(v, tuple):
        return {"T": [encode(x, d) for x in tuple.__iter__(v)]}
    if isinstance(v, dict):
        return {"D": [[encode(k, d), encode(x, d)] for k, x in dict.items(v)]}
    if isinstance(v, (set, frozenset)):
        return {"FS" if isinstance(v, frozenset) else "S": [encode(x, d) for x in v]}
    name = type(v).__module__ + "." + type(v).__qualname__
    if name == "fractions.Fraction":
        return {"Q": [encode(v.numerator, d), encode(v.denominator, d)]}
    if name == "decimal.Decimal":
        return {"DEC": str(v)}
    raise TypeError(f"a {type(v).__qualname__} is not plain data")


def make_reporter(fd: int):
    """`__specfold_report__(first_slot, *values)`: each value as one line `R <slot> <json>` on the
    result channel (`R <slot> !<why>` when it is not data). Its frame holds only the channel's fd."""
    import json

    dumps, write = json.dumps, os.write

    def report(first, *values):
        for i, v in enumerate(values):
            try:
                text = dumps(encode(v), allow_nan=True, separators=(",", ":"))
            except (TypeError, ValueError, RecursionError) as e:
                text = "!" + str(e).replace("\n", " ")[:200]
            data = f"R {first + i} {text}\n".encode()
            while data:
                data = data[write(fd, data):]

    return report


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
    if sys.argv[1] == "--probe":  # the parent asks which weak-mode layers work here
        done = confine(parse_config(sys.argv[2:]), strict=False)
        print(" ".join(f"{k}={v}" for k, v in done.items()), flush=True)
        os._exit(0)
    prog_path, cfg = sys.argv[1], parse_config(sys.argv[2:])
    drop_privileges(cfg)
    if cfg.get("confine"):
        confine(cfg, strict=True)
    token = os.read(cfg["token_fd"], 256).strip()
    os.close(cfg["token_fd"])
    import gc

    result_fd, write, real_exit, gc_disable = cfg["result_fd"], os.write, os._exit, gc.disable
    set_limits(cfg)
    reporter = make_reporter(result_fd)
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
    ns = {"__name__": "__main__", "__builtins__": builtins, "__specfold_report__": reporter}
    chain, ended = worker_chain(code, ns, done, queue)
    del code, ns, reporter
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
