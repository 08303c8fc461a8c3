"""The [clean ; noisy] training forward equals the inference-time forward on the same block state."""
import random

import torch

from specfold.models.spec import resolve_spec
from specfold.models.transformer import Transformer
from specfold.tiny import data as D
from specfold.tiny import train as TR
from specfold.tiny import tokenizer as T
from specfold.models.tokenizer import Tokenizer


def _setup(tmp_path):
    rng = random.Random(0)
    probs = [D.make_problem(rng) for _ in range(300)]
    T.save_tokenizer(T.train_tokenizer(T.corpus(probs)), tmp_path)
    tok = Tokenizer.load(tmp_path)
    enc = TR.Encoder(tok)
    cfg = TR.model_config("micro", len(tok.vocab), enc.mask, [enc.im_end, enc.pad], enc.im_end, enc.pad)
    spec = resolve_spec(cfg)
    torch.manual_seed(0)
    model = Transformer(spec).double().eval()
    TR.init_weights(model, std=0.2)
    return probs, enc, spec, model


import pytest


@pytest.mark.parametrize("fused", [False, True])
def test_training_forward_matches_inference_forward(tmp_path, fused):
    probs, enc, spec, model = _setup(tmp_path)
    N = spec.block_size
    ex = [enc.example(p) for p in probs[:3]]
    gen = torch.Generator().manual_seed(0)
    tokens, positions, mask, targets, lmask = TR.make_batch(ex, enc, N, gen, copies=2)
    L = max(-(-len(i) // N) * N for i, _ in ex)
    start = min(pl // N for _, pl in ex) * N
    C = L - N
    with torch.no_grad():
        if fused:  # the training-time fused attention computes the same as specfold's own
            with TR.fused_attention():
                out = model(tokens, positions, mask=mask, logits_at=torch.arange(C, tokens.shape[1]))
        else:
            out = model(tokens, positions, mask=mask, logits_at=torch.arange(C, tokens.shape[1]))
        span = L - start
        for b in range(len(ex)):
            for c in range(2):
                noisy = tokens[b, C + c * span: C + (c + 1) * span]
                for k in range(start // N, L // N):
                    seq = torch.cat([tokens[b, : k * N], noisy[k * N - start: (k + 1) * N - start]])
                    pos = torch.arange(seq.numel())
                    blk = pos // N
                    ref = model(seq[None], pos, mask=blk[:, None] >= blk[None, :],
                                logits_at=torch.arange(k * N, (k + 1) * N))[0]
                    got = out[b, c * span + k * N - start: c * span + (k + 1) * N - start]
                    torch.testing.assert_close(got, ref)
    # prompt positions are never masked; answer positions are
    for b, (ids, pl) in enumerate(ex):
        assert not lmask[b, : pl - start].any()
    assert lmask.any()


def test_token_weighted_loss(tmp_path):
    """`loss_fn(..., token_weight)`: all-ones weights give the plain mean; otherwise the mean of the
    per-target cross entropies weighted by their token's weight (computed here independently)."""
    import torch.nn.functional as F
    probs, enc, spec, model = _setup(tmp_path)
    batch = TR.make_batch([enc.example(p) for p in probs[:4]], enc, spec.block_size, torch.Generator().manual_seed(0))
    plain, _ = TR.loss_fn(model, batch, False)
    ones, _ = TR.loss_fn(model, batch, False, torch.ones(spec.vocab_size))
    assert torch.allclose(plain, ones, rtol=1e-6)
    w = torch.ones(spec.vocab_size)
    w[[enc.tok.vocab[str(d)] for d in range(10)]] = 4.0
    got, _ = TR.loss_fn(model, batch, False, w)
    tokens, positions, mask, targets, lmask = batch
    L = tokens.shape[1] - targets.shape[1]
    logits = model(tokens, positions, mask=mask, logits_at=torch.arange(L, tokens.shape[1])).float()[lmask]
    ce = F.cross_entropy(logits, targets[lmask], reduction="none")
    ww = w[targets[lmask]]
    assert (ww > 1).any() and torch.allclose(got, (ce * ww).sum() / ww.sum(), rtol=1e-6)
    assert not torch.allclose(got, plain)
