"""diffusers' LLaDA2Pipeline + BlockRefinementScheduler driven by specfold's own model (test-only).

The adapter is the model call the pipeline makes, `model(x, attention_mask=..., position_ids=...)`
-> `.logits`, over the sequence [0, block end) with no cache. It differs from a plain call in two
deliberate ways, both the official `generate` semantics (docs/LLADA2.md):
- attention is block-causal from position 0, built here from the positions. The pipeline passes a
  2D mask that is 0 past prompt + gen_length; the official code attends to those positions (the
  last block is decoded in full under the block mask alone), so the adapter only checks that the
  mask covers [0, prompt + gen_length);
- the mask token's logit is -inf (specfold's readout, SPEC §4: the mask token is never produced).
"""
from __future__ import annotations

import torch


class _Out:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


class SpecfoldAdapter(torch.nn.Module):
    def __init__(self, model, block: int, mask_id: int):
        super().__init__()
        self.model, self.block, self.mask_id = model, block, mask_id
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        pos = position_ids[0]
        assert torch.equal(pos, torch.arange(input_ids.shape[1])), "positions start at 0"
        limit = int(attention_mask[0].sum())
        assert bool(attention_mask[0, :limit].all()), "the 2D mask covers [0, prompt + gen_length)"
        blk = torch.div(pos, self.block, rounding_mode="floor")
        logits = self.model(input_ids, pos, mask=blk[:, None] >= blk[None, :]).clone()
        logits[..., self.mask_id] = float("-inf")
        self.calls += 1
        return _Out(logits)


def diffusers_decode(model, prompt: list[int], *, mask_id: int, eos_id: int, block: int, gen_length: int,
                     steps: int, threshold: float, editing_threshold: float | None, max_post_steps: int,
                     eos_early_stop: bool) -> tuple[list[int], int]:
    """Generated ids cut before the first eos, and the number of model calls."""
    from diffusers import BlockRefinementScheduler, LLaDA2Pipeline
    adapter = SpecfoldAdapter(model, block, mask_id)
    pipe = LLaDA2Pipeline(model=adapter, scheduler=BlockRefinementScheduler(block_length=block), tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(input_ids=torch.tensor([prompt]), use_chat_template=False, gen_length=gen_length,
               block_length=block, num_inference_steps=steps, temperature=0.0, threshold=threshold,
               editing_threshold=editing_threshold, max_post_steps=max_post_steps, eos_early_stop=eos_early_stop,
               eos_token_id=eos_id, mask_token_id=mask_id, output_type="seq")
    seq = out.sequences[0].tolist()
    return (seq[: seq.index(eos_id)] if eos_id in seq else seq), adapter.calls
