"""The cost model of this machine: predicted seconds of one engine step's packed model call.

A step is described by its `Shape` (host integers, known before the step runs):
- `rows`: token rows whose layers are computed: every row of a dense forward; for a folded
  verification the root's rows plus (1 - ρ) of its draft rows, ρ the running fold ratio;
- `attn`: the attention work, Σ over forwards of rows × (prefix length + window);
- `head`: rows the LM head runs on (and the read of their logits);
- `fold`: draft rows of folded verifications (their gates and corrections), and whether any ran.

    t = f(rows) + c_attn·attn + c_head·head + [fold > 0]·(fold0 + fold_row·fold)

plus, for the whole step (`predict(s, host=True)`), the host work around the model call that the
user pays too: planning, drafting, reading the scores back into Python, the rules and the store,
`host0 + host_job·jobs + host_draft·drafts + host_made·made`: the step's jobs, its verified drafts,
and the requests whose drafts were made and weighed (making and weighing them costs the same whether
none, one or seven are then verified: lumped into `host_draft`, it was charged again for every
verified draft, and the chooser verified one draft where two paid). At the tiny
model's width the host side is a tenth of a step, and each verified draft adds its own share.

`f` is piecewise linear over a grid of row counts (linear past the last point), so a small batch's
sub-linear cost (the weights are read once for all rows) is seen: that is what makes drafts nearly free
on a GPU and dear on this CPU. The head term matters at a real vocabulary, where the head can
outweigh a small model's layers.

Calibration (`calibrate`): a few packed forwards of random tokens at growing row counts (up to three
passes, each point's fastest time kept: noise only ever adds time), two prefix lengths (their
passes interleaved, each one's fastest kept), the head
alone and, for a folded verifier, two folded verifications: seconds at most, then
cached as JSON in the user's cache directory (`$XDG_CACHE_HOME/specfold` or ~/.cache/specfold), keyed
by the model fingerprint and shape (a widened checkpoint shares its source's fingerprint, not its
cost), device, dtype, thread count and verifier. Online refinement (`observe`): a measured step
time (host `time.perf_counter` around the runner's call, no extra sync; the chooser passes every
step until 256 observations, then one in 4, engine/budget.py) moves the parameters the step
used by a normalised least-mean-squares step in relative terms, with residuals clipped and weighted
as a low expectile (a slower step weighs 0.3, a faster one 0.7), so the model tracks what a step
costs this process, not the bursts of others sharing the machine; a step past the calibrated row
range becomes a new grid point. A point of f the steps have rarely reached moves faster, as a running
mean whose first term is the calibration (`FIRST`): at 0.5B width one calibration, taken while the
other core ran a sweep, put two windows' rows at 290 ms against 210-225 ms measured; at batch 1
that point is reached only by a step with a draft (or a rare 32-row step), each moved it by about a
fifth of its error at the fixed step size, and the chooser refused the drafts it overpriced in the
meantime. The host terms are learnt the same way (`observe_host`) from each step's host time
(the step's time less its model call), from zero, each term's scale at least a tenth of the step's
host time (from the floors alone, a verified draft's host work, 0.13 ms a draft
on `tiny` at batch 1, stayed at zero for ever, and the chooser saw drafts as free of host work).

The refinements stay in the process: the cache file holds the calibration. One process's regime
(a batch size, a neighbour's memory traffic) then cannot bias every later process. Written back (as
up to version 6), they drifted: a model refined over 5,120 steps of earlier runs had this CPU's
f(rows) 14-32 % above the engine's measured steps at 16-64 rows and its attention coefficient at 3e-20
(relative updates never bring a term back from there), and chose fewer drafts than the best fixed
budget where a fresh calibration chose as many.

The clock (`clock_for`): on a CPU with one torch thread, the engine thread's CPU time
(`time.thread_time`): there it is the compute the step needs, and a neighbour's load that takes the
core away does not enter the model (on a shared 2-core machine the wall clock of the same step varies
by 3x, and uniformly slower steps would not change the choice anyway); elsewhere (a GPU, several
threads) the wall clock.
Same code on every device; only the measurements differ.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

VERSION = 8  # 7: the cache holds the calibration only (refinements stay in the process); 8: the
# attention term from the fastest of several interleaved pairs (`attention_coefficient`)
ETA = 0.15  # online step size (relative)
FIRST = 0.5  # a point of f moves by at least FIRST / (1 + its observations so far) of a step's error:
# the calibration counts as one observation, so a point the steps rarely reach (a draft's row count,
# where the chooser seldom verifies one) leaves a calibration taken under load within a few steps
CLIP = 0.5  # a step's residual is clipped to ±CLIP × its prediction (one slow step is noise)
EXPECTILE = 0.3  # slower-than-predicted steps weigh 0.3, faster ones 0.7: on a shared machine noise
# only ever adds time, so the model tracks the machine's own cost (a low expectile), not its neighbours'
CALIBRATION_PASSES = 3  # passes over the row grid, each point's fastest kept (while the budget lasts)
GROW = 1.5  # a step this far past the last calibrated row count becomes a new grid point
MIN_SECONDS = 1e-7
FLOORS = {"f": 1e-6, "c_attn": 1e-13, "c_head": 1e-9, "fold0": 1e-6, "fold_row": 1e-9,
          "host0": 1e-6, "host_job": 1e-6, "host_draft": 1e-7, "host_made": 1e-7}  # parameter scales
F_FLOOR = FLOORS["f"]
HOST_SHARE = 0.1  # a host term's scale in `observe_host`: at least this share of the step's host time


def clock_for(device) -> "callable":
    """The clock step costs are measured on: thread CPU time on a CPU with one torch thread, else the
    wall clock (see the module docstring)."""
    if getattr(device, "type", str(device)) == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


@dataclass(slots=True)
class Shape:
    rows: float = 0.0
    attn: float = 0.0
    head: float = 0.0
    fold: float = 0.0
    fold_calls: int = 0
    jobs: float = 0.0  # jobs of the step (host work)
    drafts: float = 0.0  # drafts verified (host work)
    made: float = 0.0  # requests whose drafts were made and weighed this step (host work)

    def plus(self, other: "Shape") -> "Shape":
        return Shape(self.rows + other.rows, self.attn + other.attn, self.head + other.head,
                     self.fold + other.fold, max(self.fold_calls, other.fold_calls),
                     self.jobs + other.jobs, self.drafts + other.drafts, self.made + other.made)


def model_seconds(c, rows: float, attn: float, head: float, fold: float, fold_calls: int) -> float:
    """The model call's predicted seconds from the terms of `c` (a CostModel, or anything with its
    f_of and coefficients: the budget chooser's memoised view): the one formula of the cost model."""
    t = c.f_of(rows) + c.c_attn * attn + c.c_head * head
    if fold_calls:
        t += c.fold0 + c.fold_row * fold
    return t


def host_seconds(c, jobs: float, drafts: float, made: float = 0.0) -> float:
    """The step's host work around the model call, predicted from the terms of `c`."""
    return c.host0 + c.host_job * jobs + c.host_draft * drafts + c.host_made * made


@dataclass
class CostModel:
    grid: list[int]  # row counts, ascending
    f: list[float]  # seconds of a forward of grid[i] rows (no attention work, no head)
    c_attn: float = 0.0
    c_head: float = 0.0
    fold0: float = 0.0
    fold_row: float = 0.0
    host0: float = 0.0
    host_job: float = 0.0
    host_draft: float = 0.0
    host_made: float = 0.0
    fold_roots: bool = False  # root-only verifications cost less inside the folded call (measured)
    observations: int = 0
    host_observations: int = 0
    seen: list[float] = field(default_factory=list)  # per point of f: its observations' weights (this process)
    key: dict = field(default_factory=dict)
    path: str | None = None
    calibration_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.seen = list(self.seen) + [0.0] * (len(self.f) - len(self.seen))  # one weight per point of f

    # ------------------------------------------------------------------ prediction
    def _interp(self, rows: float) -> tuple[int, float]:
        """(segment i, weight of grid[i+1]) for `rows`: linear inside, extrapolated past the ends."""
        g = self.grid
        i = min(len(g) - 2, bisect_left(g, rows, 1) - 1)  # the first segment that ends at or past rows
        return i, (rows - g[i]) / (g[i + 1] - g[i])

    def f_of(self, rows: float) -> float:
        if rows <= 0:
            return 0.0
        i, w = self._interp(rows)
        return max(MIN_SECONDS, (1 - w) * self.f[i] + w * self.f[i + 1])

    def least_step(self, lo: float, hi: float, d: float) -> float:
        """A lower bound on f(x + d) - f(x) for every x with lo <= x and x + d <= hi: d times the
        least slope of the segments that [lo, hi] meets (extrapolated past the grid's ends), less
        MIN_SECONDS (f is clamped at it), and never below 0 (f never falls)."""
        g, f = self.grid, self.f
        i, _ = self._interp(lo)
        slope = float("inf")
        while True:
            slope = min(slope, (f[i + 1] - f[i]) / (g[i + 1] - g[i]))
            if i + 2 >= len(g) or g[i + 1] >= hi:
                break
            i += 1
        return max(0.0, slope * d - MIN_SECONDS)

    def predict(self, s: Shape, host: bool = False) -> float:
        """Seconds of the step's model call; `host`: of the whole step (its host work too)."""
        t = model_seconds(self, s.rows, s.attn, s.head, s.fold, s.fold_calls)
        return t + self.host_of(s) if host else t

    def host_of(self, s: Shape) -> float:
        return host_seconds(self, s.jobs, s.drafts, s.made)

    # ------------------------------------------------------------------ online refinement
    def observe(self, s: Shape, seconds: float) -> None:
        """Refine the parameters this step used from its measured time: a normalised LMS step where
        each parameter moves in proportion to its own size (relative updates)."""
        if s.rows <= 0 or seconds <= 0:
            return
        if s.rows > GROW * self.grid[-1]:  # past the calibrated range: a measured point of f
            rest = self.c_attn * s.attn + self.c_head * s.head + ((self.fold0 + self.fold_row * s.fold) if s.fold_calls else 0)
            self.grid.append(int(round(s.rows)))
            self.f.append(max(self.f[-1], seconds - rest))
            self.seen.append(1.0)
            self.observations += 1
            return
        pred = self.predict(s)
        e = max(-CLIP * pred, min(CLIP * pred, seconds - pred))
        e *= 2 * (EXPECTILE if e > 0 else 1 - EXPECTILE)
        i, w = self._interp(s.rows)
        f = self.f
        # the parameters this step used (nonzero feature x), each at its scale max(|value|, floor),
        # read before any is moved; straight-line (this runs every step), the same arithmetic as a
        # loop over (f[i], f[i+1], c_attn, c_head, fold0, fold_row) in that order
        x0, x1, xa, xh = 1.0 - w, w, s.attn, s.head
        xf, xr = (1.0, s.fold * 1.0) if s.fold_calls else (0.0, 0.0)
        s0, s1 = max(abs(f[i]), F_FLOOR), max(abs(f[i + 1]), F_FLOOR)
        sa, sh = max(abs(self.c_attn), FLOORS["c_attn"]), max(abs(self.c_head), FLOORS["c_head"])
        sf, sr = max(abs(self.fold0), FLOORS["fold0"]), max(abs(self.fold_row), FLOORS["fold_row"])
        den = 0
        for x, sc in ((x0, s0), (x1, s1), (xa, sa), (xh, sh), (xf, sf), (xr, sr)):
            if x:
                den += (x * sc) ** 2
        if den <= 0:
            return
        g = ETA * e
        seen = self.seen
        if x0:
            f[i] = max(F_FLOOR, f[i] + max(ETA, FIRST / (1 + seen[i])) * e * x0 * s0 * s0 / den)
            seen[i] += abs(x0)
        if x1:
            f[i + 1] = max(F_FLOOR, f[i + 1] + max(ETA, FIRST / (1 + seen[i + 1])) * e * x1 * s1 * s1 / den)
            seen[i + 1] += abs(x1)
        if xa:
            self.c_attn = max(0.0, self.c_attn + g * xa * sa * sa / den)
        if xh:
            self.c_head = max(0.0, self.c_head + g * xh * sh * sh / den)
        if xf:
            self.fold0 = max(0.0, self.fold0 + g * xf * sf * sf / den)
        if xr:
            self.fold_row = max(0.0, self.fold_row + g * xr * sr * sr / den)
        for k in range(1, len(f)):  # more rows never cost less
            if f[k] < f[k - 1]:
                f[k] = f[k - 1]
        self.observations += 1

    def observe_host(self, s: Shape, seconds: float) -> None:
        """Refine the host terms from a step's host seconds (its time less the model call)."""
        if seconds <= 0:
            return
        pred = self.host_of(s)
        e = max(-CLIP * max(pred, seconds), min(CLIP * max(pred, seconds), seconds - pred))
        e *= 2 * (EXPECTILE if e > 0 else 1 - EXPECTILE)
        xj, xd, xm = s.jobs, s.drafts, s.made
        # each term's scale is at least a share of the step's host time: the terms start at zero, and a
        # relative step from a fixed floor would leave a term that starts there (a draft's host work,
        # 0.13 ms a draft at the tiny model's width, batch 1) at zero for ever
        lo = HOST_SHARE * max(pred, seconds)
        s0, sj, sd = max(self.host0, FLOORS["host0"], lo), max(self.host_job, FLOORS["host_job"], lo), \
            max(self.host_draft, FLOORS["host_draft"], lo)
        sm = max(self.host_made, FLOORS["host_made"], lo)
        den = 0
        for x, sc in ((1.0, s0), (xj, sj), (xd, sd), (xm, sm)):
            if x:
                den += (x * sc) ** 2
        g = ETA * e
        self.host0 = max(0.0, self.host0 + g * 1.0 * s0 * s0 / den)
        if xj:
            self.host_job = max(0.0, self.host_job + g * xj * sj * sj / den)
        if xd:
            self.host_draft = max(0.0, self.host_draft + g * xd * sd * sd / den)
        if xm:
            self.host_made = max(0.0, self.host_made + g * xm * sm * sm / den)
        self.host_observations += 1

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("path")
        d.pop("seen")  # the process's own, as the refinements are
        d["version"] = VERSION
        return d

    def save(self, path: str | os.PathLike | None = None) -> Path | None:
        """Write the model as JSON (atomically); None when the folder is not writable (the cache is
        only a cache)."""
        p = Path(path or self.path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
            os.replace(tmp, p)
        except OSError:
            return None
        return p

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        if d.get("version") != VERSION:
            raise ValueError("another cost model version")
        fields = {k: d[k] for k in ("grid", "f", "c_attn", "c_head", "fold0", "fold_row", "host0", "host_job",
                                     "host_draft", "host_made", "fold_roots", "observations", "host_observations", "key",
                                     "calibration_seconds") if k in d}
        m = cls(**fields)
        if len(m.grid) < 2 or len(m.grid) != len(m.f) or any(b <= a for a, b in zip(m.grid, m.grid[1:])):
            raise ValueError("malformed grid")
        return m


# ---------------------------------------------------------------------------------------- cache
def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specfold"


def cost_key(model, spec, verifier, window: int) -> dict:
    from specfold.models.spec import fingerprint
    dev = model.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"model": fingerprint(spec), "hidden": spec.hidden_size, "intermediate": spec.intermediate_size,
            "layers": spec.num_layers, "heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
            "vocab": spec.vocab_size, "device": f"{dev.type}:{name}", "dtype": str(model.dtype),
            "threads": torch.get_num_threads(), "verifier": _verifier_name(verifier), "window": int(window),
            "torch": torch.__version__} | _ranks(model)


def _ranks(model) -> dict:
    """A tensor-parallel shard's calibration is its own (one rank: the key as before)."""
    par = getattr(model, "par", None)
    return {} if par is None or par.size == 1 else {"ranks": par.size, "expert_parallel": par.expert_parallel}


def _verifier_name(verifier) -> str:
    if verifier is None or getattr(verifier, "packs_with_model", True):
        return "dense"
    return f"{getattr(verifier, 'name', 'other')}:{getattr(verifier, 'backend', '')}"


def cache_path(key: dict) -> Path:
    """The cache file of a cost model key."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"cost-{digest}.json"


_MODELS: dict[str, CostModel] = {}
_LOCK = threading.Lock()


def cost_model_for(model, spec, verifier, window: int, max_rows: int, budget_s: float = 6.0) -> CostModel:
    """The process's cost model for this machine, model, dtype, threads and verifier: from memory,
    else from the cache file, else calibrated now (and written to the cache)."""
    key = cost_key(model, spec, verifier, window)
    path = cache_path(key)
    digest = str(path)
    with _LOCK:
        m = _MODELS.get(digest)
        if m is not None:
            return m
        try:
            m = CostModel.from_dict(json.loads(path.read_text()))
            if m.key != key:
                m = None
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
            m = None
        if m is None:
            m = calibrate(model, spec, verifier, window, max_rows, budget_s)
            m.key = key
            m.path = str(path)
            m.save()
        m.path = str(path)
        _MODELS[digest] = m
        return m


def forget_models() -> None:
    """Drop the in-process models (tests: a new cache dir, a fresh calibration)."""
    with _LOCK:
        _MODELS.clear()


# ---------------------------------------------------------------------------------------- calibration
def _time(fn, reps: int = 3, clock=time.perf_counter) -> float:
    """Fastest seconds of `fn()` on `clock` after one untimed call (synchronised on CUDA: calibration
    only; noise only ever adds time); one timed call for a slow `fn` (over 0.2 s), three below."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    t0 = time.perf_counter()
    fn()
    sync()
    if time.perf_counter() - t0 > 0.2:
        reps = 1
    ts = []
    for _ in range(reps):
        t0 = clock()
        fn()
        sync()
        ts.append(clock() - t0)
    return min(ts)


def attention_coefficient(short, long, work: float, passes: int) -> float:
    """Seconds per unit of attention work (rows × extra prefix) from the same forward over a short and
    a long prefix (`short()`, `long()`: their seconds), interleaved `passes` times, each one's fastest
    kept. From one pair, a single slow call of the long one sets the term: at 0.5B width on this CPU
    one calibration read 8.2e-6 s where 16 rows over 16 to 512 cached tokens cost 0-9 ms more
    (< 1.2e-6), and the chooser priced a folded draft at 1.5x its measured cost and refused drafts
    that paid 8 %."""
    t0 = t1 = float("inf")
    for _ in range(max(1, passes)):
        t0, t1 = min(t0, short()), min(t1, long())
    return max(0.0, (t1 - t0) / work)


def calibrate(model, spec, verifier, window: int, max_rows: int, budget_s: float = 6.0) -> CostModel:
    """Measure this machine: forwards of 1, 2, 4, ... windows (while under `max_rows` and the time
    budget), the attention term from two prefix lengths (`attention_coefficient`), the head per
    row, and the folded verifier's own terms when it is one."""
    from specfold.decoding.readout import Read, read_rows
    from specfold.models.forward import Forward
    t_start = time.perf_counter()
    dev, N = model.device, max(1, int(window))
    V, M = spec.vocab_size, spec.mask_token_id
    clk = clock_for(dev)
    g = torch.Generator().manual_seed(0)

    def toks(B: int, T: int) -> torch.Tensor:
        return torch.randint(0, V, (B, T), generator=g).to(dev)

    def prefix(P: int):
        c = model.new_cache(P + N)
        if P:
            model.forward_many([Forward(toks(1, P), torch.arange(P, device=dev), c, None, True,
                                        torch.zeros(0, dtype=torch.long, device=dev))])
        return c

    none = torch.zeros(0, dtype=torch.long, device=dev)

    def dense(B: int, cache, P: int) -> float:
        x = toks(B, N)
        pos = torch.arange(P, P + N, device=dev)
        return _time(lambda: model.forward_many([Forward(x, pos, cache, None, False, None, head_rows=none)]), clock=clk)

    P0, P1 = N, 8 * N
    c0, c1 = prefix(P0), prefix(P1)
    grid, f = [], []
    B = 1
    with torch.inference_mode():
        while True:
            t = dense(B, c0, P0)
            grid.append(B * N)
            f.append(t)
            B *= 2
            spent = time.perf_counter() - t_start
            nxt = 2 * t * (2 if t > 0.2 else 4)  # the next point's cost (twice the rows, warm-up included)
            if len(grid) >= 2 and (B * N > max(max_rows, N) or spent + nxt > budget_s * 0.7):
                break
        for _ in range(CALIBRATION_PASSES - 1):  # again, each point's fastest kept
            if time.perf_counter() - t_start + sum(f) * 4 > budget_s * 0.8:
                break
            f = [min(t, dense(r // N, c0, P0)) for t, r in zip(f, grid)]
        b_att = max(1, grid[min(len(grid) - 1, 2)] // N)
        c_attn = attention_coefficient(lambda: dense(b_att, c0, P0), lambda: dense(b_att, c1, P1),
                                       b_att * N * (P1 - P0), CALIBRATION_PASSES)
        f = [max(MIN_SECONDS, t - c_attn * r * (P0 + N)) for t, r in zip(f, grid)]
        H = 8 * N
        x = torch.randn(H, spec.hidden_size, generator=g).to(dev, model.dtype)
        c_head = _time(lambda: read_rows(model.head(x).reshape(H, -1), M, Read()), clock=clk) / H
        m = CostModel(grid, f, c_attn, c_head)
        for k in range(1, len(m.f)):
            m.f[k] = max(m.f[k], m.f[k - 1])
        if verifier is not None and not getattr(verifier, "packs_with_model", True):
            _calibrate_fold(m, model, verifier, toks, c0, P0, N, budget_s - (time.perf_counter() - t_start))
    m.calibration_seconds = time.perf_counter() - t_start
    return m


def _calibrate_fold(m: CostModel, model, verifier, toks, cache, P: int, N: int, budget_s: float) -> None:
    """fold0 and fold_row from folded verifications of 2 and 8 branches, each draft its parent with one
    more token changed (so most rows fold, as real drafts do)."""
    from specfold.models.forward import Forward
    dev = model.device
    pts = []
    for B in (2, 8):
        if budget_s <= 0 and pts:
            break
        root = toks(1, N)
        rows = [root[0].clone()]
        for b in range(1, B):
            r = rows[-1].clone()
            r[(b - 1) % N] = (r[(b - 1) % N] + 1) % model.spec.vocab_size
            rows.append(r)
        x = torch.stack(rows)
        pos = torch.arange(P, P + N, device=dev)
        # the head reads the second half of every branch, as a step in mid-block does: the folded
        # verifier's last layer runs only the rows the head reads, so a read of none would undercount
        read = torch.arange(B * N, device=dev).view(B, N)[:, N // 2:].reshape(-1)
        fw = Forward(x, pos, cache, None, False, None, parents=[-1] + list(range(B - 1)), head_rows=read)
        t0 = time.perf_counter()
        out: list = []
        t = _time(lambda: out.append(verifier.verify_many([fw])), clock=clock_for(dev))
        budget_s -= time.perf_counter() - t0
        st = out[-1][0].stats or {}
        rho = sum(st.get("folded", [0])) / max(1, sum(st.get("positions", [0])))
        D = (B - 1) * N
        dense = m.f_of(N + (1 - rho) * D) + m.c_attn * B * N * (P + N) + m.c_head * read.numel()
        pts.append((D, t - dense))
    m.fold_roots = _roots_cheaper_folded(model, verifier, toks, cache, P, N)
    if len(pts) == 2 and pts[1][0] != pts[0][0]:
        (d0, r0), (d1, r1) = pts
        m.fold_row = max(0.0, (r1 - r0) / (d1 - d0))
        m.fold0 = max(0.0, r0 - m.fold_row * d0)
    elif pts:
        m.fold0 = max(0.0, pts[0][1])


def _roots_cheaper_folded(model, verifier, toks, cache, P: int, N: int, n: int = 8) -> bool:
    """Whether `n` root-only verifications cost less inside one folded call than in a dense call of
    their own. A step where some requests verify drafts runs them in the folded call either way: this
    says where its root-only verifications go (engine/runner.py). The folded call skips the last
    layer's FFN on rows the head does not read and saves a second pass over the weights, but runs
    its attention per forward: at a large width the first wins, at a small one the second."""
    from specfold.models.forward import Forward
    dev = model.device
    pos = torch.arange(P, P + N, device=dev)
    read = torch.arange(N // 2, N, device=dev)  # each reads the second half of its window
    fws = [Forward(toks(1, N), pos, cache, None, False, None, parents=[-1], head_rows=read) for _ in range(n)]
    clk = clock_for(dev)
    folded = _time(lambda: verifier.verify_many(fws), clock=clk)
    dense = _time(lambda: model.forward_many(fws), clock=clk)
    return folded < dense
