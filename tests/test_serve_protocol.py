"""Request validation of the OpenAI protocol (pure Python: no server, no model)."""
from __future__ import annotations

import pytest

from specfold.serve.protocol import ApiError, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CMPL = {"model": "m", "prompt": "hi"}


def test_defaults_and_accepted_fields():
    r = parse_request(dict(CHAT), chat=True)
    assert (r.n, r.max_tokens, r.temperature, r.seed, r.stop, r.stream) == (1, None, None, None, [], False)
    r = parse_request(dict(CHAT, n=3, max_completion_tokens=7, temperature=0.5, seed=11, stop="x", stream=True,
                           stream_options={"include_usage": True}, user="u", top_p=1, presence_penalty=0.0,
                           logprobs=False, tools=None), chat=True)
    assert (r.n, r.max_tokens, r.temperature, r.seed, r.stop, r.include_usage) == (3, 7, 0.5, 11, ["x"], True)
    r = parse_request(dict(CMPL, prompt=[[1, 2], "a b"], max_tokens=4, stop=["a", "b"]), chat=False)
    assert r.prompts == [[1, 2], "a b"] and r.max_tokens == 4 and r.stop == ["a", "b"]
    assert parse_request(dict(CMPL, prompt=[5, 6]), chat=False).prompts == [[5, 6]]


def test_logprobs_fields():
    """Chat: logprobs true/false (+ top_logprobs 0..5); completions: logprobs N (0..5). None = off."""
    assert parse_request(dict(CHAT), chat=True).logprobs is None
    assert parse_request(dict(CHAT, logprobs=False, top_logprobs=0), chat=True).logprobs is None
    assert parse_request(dict(CHAT, logprobs=True), chat=True).logprobs == 0
    assert parse_request(dict(CHAT, logprobs=True, top_logprobs=5), chat=True).logprobs == 5
    assert parse_request(dict(CMPL), chat=False).logprobs is None
    assert parse_request(dict(CMPL, logprobs=None), chat=False).logprobs is None
    assert [parse_request(dict(CMPL, logprobs=n), chat=False).logprobs for n in (0, 3, 5)] == [0, 3, 5]


def test_content_parts_are_joined_and_developer_is_system():
    msgs = [{"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    r = parse_request(dict(CHAT, messages=msgs), chat=True)
    assert r.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]


# (endpoint is chat?, body change, param named in the error, words in the message)
BAD = [
    (True, {"messages": None}, "messages", "missing"),
    (True, {"messages": []}, "messages", "non-empty list"),
    (True, {"messages": [5]}, "messages[0]", "must be an object"),
    (True, {"messages": [{"role": "user"}]}, "messages[0].content", "missing"),
    (True, {"messages": [{"content": "x"}]}, "messages[0].role", "must be one of"),
    (True, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "must be one of"),
    (True, {"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "string or a non-empty list"),
    (True, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", "'image_url' is not supported"),
    (True, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content", "text part"),
    (True, {"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name", "not supported"),
    (True, {"max_tokens": 3, "max_completion_tokens": 3}, "max_completion_tokens", "not both"),
    (True, {"prompt": "x"}, "prompt", "unknown field"),
    (False, {"messages": CHAT["messages"]}, "messages", "unknown field"),
    (False, {"prompt": None}, "prompt", "missing"),
    (False, {"prompt": ""}, "prompt", "empty string"),
    (False, {"prompt": []}, "prompt", "non-empty"),
    (False, {"prompt": [[1, -2]]}, "prompt", "token ids"),
    (False, {"prompt": [1.5]}, "prompt", "token ids"),
    (False, {"prompt": {"a": 1}}, "prompt", "non-empty string"),
    (False, {"model": None}, "model", "non-empty string"),
    (False, {"model": 3}, "model", "non-empty string"),
    (False, {"seed": "x"}, "seed", "integer"),
    (False, {"seed": -1}, "seed", "integer"),
    (False, {"seed": 1.0}, "seed", "integer"),
    (False, {"seed": True}, "seed", "integer"),
    (False, {"n": 0}, "n", "integer"),
    (False, {"n": 17}, "n", "integer"),
    (False, {"n": "2"}, "n", "integer"),
    (False, {"max_tokens": 0}, "max_tokens", "integer"),
    (False, {"max_tokens": "8"}, "max_tokens", "integer"),
    (False, {"temperature": -0.1}, "temperature", "number in"),
    (False, {"temperature": 2.5}, "temperature", "number in"),
    (False, {"temperature": "hot"}, "temperature", "number in"),
    (False, {"temperature": float("nan")}, "temperature", "number in"),
    (False, {"stop": 5}, "stop", "non-empty string"),
    (False, {"stop": ["a", ""]}, "stop", "non-empty string"),
    (False, {"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    (False, {"stream": "yes"}, "stream", "true or false"),
    (False, {"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", "true or"),
    (False, {"stream": True, "stream_options": {"x": True}}, "stream_options", "accepts only"),
    (False, {"stream_options": {"include_usage": True}}, "stream_options", "only allowed with"),
    (False, {"user": 5}, "user", "string"),
    (False, {"logprobs": 21}, "logprobs", "integer in [0, 20]"),
    (False, {"logprobs": -1}, "logprobs", "integer in [0, 20]"),
    (False, {"logprobs": True}, "logprobs", "integer in [0, 20]"),
    (False, {"logprobs": "2"}, "logprobs", "integer in [0, 20]"),
    (False, {"top_logprobs": 2}, "top_logprobs", "completions take 'logprobs': N"),
    (True, {"logprobs": 1}, "logprobs", "true or false"),
    (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer in [0, 20]"),
    (True, {"logprobs": True, "top_logprobs": True}, "top_logprobs", "integer in [0, 20]"),
    (True, {"top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    (True, {"logprobs": False, "top_logprobs": 3}, "top_logprobs", "needs 'logprobs': true"),
    (False, {"echo": True}, "echo", "not supported"),
    (False, {"best_of": 2}, "best_of", "not supported"),
    (False, {"suffix": "x"}, "suffix", "not supported"),
    (False, {"logit_bias": {"1": 5}}, "logit_bias", "not supported"),
    (False, {"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    (False, {"frequency_penalty": 1}, "frequency_penalty", "not supported"),
    (False, {"top_p": 0.9}, "top_p", "not supported"),
    (True, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
    (True, {"response_format": {"type": "json_object"}}, "response_format", "not supported"),
    (False, {"graph": "/etc/passwd"}, "graph", "unknown field"),
    (False, {"method": "spiffy"}, "method", "unknown field"),
    (False, {"delta": 0.0}, "delta", "unknown field"),
    (False, {"max_new_tokens": 4}, "max_new_tokens", "unknown field"),
]


@pytest.mark.parametrize("chat,change,param,words", BAD, ids=[f"{p}:{w}" for _, _, p, w in BAD])
def test_bad_fields_name_the_field(chat, change, param, words):
    body = dict(CHAT if chat else CMPL)
    for k, v in change.items():
        if v is None and k in ("messages", "prompt", "model"):
            body.pop(k, None)
        else:
            body[k] = v
    with pytest.raises(ApiError) as e:
        parse_request(body, chat=chat)
    err = e.value.body()["error"]
    assert e.value.status == 400 and set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and words in err["message"], err


def test_body_must_be_an_object():
    for body in ([1], "x", 3, None):
        with pytest.raises(ApiError, match="JSON object"):
            parse_request(body, chat=True)


def test_unknown_field_lists_the_accepted_ones():
    with pytest.raises(ApiError) as e:
        parse_request(dict(CHAT, graph="/etc/passwd"), chat=True)
    assert "'messages'" in e.value.message and "'seed'" in e.value.message


# the limits of a request are one set (specfold/params.py): a value the API refuses, the server refuses
# (400), and the CLI refuses (one line, exit 2); a value one accepts, all accept. (request field, value,
# accepted by all?)
LIMITS = [("temperature", v, 0 <= v <= 2) for v in (0, 0.7, 2, 2.0001, 2.5, -0.1)] + \
         [("temperature", v, False) for v in ("hot", True, float("nan"), float("inf"))] + \
         [("seed", v, 0 <= v < 2**63) for v in (0, 12, 2**63 - 1, 2**63, -1)] + \
         [("seed", v, False) for v in (1.0, "7", True)] + \
         [("logprobs", v, 0 <= v <= 20) for v in (0, 5, 20, 21, -1)] + \
         [("max_tokens", v, v >= 1) for v in (1, 64, 0, -1)] + \
         [("max_tokens", v, False) for v in ("8", True, 2.0)] + \
         [("stop", v, ok) for v, ok in (("x", True), (["a", "b"], True), ("", False), (["a", ""], False),
                                        (5, False), ([3], False))]


def _api_accepts(field: str, value) -> bool:
    from specfold import SamplingParams
    from specfold.errors import ParamsError
    from specfold.serve.protocol import SAMPLING_FIELDS
    try:
        SamplingParams(**{SAMPLING_FIELDS[field]: value})
        return True
    except ParamsError:
        return False


def _server_accepts(field: str, value) -> bool:
    try:
        parse_request({"model": "m", "prompt": "hi", field: value}, chat=False)
        return True
    except ApiError as e:
        assert e.status == 400 and e.param == field, e.body()
        return False


@pytest.mark.parametrize("field,value,ok", LIMITS, ids=[f"{f}={v!r}" for f, v, _ in LIMITS])
def test_the_api_and_the_server_refuse_the_same_values(field, value, ok):
    assert (_api_accepts(field, value), _server_accepts(field, value)) == (ok, ok)


# the numbers (on a command line every value is text: "7" is the seed 7 there, 5 the stop string "5")
CLI_LIMITS = [(f, v, ok) for f, v, ok in LIMITS if isinstance(v, (int, float)) and not isinstance(v, bool) and f != "stop"]


@pytest.mark.parametrize("field,value,ok", CLI_LIMITS, ids=[f"{f}={v!r}" for f, v, _ in CLI_LIMITS])
def test_the_cli_refuses_what_the_api_refuses(field, value, ok):
    """The same values through the flag of the SamplingParams field (`--max-new-tokens` for max_tokens):
    accepted into the same SamplingParams, or refused while parsing (argparse's exit 2)."""
    import argparse

    from specfold.args import add_settings, flag, sampling_from_args
    from specfold.serve.protocol import SAMPLING_FIELDS
    name = SAMPLING_FIELDS[field]
    ap = argparse.ArgumentParser()
    add_settings(ap)
    if ok:
        assert getattr(sampling_from_args(ap.parse_args([flag(name), str(value)])), name) == value
    else:
        with pytest.raises(SystemExit) as e:
            ap.parse_args([flag(name), str(value)])
        assert e.value.code == 2


def test_request_fields_map_onto_sampling_params():
    """Every SamplingParams field is set by a request field (SAMPLING_FIELDS) or by the server
    (SERVER_SAMPLING), never both; every mapped request field is a GenRequest field."""
    import dataclasses

    from specfold import SamplingParams
    from specfold.serve.protocol import SAMPLING_FIELDS, SERVER_SAMPLING, GenRequest
    names = [f.name for f in dataclasses.fields(SamplingParams)]
    assert sorted(list(SAMPLING_FIELDS.values()) + list(SERVER_SAMPLING)) == sorted(names)
    assert set(SAMPLING_FIELDS) <= {f.name for f in dataclasses.fields(GenRequest)}


def test_sampling_params_of_a_request():
    """The request's fields over the server's defaults; what it leaves out keeps the defaults."""
    from specfold import SamplingParams
    from specfold.serve.protocol import sampling_params
    defaults = SamplingParams(max_new_tokens=32, temperature=0.3)
    r = parse_request(dict(CHAT, max_completion_tokens=7, seed=11, stop="x", logprobs=True, top_logprobs=2), chat=True)
    assert sampling_params(r, defaults) == SamplingParams(max_new_tokens=7, temperature=0.3, seed=11, stop=["x"],
                                                          logprobs=2)
    r = parse_request(dict(CMPL, temperature=0), chat=False)
    assert sampling_params(r, defaults, seed=5) == SamplingParams(max_new_tokens=32, temperature=0.0, seed=5, stop=[])
