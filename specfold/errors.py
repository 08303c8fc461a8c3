"""Error types. Every user-facing failure is one of these, with a message that says what was wrong
and what is accepted."""


class SpecfoldError(ValueError):
    """Base class of specfold's user-facing errors."""


class CheckpointError(SpecfoldError):
    """A checkpoint folder is missing, incomplete or malformed."""


class ConfigError(SpecfoldError):
    """A model configuration cannot be resolved (unknown model_type, missing mask id, ...)."""


class ParamsError(SpecfoldError):
    """Decode parameters that cannot be satisfied."""


class EngineFull(SpecfoldError):
    """The engine runs and queues as many requests as it may; retry later (the server answers 429)."""


class DistributedError(SpecfoldError):
    """A tensor-parallel rank died or a collective timed out: the request set is ended (the server
    answers 503 and /health says what failed)."""
