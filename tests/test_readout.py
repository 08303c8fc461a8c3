"""`read_rows`, the device read every rule decides from, against a naive float64 softmax: the
argmax with the mask token excluded (first index on ties) and its probability, with and without
`owned` (in-place masking), for every confidence kind's common layout."""
import torch

from specfold.decoding.readout import Read, read_rows, split_rows

M = 3


def _naive(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    lg = logits.double().clone()
    lg[:, M] = float("-inf")
    p = torch.softmax(lg, -1)
    toks = [max(range(lg.shape[1]), key=lambda j: (lg[i, j].item(), -j)) for i in range(lg.shape[0])]
    return toks, [p[i, t].item() for i, t in enumerate(toks)]


def _logits(dtype):
    g = torch.Generator().manual_seed(0)
    lg = torch.randn(7, 50, generator=g, dtype=dtype)
    lg[0, M] = 50.0  # the mask token would win: it is excluded
    lg[1, 9] = lg[1, 4] = 40.0  # a tie: the lower id
    lg[2] = 0.0  # a flat row: id 0, probability 1/49
    return lg


def test_common_read_matches_a_naive_softmax_and_keeps_the_callers_logits():
    for dtype in (torch.float32, torch.float64):
        lg = _logits(dtype)
        before = lg.clone()
        out = read_rows(lg, M, Read())
        assert torch.equal(lg, before)  # not owned: the caller's logits stay
        rows = split_rows(out.reshape(-1).tolist(), lg.shape[0], Read())
        toks, conf = _naive(lg)
        assert [r.token for r in rows] == toks and toks[:3] == [toks[0], 4, 0] and toks[0] != M
        tol = 1e-6 if dtype == torch.float32 else 1e-12
        assert all(abs(r.conf - c) <= tol for r, c in zip(rows, conf))
        assert all(r.token_t == r.token and r.conf_t == r.conf and r.top is None for r in rows)


def test_owned_read_equals_the_copying_one_bit_for_bit():
    for dtype in (torch.float32, torch.float64):
        lg = _logits(dtype)
        a = read_rows(lg, M, Read())
        b = read_rows(lg.clone(), M, Read(), owned=True)
        assert torch.equal(a, b)
        # the general layout (top-k ids) agrees with the common one on token and confidence
        c = read_rows(lg, M, Read(topk=2))
        assert torch.equal(c[:, :2], a)
