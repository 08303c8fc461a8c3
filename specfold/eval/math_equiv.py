"""MATH answer checking: the last `\\boxed{}` of a completion, normalised, compared symbolically.

In the manner of lm-eval's minerva-math (own code): strip units, `\\text{}`, `$`, degrees,
spacing commands and thousands separators, canonicalise `\\dfrac`/`\\tfrac`/`\\frac12`/`\\sqrt2`
and trailing `.0`, then call two answers equal when the normalised strings match or when both
translate to sympy expressions whose difference simplifies to 0 (tuples and intervals are compared
element by element, with the same brackets; matrices cell by cell).
Numbers: integers, fractions and decimals are parsed as exact rationals and compared exactly
(`0.5` = `\\frac12`, `1.50` = `1.5`, `11111105000` != `11111111100`); infinities keep their sign.
A decimal written with k >= 6 places also equals a value with no finite decimal expansion
(`\\frac13`, `\\sqrt2`) that rounds to it at k places (as math-verify's 6-place rounding does:
`0.333333` = `\\frac13`, while `3.14` != `\\pi`). Two equations (one `=` each) are compared as
equations: lhs - rhs of one must be a nonzero constant times lhs - rhs of the other
(`2x+3=y` = `y=2x+3`, `-y=2x+3` != `y=2x+3`); an equation against a bare value compares its
right-hand side.

Invariants: never raises on any input string; sympy work is bounded by an input-size cap and a
wall-clock limit that holds in any thread: `is_equiv` settles equal (or empty) normalised strings itself
and hands everything else to one long-lived worker process (`_Worker`), which is killed (and
restarted on the next call) when it takes longer than SYMPY_SECONDS; a call that ran out of time
is not equal. Inside the worker (its main thread) each sympy step also has its own alarm.
"""
from __future__ import annotations

import atexit
import json
import re
import select
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    rationalize,
    standard_transformations,
)

MAX_LEN = 200  # longer normalised answers are only compared as strings
SYMPY_SECONDS = 3

_UNITS = (
    "degrees", "degree", "units", "unit", "sq", "square", "inches", "inch", "feet", "foot", "ft",
    "meters", "meter", "cm", "mm", "km", "m", "miles", "mile", "mph", "hours", "hour", "minutes",
    "minute", "seconds", "second", "days", "day", "dollars", "dollar", "cents", "cent", "pounds",
    "grams", "gm", "kg", "ways", "points", "students", "people", "integers", "digits", "edges",
    "meals", "coins", "years", "year", "times", "percent", "th", "nd", "rd", "st",
)
_UNIT_RE = re.compile(r"(?<=[\d}\s)])\s*(?:" + "|".join(_UNITS) + r")(?:\^?\{?[23]\}?)?\s*$")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces), or `\\boxed 5`."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = idx + (6 if text.startswith("\\boxed", idx) else 5)
    while i < len(text) and text[i] == " " and (i + 1 < len(text) and text[i + 1] == "{"):
        i += 1
    if i < len(text) and text[i] == "{":
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
        return None  # unbalanced
    m = re.match(r"\s+([^\s$]+)", text[i:])
    return m.group(1) if m else None


def _braced(s: str, i: int) -> tuple[str, int] | None:
    """The `{...}` group starting at s[i] and the index after it (None if s[i] is not '{')."""
    if i >= len(s) or s[i] != "{":
        return None
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    return None


def _unwrap(s: str, command: str) -> str:
    """Replace `\\command{X}` by X (nested braces respected)."""
    out, i, key = [], 0, "\\" + command + "{"
    while True:
        k = s.find(key, i)
        if k < 0:
            return "".join(out) + s[i:]
        g = _braced(s, k + len(key) - 1)
        if g is None:
            return "".join(out) + s[i:]
        out.append(s[i:k] + g[0])
        i = g[1]


def normalize(ans: str) -> str:
    """Canonical string form of a final answer (see module docstring)."""
    s = ans.strip()
    s = s.split("=")[-1] if "=" in s and "\\ne" not in s and "<" not in s and ">" not in s else s
    for cmd in ("text", "textbf", "mathrm", "mbox", "mathbf", "boxed", "textnormal", "operatorname"):
        s = _unwrap(s, cmd)
    for a, b in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                 ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""), ("~", ""),
                 ("\\$", ""), ("$", ""), ("\\%", ""), ("%", ""), ("^{\\circ}", ""), ("^\\circ", ""),
                 ("\\circ", ""), ("{,}", ""), ("\\cdot", "*"), ("\\times", "*"), ("\\displaystyle", ""),
                 ("\\le ", "\\le"), ("\\ldots", ""), ("\\dots", "")):
        s = s.replace(a, b)
    s = s.strip()
    for _ in range(2):  # "5 cm^2", "10 square units"
        s = _UNIT_RE.sub("", s).strip()
    s = s.replace(" ", "").rstrip(".")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d.])(\d+)\.0+(?!\d)", r"\1", s)  # 5.0 -> 5
    if re.fullmatch(r"-?\.\d+", s):
        s = s.replace(".", "0.", 1)
    return s


_FUNCS = {"\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\ln": "log", "\\log": "log",
          "\\exp": "exp", "\\pi": "pi", "\\infty": "oo", "\\sec": "sec", "\\csc": "csc",
          "\\cot": "cot", "\\arcsin": "asin", "\\arccos": "acos", "\\arctan": "atan"}


def _latex_to_py(s: str) -> str | None:
    """Translate a normalised LaTeX answer to a sympy-parsable string (None if unsupported)."""
    s = s.replace("\\frac", "\\FRAC")
    for _ in range(20):  # innermost-first rewriting of \frac{a}{b} and \sqrt[n]{a}
        m = re.search(r"\\FRAC\{([^{}]*)\}\{([^{}]*)\}", s)
        if m:
            s = s[: m.start()] + f"(({m.group(1)})/({m.group(2)}))" + s[m.end():]
            continue
        m = re.search(r"\\sqrt\[([^\[\]{}]*)\]\{([^{}]*)\}", s)
        if m:
            s = s[: m.start()] + f"(({m.group(2)})**(1/({m.group(1)})))" + s[m.end():]
            continue
        m = re.search(r"\\sqrt\{([^{}]*)\}", s)
        if m:
            s = s[: m.start()] + f"sqrt({m.group(1)})" + s[m.end():]
            continue
        break
    for k, v in sorted(_FUNCS.items(), key=lambda kv: -len(kv[0])):
        s = s.replace(k, f" {v} ")
    s = s.replace("\\div", "/").replace("{", "(").replace("}", ")").replace("^", "**")
    if "\\" in s or "__" in s or not re.fullmatch(r"[\w\s+\-*/().]*", s):
        return None
    return s


@contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """SIGALRM-based limit in the main thread (no limit elsewhere; inputs are size-capped)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):  # noqa: ANN001
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor, rationalize)
MIN_ROUNDED_PLACES = 6  # a decimal this precise may stand for a number it rounds from


def to_sympy(s: str) -> sympy.Expr | None:
    """sympy expression for a normalised answer, or None when it cannot be parsed safely."""
    if len(s) > MAX_LEN:
        return None
    py = _latex_to_py(s)
    if py is None or not py.strip():
        return None
    names = {n: sympy.Symbol(n) for n in set(re.findall(r"[A-Za-z_]\w*", py))
             if n not in ("sqrt", "pi", "oo", "sin", "cos", "tan", "log", "exp", "sec", "csc",
                          "cot", "asin", "acos", "atan")}
    names.update({"E": sympy.E} if "E" not in names else {})
    try:
        with _time_limit(SYMPY_SECONDS):
            return parse_expr(py, local_dict=names, transformations=_TRANSFORMS, evaluate=True)
    except BaseException:  # noqa: BLE001 - sympy raises all sorts (incl. TimeoutError)
        return None


_DECIMAL = re.compile(r"-?\d*\.(\d+)")


def _terminates(v: sympy.Expr) -> bool:
    """Whether v is a rational with a finite decimal expansion (denominator 2^a 5^b)."""
    if not v.is_Rational:
        return False
    q = int(v.q)
    for p in (2, 5):
        while q % p == 0:
            q //= p
    return q == 1


def _rounds_to(decimal: str, places: int, v: sympy.Expr) -> bool:
    """A decimal written with `places` >= MIN_ROUNDED_PLACES digits stands for a finite real v
    with no finite decimal expansion when v rounds to it at that precision."""
    if places < MIN_ROUNDED_PLACES or not v.is_number or _terminates(v) or v.has(sympy.oo, -sympy.oo, sympy.zoo):
        return False
    d = sympy.Rational(decimal)
    gap = (sympy.Abs(v - d) - sympy.Rational(1, 2 * 10**places)).evalf(places + 30)
    return bool(gap.is_real and gap <= 0)


def _sympy_equal(a: str, b: str) -> bool:
    x, y = to_sympy(a), to_sympy(b)
    if x is None or y is None:
        return False
    try:
        with _time_limit(SYMPY_SECONDS):
            if x == y:
                return True
            if any(e.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) for e in (x, y)):
                return False  # no arithmetic on infinities: oo - oo is not 0, and -oo is not oo
            if sympy.simplify(x - y) == 0:
                return True
            for text, other in ((a, y), (b, x)):
                m = _DECIMAL.fullmatch(text)
                if m and _rounds_to(text, len(m.group(1)), other):
                    return True
    except BaseException:  # noqa: BLE001
        return False
    return False


_INEQ = re.compile(r"[<>]|\\(?:le|ge|leq|geq|ne|neq|approx|lt|gt)(?![A-Za-z])")


def _equation_sides(s: str) -> tuple[str, str] | None:
    """(lhs, rhs), normalised, of an answer with exactly one `=` and no inequality sign."""
    if s.count("=") != 1 or _INEQ.search(s):
        return None
    lhs, rhs = s.split("=")
    lhs, rhs = normalize(lhs), normalize(rhs)
    return (lhs, rhs) if lhs and rhs else None


def _equations_equal(e1: tuple[str, str], e2: tuple[str, str]) -> bool:
    """Same equation: (l1 - r1) = c (l2 - r2) for a nonzero constant c (or the same sides)."""
    if e1 == e2 or e1 == e2[::-1]:
        return True
    l1, r1, l2, r2 = (to_sympy(t) for t in (*e1, *e2))
    if None in (l1, r1, l2, r2):
        return False
    try:
        with _time_limit(SYMPY_SECONDS):
            d1, d2 = sympy.simplify(l1 - r1), sympy.simplify(l2 - r2)
            if d1 == 0 or d2 == 0:
                return d1 == d2
            ratio = sympy.simplify(d1 / d2)
            return bool(ratio.is_number and ratio.is_finite and ratio != 0)
    except BaseException:  # noqa: BLE001
        return False


_MATRIX = re.compile(r"\\begin\{([pbvBV]?matrix)\}(.*)\\end\{\1\}", re.S)


def _matrix_cells(s: str) -> list[list[str]] | None:
    """Rows of cells of a `\\begin{pmatrix}...\\end{pmatrix}` answer (any spacing), or None."""
    m = _MATRIX.fullmatch(s.strip().strip("$").strip())
    if not m:
        return None
    rows = [r for r in re.split(r"\\\\", m.group(2))]
    if rows and not rows[-1].strip():
        rows = rows[:-1]
    return [[c.strip() for c in r.split("&")] for r in rows]


def _split_top(s: str) -> list[str]:
    """Split on commas at bracket depth 0."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _strip_brackets(s: str) -> tuple[str, str, str]:
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _braced("{" + s[1:-1] + "}", 0):
        return s[0], s[1:-1], s[-1]
    return "", s, ""


def _equiv_here(pred: str, ref: str) -> bool:
    """is_equiv computed in this process (the worker's side; see module docstring)."""
    ma, mb = _matrix_cells(pred), _matrix_cells(ref)
    if ma is not None and mb is not None:
        return [len(r) for r in ma] == [len(r) for r in mb] and all(
            _equiv_here(x, y) for ra, rb in zip(ma, mb) for x, y in zip(ra, rb))
    ea, eb = _equation_sides(pred), _equation_sides(ref)
    if ea is not None and eb is not None:
        return _equations_equal(ea, eb)
    a, b = normalize(pred), normalize(ref)
    if a == b:
        return True
    if not a or not b:
        return False
    (la, ia, ra), (lb, ib, rb) = _strip_brackets(a), _strip_brackets(b)
    pa, pb = _split_top(ia), _split_top(ib)
    if len(pa) > 1 or len(pb) > 1:
        if (la, ra) != (lb, rb) or len(pa) != len(pb):
            return False
        return all(x == y or _sympy_equal(x, y) for x, y in zip(pa, pb))
    return _sympy_equal(a, b)


class _Worker:
    """A process that answers `[pred, ref]` JSON lines with `_equiv_here`'s verdict. One call at a
    time; a call that outlives `seconds` kills it (the next call starts a new one; start-up,
    which imports sympy, is not counted)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        code = f"import sys; sys.path.insert(0, {root!r}); from specfold.eval.math_equiv import _serve; _serve()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("math_equiv worker did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                f.close()
            self.proc = None

    def call(self, pred: str, ref: str, seconds: float) -> bool:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.stop()
                self._start()
            self.proc.stdin.write(json.dumps([pred, ref]) + "\n")
            self.proc.stdin.flush()
            if not select.select([self.proc.stdout], [], [], seconds)[0]:
                self.stop()  # out of time (a huge power, a slow simplify): not equal
                return False
            line = self.proc.stdout.readline()
            if not line:
                self.stop()
                return False
            return json.loads(line) is True


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def _serve() -> None:
    """The worker's loop (see _Worker)."""
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            pred, ref = json.loads(line)
            ok = bool(_equiv_here(str(pred), str(ref)))
        except Exception:  # noqa: BLE001 - the verdict for anything unexpected is "not equal"
            ok = False
        print(json.dumps(ok), flush=True)


def is_equiv(pred: str | None, ref: str) -> bool:
    """Whether a predicted final answer equals the reference (see module docstring)."""
    if pred is None:
        return False
    if _matrix_cells(pred) is None and (_equation_sides(pred) is None or _equation_sides(ref) is None):
        a, b = normalize(pred), normalize(ref)  # what _equiv_here decides without sympy
        if a == b or not a or not b:
            return a == b
    try:
        return _WORKER.call(pred, ref, SYMPY_SECONDS)
    except (OSError, RuntimeError, ValueError):
        return False
