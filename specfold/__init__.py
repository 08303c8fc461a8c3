"""specfold: fast, lossless decoding for masked diffusion language models.

    from specfold import LLM, SamplingParams
    llm = LLM("tiny", method="spiffy")  # engine settings: EngineConfig's fields
    out = llm.generate(["Tom has 3 apples ..."], SamplingParams(chat_template=True))[0]
    print(out.text, out.stats.nfe, out.stats.tokens_per_forward)

The public names are imported on first use, so `import specfold.cli` (and `specfold --help`)
does not pay for importing torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specfold.api import LLM
    from specfold.engine.engine import Engine, RequestDelta
    from specfold.outputs import DecodeStats, RequestOutput
    from specfold.params import DecodeParams, EngineConfig, SamplingParams

_LAZY = {"LLM": "specfold.api", "DecodeParams": "specfold.params", "EngineConfig": "specfold.params",
         "SamplingParams": "specfold.params", "Engine": "specfold.engine.engine",
         "RequestDelta": "specfold.engine.engine", "RequestOutput": "specfold.outputs",
         "DecodeStats": "specfold.outputs"}

__all__ = ["LLM", "DecodeParams", "EngineConfig", "SamplingParams", "Engine", "RequestDelta", "RequestOutput",
           "DecodeStats"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specfold' has no attribute {name!r}")
