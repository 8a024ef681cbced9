"""scoring-worker: exact, fast tree-ensemble scoring for Kafka streams of Arrow batches."""

from .model.artifact import ArtifactError
from .model.compile import compile_model
from .model.compiled import CompiledModel, load_model
from .model.ir import UnsupportedModelError
from .model.result import ScoreResult

__all__ = ["ArtifactError", "CompiledModel", "ScoreResult", "UnsupportedModelError",
           "compile_model", "load_model"]
__version__ = "0.1.0"
