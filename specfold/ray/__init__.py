"""specfold on Ray: engine replicas on Ray Serve and batch inference on Ray Data.

    from ray import serve
    from specfold.ray import SpecfoldLLMConfig, build_openai_app
    app = build_openai_app(SpecfoldLLMConfig(model_source="tiny", num_replicas=2, num_cpus=1))
    serve.run(app, name="specfold", route_prefix="/")     # the OpenAI API of `specfold serve`

    import ray
    from specfold.ray import SpecfoldProcessorConfig, build_processor
    processor = build_processor(SpecfoldProcessorConfig(model_source="tiny", concurrency=2),
                                preprocess=lambda row: {"prompt": row["question"]},
                                postprocess=lambda row: {"answer": row["generated_text"], **row})
    rows = processor(ray.data.from_items([{"question": "..."}])).take_all()

Rooms: config.py (plain data, no ray), cluster.py (connect or start a cluster), replica.py (the
engine deployment), ingress.py (serve/app.py's FastAPI app over the replicas), data.py (Ray Data),
cli.py (the flags of `specfold serve/eval/bench`). This package sits above api and serve; nothing
below imports it, and `ray` is imported only inside these functions and the replica/ingress/data
modules they load, so the core install never needs it (the `ray` extra: `pip install 'specfold[ray]'`).
"""
from __future__ import annotations

from specfold.extras import require
from specfold.ray.config import EngineSpec, SpecfoldLLMConfig, SpecfoldProcessorConfig

__all__ = ["SpecfoldLLMConfig", "SpecfoldProcessorConfig", "EngineSpec", "build_openai_app",
           "build_llm_deployment", "build_processor"]


def build_openai_app(config: SpecfoldLLMConfig):
    """A Ray Serve application: the OpenAI-compatible ingress over `config`'s engine replicas."""
    require("ray", "specfold.ray.build_openai_app")
    from specfold.ray.ingress import build_openai_app as build
    return build(config)


def build_llm_deployment(config: SpecfoldLLMConfig, report_to: str | None = None):
    """The engine replicas alone, as a bound deployment for the user's own Serve application; its
    `generate(items)` streams like replica.py says. `report_to`: a deployment of the same application
    with a `report(dict)` method that receives each replica's state."""
    require("ray", "specfold.ray.build_llm_deployment")
    from specfold.ray.ingress import build_llm_deployment as build
    return build(config, report_to)


def build_processor(config: SpecfoldProcessorConfig, preprocess=None, postprocess=None):
    """A Ray Data processor: `processor(dataset)` adds the generated columns (see data.py)."""
    require("ray", "specfold.ray.build_processor")
    from specfold.ray.data import build_processor as build
    return build(config, preprocess, postprocess)
