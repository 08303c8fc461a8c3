"""The engine's KV memory: the paged pool's size, admission by free blocks, preemption, the prefix
cache and the one-line refusal of a request that cannot fit.

    kv = KVMemory(model, spec, config, program)   # kv.pool: BlockPool, or None (no KV cache)
    kv.check(n_prompt, max_new_tokens, cfg)       # ParamsError when the request could never fit
    kv.fits(req, running)                         # admission: its context's blocks + 1 are free
    kv.new_cache(req)                             # its cache, with the prefix cache's matching blocks
    chosen = kv.reserve(chosen, running, preempt) # every write of the step has its blocks
    kv.seal(running)                              # full final blocks enter the prefix cache

Invariants:
- the blocks of a write are taken before the step runs (`reserve`), so a forward never finds the
  pool short; when it is, the most recently admitted running request is preempted (`preempt`
  frees its blocks and requeues it at the front) until the write fits or the writer itself went;
  after a preemption nobody is admitted until a request finishes (or none runs): the freed blocks
  are for the running requests' growth, and re-admitting at once would only preempt again;
- a request is refused when added if prompt + max_new_tokens + 1 block exceed the whole pool (no
  program writes more: the last block is never committed, LinearSpec crops its drafts), so a
  request alone always fits and the oldest running request is never preempted: every request ends;
- a block enters the prefix cache only once every token its K/V depend on is written and final
  (checked after each step's update, when LinearSpec has cropped its rejected drafts).
"""
from __future__ import annotations

import logging
import os

import torch

from specfold.decoding.causal.program import CausalProgram
from specfold.engine.prefix import PrefixKeys
from specfold.errors import ConfigError, ParamsError
from specfold.models.pool import BlockPool
from specfold.models.spec import fingerprint

log = logging.getLogger("specfold")
CPU_SHARE = 8  # kv_cache_memory unset on the CPU: an eighth of the RAM


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def default_bytes(device: torch.device, utilization: float) -> tuple[int, str]:
    """The pool's bytes when kv_cache_memory is unset, and how they were found."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        n = int(free - (1 - utilization) * total)
        return n, f"gpu_memory_utilization={utilization} of {fmt_bytes(total)}, {fmt_bytes(total - free)} in use"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // CPU_SHARE, f"1/{CPU_SHARE} of {fmt_bytes(ram)} RAM"


def make_pool(model, spec, config) -> BlockPool | None:
    """The engine's pool (None for a family that decodes without a KV cache)."""
    if not spec.uses_cache:
        return None
    bs = config.kv_block_size
    s = model.spec
    block = 2 * s.num_layers * s.num_kv_heads * s.head_dim * bs * model.dtype.itemsize
    nbytes, how = (config.kv_cache_memory, "kv_cache_memory") if config.kv_cache_memory else \
        default_bytes(model.device, config.gpu_memory_utilization or 0.9)
    n = nbytes // block
    if not config.kv_cache_memory and model.device.type != "cuda":
        # no more than the engine can use: max_num_seqs requests at the model's full context (a CPU
        # process may hold several engines, and each pool is allocated whole)
        most = config.max_num_seqs * (-(-(spec.max_position_embeddings + (config.block_size or 0)) // bs) + 1) + 1
        if n > most:
            n, how = most, f"{how}, capped at {config.max_num_seqs} requests of the full context"
    if n < 2:
        raise ConfigError(f"the KV pool of {fmt_bytes(max(nbytes, 0))} ({how}) holds {max(n, 0)} blocks of "
                          f"{bs} positions ({fmt_bytes(block)} each); it needs at least 2: raise kv_cache_memory")
    log.info("KV pool: %d blocks of %d positions, %s (%s)", n - 1, bs, fmt_bytes(n * block), how)
    with torch.inference_mode():
        return BlockPool.for_model(model, n, bs)


def prefix_caching(spec, config, program) -> bool:
    """Whether the prefix cache is on: by default where K/V are a function of the tokens alone."""
    why = None
    if not spec.uses_cache:
        why = f"{spec.family} decodes without a KV cache (bidirectional attention over the whole canvas)"
    elif config.eager and config.method == "specfold" and config.delta > 0:
        why = "eager windows under SpecFold at delta > 0 write K/V from folded (approximate) hidden states"
    if why is None:
        return config.enable_prefix_caching is not False
    if config.enable_prefix_caching:
        raise ConfigError(f"enable_prefix_caching is not exact here: {why}; leave it unset")
    return False


class KVMemory:
    def __init__(self, model, spec, config, program):
        self.pool = make_pool(model, spec, config)
        self.keys = None
        if prefix_caching(spec, config, program):
            causal = spec.attention == "causal_prefix" or isinstance(program, CausalProgram)
            group = 1 if causal else config.block_size or spec.block_size
            salt = f"{fingerprint(spec)}|{model.dtype}|bs{self.pool.block_size}|g{group}"
            self.keys = PrefixKeys(salt, self.pool.block_size, group)
        self.preemptions = 0
        self.short = False  # a preemption since the last request finished: admit nobody new meanwhile
        self.queries = 0  # prefix-cache queries and hits, in tokens (vLLM's metrics)
        self.hits = 0

    # ------------------------------------------------------------------ adding and admitting
    def check(self, n_prompt: int, max_new_tokens: int, cfg) -> None:
        """ParamsError (one line) when the request cannot fit the pool even alone."""
        p = self.pool
        if p is None:
            return
        need = -(-(n_prompt + max_new_tokens + cfg.block_size) // p.block_size)
        if need > p.usable:
            raise ParamsError(
                f"the request needs {fmt_bytes(need * p.block_bytes)} of KV cache ({need} blocks: prompt "
                f"{n_prompt} + max_new_tokens {max_new_tokens} + a block of {cfg.block_size}) and the KV pool "
                f"has {fmt_bytes(p.usable * p.block_bytes)} ({p.usable} blocks); lower max_new_tokens or raise "
                f"kv_cache_memory")

    def fits(self, req, running=()) -> bool:
        """Admission: the request's context blocks (less prefix-cache hits) and one more are free,
        and no running request is about to write the block after its hits (then it waits a step
        and takes that block from the cache instead of computing it again)."""
        p = self.pool
        if p is None:
            return True
        if self.short and running:  # the running requests need the blocks a preemption freed
            return False
        keys = self._keys(req.context_ids)
        hit = self._match(keys)
        if len(hit) < len(keys) and any(keys[len(hit)] in r.cache.expected for r in running if r.cache):
            return False
        idle = sum(1 for b in hit if p.refs[b] == 0)  # taking these makes them unavailable to others
        need = -(-len(req.context_ids) // p.block_size) - len(hit) + 1
        return need <= p.free_blocks - idle

    def new_cache(self, req):
        """`req`'s cache, holding the prefix cache's blocks of its context (read-only)."""
        c = self.pool.new_cache()
        keys = self._keys(req.context_ids)
        hit = self._match(keys)
        c.expected = set(keys[len(hit):])  # what its prefill will register (admission waits for them)
        if self.keys is not None:
            self.queries += len(req.context_ids)
            self.hits += len(hit) * self.pool.block_size
            req.counters.prefix_cache_hit_tokens += len(hit) * self.pool.block_size
        for b in hit:
            self.pool.share(b)
        if hit:
            c._append(hit)
            n = len(hit) * self.pool.block_size
            c.length, c.tokens, c.shared, c.keyed = n, list(req.context_ids[:n]), len(hit), len(hit)
            self.keys.keys(req.context_ids, 0, c.chain, self.keys.end(len(hit) - 1))
        return c

    def _keys(self, ids: list[int]) -> list[bytes]:
        """The keys of the blocks of `ids` short of its last token (the prefill that follows a hit
        reads the logits there)."""
        if self.keys is None or len(ids) < 2:
            return []
        return self.keys.keys(ids, 0, [], len(ids) - 1)

    def _match(self, keys: list[bytes]) -> list[int]:
        """The cached blocks of the longest cached prefix with these keys."""
        out = []
        for key in keys:
            b = self.pool.lookup(key)
            if b is None:
                break
            out.append(b)
        return out

    # ------------------------------------------------------------------ a step's writes
    def reserve(self, chosen: list, running: list, preempt) -> list:
        """`chosen` less the requests preempted so that every remaining write has its blocks;
        `preempt(req)` frees a request and requeues it."""
        if self.pool is None:
            return chosen
        out = []
        for req, jobs in chosen:
            if req not in running:
                continue
            writes = [j for j in jobs if j.write_cache or j.kind == "reuse"]
            n = sum(j.width for j in writes)
            while not req.cache.reserve(n):
                victim = running[-1]
                preempt(victim)
                self.preemptions += 1
                self.short = True
                out = [(r, js) for r, js in out if r is not victim]
                if victim is req:
                    break
            else:
                for j in writes:
                    req.cache.tokens[j.start:] = j.tokens[0]
                out.append((req, jobs))
        return out

    def finished(self) -> None:
        """A request ended: its blocks are free for newcomers again."""
        self.short = False

    def seal(self, reqs) -> None:
        """Register every running cache's full blocks whose K/V are final (after the step's update)."""
        if self.keys is None:
            return
        for req in reqs:
            c = req.cache
            if c is None or len(c.tokens) < c.length:
                continue
            keys = self.keys.keys(c.tokens, c.keyed, c.chain, c.length)
            for i, key in enumerate(keys, start=c.keyed):
                self.pool.register(c.blocks[i], key)
            c.keyed += len(keys)
            c.expected.difference_update(keys)

    def health(self) -> dict:
        p = self.pool
        if p is None:
            return {"kv_blocks_total": 0, "kv_blocks_free": 0, "kv_cache_usage_perc": 0.0}  # no cache (a canvas)
        return {"kv_blocks_total": p.usable, "kv_blocks_free": p.free_blocks, "kv_block_size": p.block_size,
                "kv_cache_bytes": p.usable * p.block_bytes, "kv_cache_usage_perc": self.usage(),
                "prefix_cache_blocks": p.cached_blocks}

    def usage(self) -> float:
        """Share of the pool's blocks referenced by requests (cached idle blocks count as free)."""
        p = self.pool
        return 0.0 if p is None else p.used_blocks / p.usable
