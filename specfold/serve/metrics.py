"""Prometheus metrics of the server (`GET /metrics`), in vLLM's naming style.

Invariants:
- one `CollectorRegistry` per app (never the global one), so several servers in one process
  (tests, replicas) do not share or clash;
- everything is observed on the event loop, from the deltas the handlers receive (so it works the
  same for any runner: the local engine thread or remote replicas); `Tracker` follows one HTTP
  request's engine requests; the queue gauges are read from the runner at scrape time;
- what each series counts:
  - `specfold:num_requests_running` / `_waiting`: the engine's running and waiting requests
    (`runner.queue_state()`; a runner without it reports its live requests as running, waiting NaN);
  - `specfold:prompt_tokens_total`: prompt tokens of every engine request accepted (a request with
    `n` choices is `n` engine requests); `specfold:generation_tokens_total`: final tokens delivered;
  - `specfold:forwards_total`: model forwards of the finished requests (`DecodeStats.nfe`: a packed
    step counts once for each request it advanced); `specfold:draft_tokens_accepted_total`: drafts the
    finished requests accepted (`stats.extra`: block states reused from a verified draft for
    FreeDave, Spiffy and SpecFold, draft tokens accepted for LinearSpec);
  - `specfold:time_to_first_token_seconds`, `specfold:e2e_request_latency_seconds`: from the HTTP
    request's arrival (before parsing and tokenizing) to the first final token / to the final
    delta, per engine request;
  - `specfold:kv_cache_usage_perc` (0-1: the KV pool's blocks held by requests; cached blocks nobody
    holds count as free), `specfold:num_preemptions_total`, `specfold:prefix_cache_queries_total` and
    `specfold:prefix_cache_hits_total` (prompt tokens looked up and found): vLLM's names, local runner only;
  - `specfold:fold_ratio`: per finished request, folded / verified draft positions (SpecFold; requests
    that verified no draft position are not observed);
  - `specfold:request_success_total{finished_reason}`: engine requests by how they ended ("stop",
    "length", or "abort" for those whose client went away);
  - draft budgets (FreeDave, Spiffy, SpecFold; `EngineConfig.draft_budget`), from finished requests:
    `specfold:draft_budget` (histogram: drafts verified per verification, the chosen budgets),
    and `specfold:drafts_verified_total` (so accepted / verified is the acceptance rate).
"""
from __future__ import annotations

import time

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
RATIO_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))
BUDGET_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, runner):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = r = CollectorRegistry()
        state = getattr(runner, "queue_state", None) or (lambda: (runner.running(), float("nan")))
        Gauge("specfold:num_requests_running", "Requests the engine is decoding.",
              registry=r).set_function(lambda: state()[0])
        Gauge("specfold:num_requests_waiting", "Requests waiting for a slot in the engine.",
              registry=r).set_function(lambda: state()[1])
        self.prompt_tokens = Counter("specfold:prompt_tokens", "Prompt tokens of the requests accepted.",
                                     registry=r)
        self.generation_tokens = Counter("specfold:generation_tokens", "Final tokens generated.", registry=r)
        self.forwards = Counter("specfold:forwards", "Model forwards of the finished requests.", registry=r)
        self.accepted = Counter("specfold:draft_tokens_accepted", "Drafts accepted by the finished requests.",
                                registry=r)
        self.ttft = Histogram("specfold:time_to_first_token_seconds", "Arrival to the first final token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("specfold:e2e_request_latency_seconds", "Arrival to the final delta.",
                             buckets=E2E_BUCKETS, registry=r)
        self.fold_ratio = Histogram("specfold:fold_ratio", "Folded / verified draft positions per request.",
                                    buckets=RATIO_BUCKETS, registry=r)
        self.success = Counter("specfold:request_success", "Engine requests by how they ended.",
                               ["finished_reason"], registry=r)
        self.budget = Histogram("specfold:draft_budget", "Drafts verified per verification (the chosen budgets).",
                                buckets=BUDGET_BUCKETS, registry=r)
        self.verified = Counter("specfold:drafts_verified", "Drafts verified by the finished requests.", registry=r)
        self.kv_state = getattr(runner, "kv_state", None)  # the engine's KV pool (a local runner)
        if self.kv_state is not None:
            Gauge("specfold:kv_cache_usage_perc", "Share of the KV pool's blocks held by requests (0-1).",
                  registry=r).set_function(lambda: self.kv_state()["kv_cache_usage_perc"])
            self.kv_counts = {name: Counter(f"specfold:{name}", text, registry=r) for name, text in (
                ("num_preemptions", "Requests preempted (their blocks freed; they resumed later)."),
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
                ("prefix_cache_hits", "Prompt tokens whose K/V came from the prefix cache."))}
            self._kv_seen = dict.fromkeys(self.kv_counts, 0)

    def track(self, arrival: float, prompt_lengths: list[int]) -> "Tracker":
        """An accepted HTTP request: one engine request per prompt length (in choice order)."""
        self.prompt_tokens.inc(sum(prompt_lengths))
        return Tracker(self, arrival, len(prompt_lengths))

    def finished(self, reason: str | None, stats) -> None:
        self.success.labels(finished_reason=reason or "abort").inc()
        if stats is None:
            return
        self.forwards.inc(stats.nfe)
        ex = stats.extra
        self.accepted.inc(ex.get("reused_states", 0) + ex.get("accepted_drafts", 0))
        if ex.get("fold_ratio") is not None:
            self.fold_ratio.observe(ex["fold_ratio"])
        for k, n in (ex.get("draft_budgets") or {}).items():
            for _ in range(int(n)):
                self.budget.observe(int(k))
        self.verified.inc(ex.get("drafts_verified", 0))

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        if self.kv_state is not None:  # the engine's running counts -> the counters
            st = self.kv_state()
            for name, c in self.kv_counts.items():
                c.inc(max(0, st[name] - self._kv_seen[name]))
                self._kv_seen[name] = max(st[name], self._kv_seen[name])
        return generate_latest(self.registry)


class Tracker:
    """The engine requests of one HTTP request, as their deltas reach the handler."""

    def __init__(self, metrics: ServerMetrics, arrival: float, n: int):
        self.metrics, self.arrival = metrics, arrival
        self.first = [True] * n
        self.open = set(range(n))

    def delta(self, index: int, d) -> None:
        m, now = self.metrics, time.monotonic()
        if d.new_token_ids:
            m.generation_tokens.inc(len(d.new_token_ids))
            if self.first[index]:
                self.first[index] = False
                m.ttft.observe(now - self.arrival)
        if d.finished and index in self.open:
            self.open.discard(index)
            m.e2e.observe(now - self.arrival)
            m.finished(d.finish_reason, d.output.stats if d.output is not None else None)

    def close(self) -> None:
        """The handler is done: requests still open were aborted (their client went away)."""
        for _ in self.open:
            self.metrics.finished("abort", None)
        self.open.clear()
