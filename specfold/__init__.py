"""specfold: fast, lossless decoding for masked diffusion language models.

    from specfold import LLM, DecodeParams
    out = LLM("tiny").generate(["Tom has 3 apples ..."], DecodeParams(chat_template=True))[0]
    print(out.text, out.stats.nfe, out.stats.tokens_per_forward)
"""
from specfold.api import LLM
from specfold.engine.engine import Engine, RequestDelta
from specfold.outputs import DecodeStats, RequestOutput
from specfold.params import DecodeParams, EngineConfig, SamplingParams

__all__ = ["LLM", "DecodeParams", "EngineConfig", "SamplingParams", "Engine", "RequestDelta", "RequestOutput",
           "DecodeStats"]
__version__ = "0.1.0"
