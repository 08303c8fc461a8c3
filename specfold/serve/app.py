"""The FastAPI app: /v1/models, /v1/completions, /v1/chat/completions (plain and SSE), /health,
/metrics.

Invariants:
- Handlers never decode: they validate (protocol.py), tokenise, submit one group of engine requests
  to the runner (runner.py) and await its deltas. Concurrent clients are batched by the engine.
- Bounded work per request (limits.py): a body over `max_body_bytes` is 413 before it is read; a
  prompt with more characters than its token budget can stand for is refused before it is
  tokenized; templating and tokenizing run in a worker thread with the GIL released while the
  tokenizer works, so other streams and the engine thread go on.
- With `api_key`, every /v1/* request needs it (auth.py); /health and /metrics stay open.
- Choice `i` of a request (prompt `p`, `n` choices) is the engine request of `seed + i`, index
  `p * n + i` (the request's `seed`, or one drawn at random when absent).
- A client that goes away (stream or not) has its unfinished engine requests aborted at once.
- logprobs: every chunk carries those of the tokens it carries (a chunk is sent for new tokens even
  when their text is held back); a choice's are those of its final token ids.
- Every error is OpenAI's body `{"error": {"message", "type", "param", "code"}}`: 400 bad input, 404
  unknown model or route, 429 engine full (EngineFull, with Retry-After); 503 `engine_down` with the
  error's one line once the engine cannot run (DistributedError: a tensor-parallel rank died or a
  collective timed out), for the requests it ended and every later one, and /health says the same;
  500 only for a genuine internal error (logged).

No `from __future__ import annotations` here: FastAPI reads the handlers' `Request` annotation at
runtime, and FastAPI is imported inside `create_app` (the serve extra stays optional).
"""
import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

from specfold.errors import DistributedError, EngineFull, SpecfoldError
from specfold.params import SamplingParams
from specfold.serve.protocol import (MAX_SEED, ApiError, GenRequest, bad, chat_logprobs, choice, chunk_choice,
                                     completion_logprobs, envelope, new_id, parse_request, sampling_params, usage)
from specfold.serve.limits import MAX_BODY_BYTES, max_chars_per_token, read_body, tokenize
from specfold.serve.runner import EngineRunner

log = logging.getLogger("specfold.serve")


@dataclass(slots=True)
class ServeConfig:
    model_name: str  # what clients pass as `model`
    max_tokens: int = 256  # when a request gives no max_tokens
    temperature: float = 0.0  # when a request gives no temperature
    max_body_bytes: int = MAX_BODY_BYTES  # a larger request body is 413, refused before it is read
    api_key: str | None = None  # when set, every /v1/* request needs `Authorization: Bearer <key>`


def engine_error(e: BaseException) -> ApiError:
    """An exception the engine raised for one request, as the client's error."""
    if isinstance(e, ApiError):  # already the client's error (e.g. from a remote runner)
        return e
    if isinstance(e, EngineFull):
        return ApiError(429, str(e) or "the engine is full; retry later", code="engine_full", type="server_error")
    if isinstance(e, DistributedError):  # the engine is down (runner.py): not the request's fault
        return engine_down(e)
    if isinstance(e, SpecfoldError):
        return bad(None, str(e))
    log.error("internal error in the engine", exc_info=e)
    return ApiError(500, "internal server error", code="internal_error", type="server_error")


def engine_down(e: DistributedError) -> ApiError:
    return ApiError(503, str(e), code="engine_down", type="server_error")


class Service:
    """What the handlers need: the LLM (tokenizer, spec), the runner and the config."""

    def __init__(self, llm, runner: EngineRunner, config: ServeConfig):
        from specfold.serve.metrics import ServerMetrics
        self.llm, self.runner, self.config = llm, runner, config
        self.metrics = ServerMetrics(runner)
        # no token stands for more characters than this (None: no bound provable for this tokenizer)
        self.chars_per_token = max_chars_per_token(llm.tokenizer) if llm.tokenizer is not None else None

    def token_text(self, token_id: int) -> str:
        """One token's text in logprobs (specials included; "token_id:N" without a tokenizer)."""
        tok = self.llm.tokenizer
        return f"token_id:{token_id}" if tok is None else tok.decode([token_id], skip_special_tokens=False)

    def logprobs(self, req: GenRequest, ids: list[int], lps: list[dict] | None, offset: int = 0) -> tuple:
        """(the OpenAI logprobs object of these tokens or None, the text offset after them)."""
        if req.logprobs is None or lps is None:
            return None, offset
        if req.chat:
            return chat_logprobs(ids, lps, req.logprobs, self.token_text), offset
        return completion_logprobs(ids, lps, self.token_text, offset)

    def check_model(self, name: str) -> None:
        if name != self.config.model_name:
            raise ApiError(404, f"model {name!r} does not exist; this server serves {self.config.model_name!r}",
                           param="model", code="model_not_found")

    def encode(self, req: GenRequest, max_tokens: int) -> list[list[int]]:
        tok = self.llm.tokenizer
        texts = [self._chat_text(req.messages)] if req.chat else req.prompts
        if tok is None and any(isinstance(t, str) for t in texts):
            raise bad("messages" if req.chat else "prompt", "this checkpoint has no tokenizer: send "
                      "/v1/completions prompts as lists of token ids")
        out, param = [], "messages" if req.chat else "prompt"
        for t in texts:
            if isinstance(t, str):
                self._check_chars(t, max_tokens, param)
                ids = tokenize(tok, t)  # the GIL is released meanwhile: the loop and the engine run
            else:
                ids = list(t)
            self._check_ids(ids, max_tokens, param)
            out.append(ids)
        return out

    def _check_chars(self, text: str, max_tokens: int, param: str) -> None:
        """Refuse, without tokenizing it, a text that cannot fit: more characters than the tokens left
        after max_tokens can stand for (limits.max_chars_per_token)."""
        ctx, per = self.llm.spec.max_position_embeddings, self.chars_per_token
        budget = ctx - max_tokens
        if budget < 1:
            raise bad("max_tokens", f"max_tokens={max_tokens} leaves no room for a prompt in the model's context "
                                    f"of {ctx} positions", code="context_length_exceeded")
        if per is not None and len(text) > budget * per:
            raise bad(param, f"the prompt of {len(text)} characters cannot fit: no token of this tokenizer "
                             f"stands for more than {per} characters, so it needs more than {budget} tokens, and "
                             f"the model's context of {ctx} positions leaves {budget} after max_tokens={max_tokens}",
                      code="context_length_exceeded")

    def _chat_text(self, messages: list[dict]) -> str:
        from jinja2.exceptions import TemplateError
        if self.llm.tokenizer is None:
            raise bad("messages", "this checkpoint has no tokenizer: chat is unavailable; use /v1/completions "
                                  "with token-id prompts")
        try:
            return self.llm.tokenizer.apply_chat_template(messages)
        except TemplateError as e:
            raise bad("messages", f"the model's chat template refused these messages: {e}") from None
        except SpecfoldError as e:
            raise bad("messages", str(e)) from None

    def _check_ids(self, ids: list[int], max_tokens: int, param: str) -> None:
        spec = self.llm.spec
        if not ids:
            raise bad(param, "the prompt encodes to no tokens")
        out = [t for t in ids if t >= spec.vocab_size]
        if out:
            raise bad(param, f"prompt token ids outside the vocabulary [0, {spec.vocab_size}): {out[:5]}")
        ctx = spec.max_position_embeddings
        if len(ids) + max_tokens > ctx:
            raise bad("max_tokens", f"prompt of {len(ids)} tokens + max_tokens={max_tokens} exceeds the model's "
                                    f"context of {ctx} positions", code="context_length_exceeded")

    def items(self, req: GenRequest) -> tuple[list[tuple[list[int], object]], int]:
        """The group's `(prompt_ids, SamplingParams)` items and its prompt token count."""
        try:
            base = sampling_params(req, SamplingParams(max_new_tokens=self.config.max_tokens,
                                                       temperature=self.config.temperature))
        except SpecfoldError as e:
            raise bad(None, str(e)) from None
        seed = random.randrange(MAX_SEED) if req.seed is None else req.seed
        prompts = self.encode(req, base.max_new_tokens)
        items = [(ids, base.replace(seed=(seed + i) % MAX_SEED)) for ids in prompts for i in range(req.n)]
        return items, sum(len(p) for p in prompts)


# ---------------------------------------------------------------------------------- responses
async def _disconnected(request) -> None:
    """Return when the client closes the connection (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(group, request, n_items: int, tracker):
    """Texts, finish reasons, token ids and their logprobs (None when not asked for) of a group's
    choices, or None if the client left."""
    texts, reasons = [""] * n_items, [None] * n_items
    ids: list[list[int]] = [[] for _ in range(n_items)]
    lps: list[list | None] = [[] for _ in range(n_items)]

    async def gather():
        async for i, d in group.events():
            tracker.delta(i, d)
            texts[i] += d.text_delta
            ids[i] += d.new_token_ids
            lps[i] = lps[i] + d.new_logprobs if lps[i] is not None and d.new_logprobs is not None else None
            if d.finished:
                reasons[i] = d.finish_reason
                if d.output is not None:
                    ids[i], lps[i] = d.output.token_ids, d.output.logprobs

    work, watch = asyncio.ensure_future(gather()), asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            return None
        work.result()
        return texts, reasons, ids, lps
    finally:
        work.cancel()
        watch.cancel()
        group.close()
        tracker.close()


def _close(group, tracker) -> None:
    group.close()
    tracker.close()


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def stream(group, req: GenRequest, model: str, n_items: int, prompt_tokens: int, tracker, service):
    """Server-sent events: one chunk per delta with text (or, with logprobs, new tokens), a finish
    chunk per choice, [DONE]."""
    rid, created = new_id(req.chat), int(time.time())
    tokens, offsets = [0] * n_items, [0] * n_items

    def chunk(choices, usage_=None):
        return sse(envelope(rid, req.chat, model, choices, stream=True, created=created, usage_=usage_))
    try:
        if req.chat:
            for i in range(n_items):
                yield chunk([chunk_choice(True, i, "", None, first=True)])
        async for i, d in group.events():
            tracker.delta(i, d)
            tokens[i] = len(d.output.token_ids) if d.output is not None else tokens[i] + len(d.new_token_ids)
            lp, offsets[i] = service.logprobs(req, d.new_token_ids, d.new_logprobs, offsets[i])
            if d.text_delta or (lp is not None and d.new_token_ids):
                yield chunk([chunk_choice(req.chat, i, d.text_delta, None, logprobs=lp)])
            if d.finished:
                yield chunk([chunk_choice(req.chat, i, None, d.finish_reason)])
        if req.include_usage:
            yield chunk([], usage(prompt_tokens, sum(tokens)))
    except Exception as e:  # an internal error after the headers went out: tell the client in-band
        yield sse(engine_error(e).body())
    finally:
        group.close()  # a cancelled generator (client gone) aborts its unfinished requests here
        tracker.close()
    yield "data: [DONE]\n\n"


async def generate(service: Service, request, chat: bool):
    """One /v1/completions (`chat` False) or /v1/chat/completions request: read and validate the
    body, template and tokenize it in a worker thread, submit its group to the runner, then stream
    the deltas (SSE) or collect them into one JSON response."""
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.background import BackgroundTask
    config = service.config
    arrival = time.monotonic()
    raw = await read_body(request, config.max_body_bytes)  # 413 before an oversized body is read
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise bad(None, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    req = parse_request(body, chat)
    service.check_model(req.model)
    items, prompt_tokens = await asyncio.to_thread(service.items, req)  # templating and tokenizing
    group = service.runner.submit(items, stream=req.stream)
    try:
        await group.started()
    except asyncio.CancelledError:
        group.close()
        raise
    except Exception as e:
        raise engine_error(e) from None
    tracker = service.metrics.track(arrival, [len(ids) for ids, _ in items])
    if req.stream:
        # background: closes the group even when the client leaves before the first chunk
        events = stream(group, req, config.model_name, len(items), prompt_tokens, tracker, service)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                 background=BackgroundTask(_close, group, tracker))
    try:
        got = await collect(group, request, len(items), tracker)
    except Exception as e:
        raise engine_error(e) from None
    if got is None:  # the client left; nobody reads this
        return JSONResponse({}, status_code=499)
    texts, reasons, ids, lps = got
    choices = [choice(chat, i, t, r, service.logprobs(req, ids[i], lps[i])[0])
               for i, (t, r) in enumerate(zip(texts, reasons))]
    return JSONResponse(envelope(new_id(chat), chat, config.model_name, choices, stream=False,
                                 usage_=usage(prompt_tokens, sum(len(x) for x in ids))))


# ---------------------------------------------------------------------------------- the app
def create_app(llm, engine, config: ServeConfig, runner=None):
    """The app around an Engine (stepped in a background thread started with the app), or around
    `runner` (an object with EngineRunner's interface, e.g. specfold/ray's replicas; `llm` then needs
    only `tokenizer` and `spec`)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    service = Service(llm, runner if runner is not None else EngineRunner(engine), config)

    @asynccontextmanager
    async def lifespan(_app):
        service.runner.start()
        yield
        service.runner.stop()

    app = FastAPI(title="specfold", lifespan=lifespan)
    app.state.service = service
    if config.api_key:
        from specfold.serve.auth import ApiKeyMiddleware
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)

    @app.exception_handler(ApiError)
    async def api_error(_r, e: ApiError):
        headers = {"Retry-After": "1"} if e.status in (429, 503) else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_r, e):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return JSONResponse(ApiError(e.status_code, str(e.detail), code=code).body(), status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_r, e):
        return JSONResponse(bad(None, f"invalid request: {e.errors()}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(_r, e):
        log.error("internal error", exc_info=e)
        return JSONResponse(ApiError(500, "internal server error", code="internal_error",
                                     type="server_error").body(), status_code=500)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(service, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(service, request, chat=True)

    def model_card() -> dict:
        return {"id": config.model_name, "object": "model", "created": 0, "owned_by": "specfold"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        service.check_model(name)
        return model_card()

    @app.get("/metrics")
    async def metrics():
        from specfold.serve.metrics import CONTENT_TYPE
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health():
        if not service.runner.alive():
            raise ApiError(503, "no engine is running", code="engine_down", type="server_error")
        down = getattr(service.runner, "down", None)  # a runner of specfold/ray's has none
        if down is not None:
            raise engine_down(down)
        return {"status": "ok", **service.runner.health()}

    return app
