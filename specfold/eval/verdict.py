"""Verdicts computed outside the sandbox: a test's asserts become values the program reports.

`plan_test(test, scope)` rewrites each top-level assert of `scope` (a function such as HumanEval's
`check`, or the module for MBPP) of one of these forms, where X is computed by the program and E,
T, R, A are Python literals or trusted expressions over literals (`set([1, 2])`, `3 + 5`):
    assert X == E        assert X != E, <, <=, >, >=, in, not in   (E on either side)
    assert X is E        (E one of None, True, False)
    assert math.isclose(X, E, rel_tol=R, abs_tol=A)
    assert abs(X - E) < T          (or <=; abs(E - X) too)
    assert X             assert not X
into `__specfold_report__(k, X)`: the sandbox child sends X's value as plain data
(`sandbox_child.encode`), `decode` rebuilds it here and `judge` evaluates the comparison here,
with the test's own tolerance. When both sides are computed by the program (`tuple(f(x)) ==
tuple(g(x))`) both are reported and compared here. E never appears in the program the sandbox
runs. X must not contain a comparison, `and`/`or`/`not`, a conditional expression, a filtered
comprehension or a call of all/any/bool/isinstance/... outside a lambda (a truth value computed
inside the sandbox from the program's objects is not data: `__eq__` can lie). Everything else
(loops, assignments, asserts of other forms) stays in the program and runs inside, where only the
sandbox's pass token guards it; `Plan.inside_asserts` counts those asserts, and the checks whose
two sides are both computed in the program (the test's side can be shadowed by the program).

Invariants: `decode` builds only None, bool, int, float, complex, str, bytes, list, tuple, dict,
set, frozenset, Fraction and Decimal, never calls code of the program, and caps nesting; a verdict
needs every slot reported exactly once, in order, each decoding to data, and every check true.
"""
from __future__ import annotations

import ast
import json
import math
import operator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

REPORT = "__specfold_report__"
MAX_DEPTH = 200
_OPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_TRUSTED_CALLS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict,
                  "sorted": sorted, "len": len, "abs": abs, "min": min, "max": max, "sum": sum,
                  "round": round, "float": float, "int": int, "str": str, "complex": complex}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_PREDICATES = {"all", "any", "bool", "isinstance", "issubclass", "callable", "hasattr", "isclose", "eq",
               "ne", "lt", "le", "gt", "ge", "contains", "not_", "truth", "is_", "is_not"}


class Unknown(Exception):
    """An expression that is not a trusted value (it depends on the program)."""


class Invalid:
    """A reported value that is not plain data (its reason in `why`)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"<not data: {self.why}>"


# -- trusted values: literals and simple expressions over them, computed here -----------------------

def trusted(node: ast.expr) -> Any:
    """The value of an expression built from literals only (raises Unknown otherwise)."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = trusted(node.operand)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = trusted(node.left), trusted(node.right)
        if isinstance(node.op, ast.Pow) and not (isinstance(b, (int, float)) and abs(b) <= 4096):
            raise Unknown("exponent too large")
        if isinstance(node.op, ast.Mult) and any(isinstance(x, (str, bytes, list, tuple)) and len(x) * abs(
                y if isinstance(y, int) else 1) > 10**6 for x, y in ((a, b), (b, a))):
            raise Unknown("too long")
        try:
            return _BINOPS[type(node.op)](a, b)
        except (ArithmeticError, TypeError, ValueError) as e:
            raise Unknown(str(e)) from None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [trusted(e) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TRUSTED_CALLS
            and not node.keywords and all(not isinstance(a, ast.Starred) for a in node.args)):
        try:
            return _TRUSTED_CALLS[node.func.id](*[trusted(a) for a in node.args])
        except (ArithmeticError, TypeError, ValueError) as e:
            raise Unknown(str(e)) from None
    raise Unknown(type(node).__name__)


def _is_trusted(node: ast.expr) -> bool:
    try:
        trusted(node)
        return True
    except Unknown:
        return False


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def honest(node: ast.expr) -> bool:
    """Whether X's value is data computed by the program rather than a truth value it could fake."""
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Lambda):
            continue  # an input: what it computes is the program's business
        if isinstance(n, (ast.Compare, ast.BoolOp, ast.IfExp)) or (
                isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)):
            return False
        if isinstance(n, ast.comprehension) and n.ifs:
            return False
        if isinstance(n, ast.Call) and _name(n.func) in _PREDICATES:
            return False
        todo.extend(ast.iter_child_nodes(n))
    return True


# -- plan: which asserts are judged here --------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One assert judged here. sides: ("slot", k) for a reported value, ("value", v) for a trusted one."""

    kind: str            # "cmp" | "isclose" | "absdiff" | "truthy" | "falsy"
    sides: tuple
    op: Any = None       # the comparison operator (cmp, absdiff)
    params: tuple = ()   # isclose keyword arguments / the absdiff bound
    text: str = ""


@dataclass(frozen=True)
class Plan:
    source: str          # the test, converted asserts replaced by reports
    checks: tuple[Check, ...]
    n_slots: int
    inside_asserts: int  # asserts left to run inside (other forms)


def _side(node: ast.expr, src: str, slots: list[str]) -> tuple:
    try:
        return ("value", trusted(node))
    except Unknown:
        slots.append(ast.get_source_segment(src, node) or ast.unparse(node))
        return ("slot", len(slots) - 1)


def _convert(st: ast.Assert, src: str, slots: list[str]) -> Check | None:
    """The Check for one assert, appending its program-side expressions to `slots`; None if its
    form is not one judged here."""
    t, text, mark = st.test, ast.get_source_segment(src, st) or "", len(slots)
    check = None
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and type(t.ops[0]) in _OPS:
        left, right, op = t.left, t.comparators[0], type(t.ops[0])
        absdiff = (isinstance(left, ast.Call) and _name(left.func) == "abs" and isinstance(left.func, ast.Name)
                   and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp)
                   and isinstance(left.args[0].op, ast.Sub) and op in (ast.Lt, ast.LtE) and _is_trusted(right))
        if absdiff:
            a, b = left.args[0].left, left.args[0].right
            x, e = (a, b) if _is_trusted(b) else (b, a)
            if _is_trusted(e) and not _is_trusted(x) and honest(x):
                check = Check("absdiff", (_side(x, src, slots), ("value", trusted(e))), _OPS[op],
                              (trusted(right),), text)
        elif not (_is_trusted(left) and _is_trusted(right)) and honest(left) and honest(right):
            if op in (ast.Is, ast.IsNot) and not any(  # identity is data only for the singletons
                    _is_trusted(n) and type(trusted(n)) in (type(None), bool) for n in (left, right)):
                return None
            check = Check("cmp", (_side(left, src, slots), _side(right, src, slots)), _OPS[op], (), text)
    elif (isinstance(t, ast.Call) and _name(t.func) == "isclose" and len(t.args) == 2
          and all(k.arg in ("rel_tol", "abs_tol") and _is_trusted(k.value) for k in t.keywords)):
        x, e = t.args if _is_trusted(t.args[1]) else t.args[::-1]
        if _is_trusted(e) and not _is_trusted(x) and honest(x):
            kw = tuple((k.arg, trusted(k.value)) for k in t.keywords)
            check = Check("isclose", (_side(x, src, slots), ("value", trusted(e))), None, kw, text)
    elif isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and not _is_trusted(t.operand) and honest(t.operand):
        check = Check("falsy", (_side(t.operand, src, slots),), None, (), text)
    elif not isinstance(t, ast.Constant) and not _is_trusted(t) and honest(t):
        check = Check("truthy", (_side(t, src, slots),), None, (), text)
    if check is None:
        del slots[mark:]
    return check


def plan_test(test: str, scope: str | None = None) -> Plan:
    """Convert the top-level asserts of function `scope` (None: of the module) in `test`."""
    tree = ast.parse(test)
    body = tree.body
    if scope is not None:
        fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == scope]
        body = fns[-1].body if fns else []
    lines = test.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    slots: list[str] = []
    checks, edits = [], []
    for st in body:
        if not isinstance(st, ast.Assert):
            continue
        first = len(slots)
        check = _convert(st, test, slots)
        if check is None:
            continue
        checks.append(check)
        args = ", ".join(f"({s})" for s in slots[first:])
        start = offsets[st.lineno - 1] + len(lines[st.lineno - 1].encode()[:st.col_offset].decode())
        end = offsets[st.end_lineno - 1] + len(lines[st.end_lineno - 1].encode()[:st.end_col_offset].decode())
        edits.append((start, end, f"{REPORT}({first}, {args})"))
    out = test
    for start, end, new in reversed(edits):
        out = out[:start] + new + out[end:]
    both_inside = sum(all(kind == "slot" for kind, _ in c.sides) and len(c.sides) > 1 for c in checks)
    return Plan(out, tuple(checks), len(slots), _inside_asserts(out) + both_inside)


def _inside_asserts(source: str) -> int:
    """Asserts still in the program that can fail (not `assert <true constant>`)."""
    n = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert) and not (isinstance(node.test, ast.Constant) and node.test.value):
            n += 1
    return n


# -- reported values ------------------------------------------------------------------------------------

def _build(obj: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_build(x, depth + 1) for x in obj]
    if isinstance(obj, dict) and len(obj) == 1:
        (tag, val), = obj.items()
        if tag == "I" and isinstance(val, str):
            return int(val, 16)
        if tag == "C" and isinstance(val, list) and len(val) == 2:
            return complex(float(val[0]), float(val[1]))
        if tag == "B" and isinstance(val, str):
            return bytes.fromhex(val)
        if tag == "Q" and isinstance(val, list) and len(val) == 2:
            return Fraction(_build(val[0], depth + 1), _build(val[1], depth + 1))
        if tag == "DEC" and isinstance(val, str):
            return Decimal(val)
        if tag in ("T", "S", "FS") and isinstance(val, list):
            items = [_build(x, depth + 1) for x in val]
            return {"T": tuple, "S": set, "FS": frozenset}[tag](items)
        if tag == "D" and isinstance(val, list):
            return {_build(k, depth + 1): _build(v, depth + 1) for k, v in val}
    raise ValueError(f"not a data encoding: {str(obj)[:60]}")


def decode(text: str) -> Any:
    """A value as the child encoded it (`sandbox_child.encode`), or Invalid."""
    if text.startswith("!"):
        return Invalid(text[1:200])
    try:
        return _build(json.loads(text), 0)
    except (ValueError, TypeError, RecursionError, ArithmeticError) as e:
        return Invalid(f"undecodable report ({str(e)[:80]})")


def _holds(check: Check, values: list) -> bool:
    vals = [values[v] if kind == "slot" else v for kind, v in check.sides]
    if any(isinstance(v, Invalid) for v in vals):
        return False
    try:
        if check.kind == "cmp":
            return bool(check.op(vals[0], vals[1]))
        if check.kind == "isclose":
            return math.isclose(vals[0], vals[1], **dict(check.params))
        if check.kind == "absdiff":
            return bool(check.op(abs(vals[0] - vals[1]), check.params[0]))
        return bool(vals[0]) if check.kind == "truthy" else not vals[0]
    except (TypeError, ValueError, ArithmeticError):
        return False


def judge(plan: Plan, reports: list[tuple[int, str]] | None) -> tuple[bool, str]:
    """(all checks hold, why not). `reports`: (slot, encoded value) in the order received."""
    if reports is None:
        return False, "the program wrote something other than reports on the result channel"
    if [s for s, _ in reports] != list(range(plan.n_slots)):
        return False, f"{len(reports)} values reported, {plan.n_slots} expected"
    values = [decode(t) for _, t in reports]
    for check in plan.checks:
        if not _holds(check, values):
            got = [values[v] for kind, v in check.sides if kind == "slot"]
            return False, f"failed: {check.text[:160]} (got {', '.join(repr(g)[:80] for g in got)})"
    return True, ""
