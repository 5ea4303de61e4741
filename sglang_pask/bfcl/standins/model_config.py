"""Stand-in for ``bfcl_eval.constants.model_config``.

Why a stand-in: the real module imports the handler of every supported model, and with them every
provider SDK (openai, anthropic, mistral, google, cohere, ...), none of which is installed offline. The
AST checker only reads ``MODEL_CONFIG_MAPPING[model_name].underscore_to_dot`` (whether the model's
function names had ``.`` replaced by ``_``, true for some hosted APIs). Our answers keep the function
names exactly as documented, so every model name maps to ``underscore_to_dot = False``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """The only field of BFCL's model config that the AST checker reads.

    Attributes
    ----------
    underscore_to_dot : bool
        Whether the model's output replaced ``.`` in function names by ``_``.
    """

    underscore_to_dot: bool = False


class _AnyModelConfig(dict):
    """A mapping that answers ``ModelConfig(underscore_to_dot=False)`` for any model name."""

    def __missing__(self, key: str) -> ModelConfig:
        return ModelConfig(underscore_to_dot=False)


MODEL_CONFIG_MAPPING: dict[str, ModelConfig] = _AnyModelConfig()
