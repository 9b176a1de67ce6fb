"""Families kvcore knows and refuses to plan, each with the reason: a refusal by name instead of
a wrong plan.

These model types ship in transformers 5.24 and vLLM 0.32 registers their architectures, but
their caches hold something kvcore's spec kinds cannot say yet. Without a family of their own
some of them would be read by the generic fallback (their configs list ``layer_types``), which
would plan their attention as plain full or sliding layers of one geometry: a plan of the wrong
size. Each row below claims the model types and answers every config with a
:class:`~kvcore.errors.ModelConfigError` that names the model, what its cache holds (with the
engine code that says so) and what kvcore lacks. A plugin that does plan one of them replaces
the row by blocking this module (``KVCORE_BLOCK_PLUGINS=kvcore.plugins.models.refused``) and
registering its own family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.errors import ModelConfigError
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import family_hook
from kvcore.spec import KVCacheSpec


@attrs.frozen(kw_only=True)
class Refusal:
    """One refused family.

    Attributes:
        name: the family's name (``minimax_m3``).
        model: the model's name in messages (``MiniMax-M3 (sparse)``).
        model_types: the ``model_type`` values it claims.
        reason: what its cache holds that kvcore cannot plan, with the source.
        max_position_embeddings: the default of its transformers config class, so that a config
            that omits the field still has its length (:attr:`~kvcore.ModelFamily.config_defaults`).
    """

    name: str
    model: str
    model_types: tuple[str, ...]
    reason: str
    max_position_embeddings: int

    def layer_specs(self, config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
        """Refuse ``config``.

        Raises:
            ModelConfigError: always, naming the model and the reason.
        """
        raise ModelConfigError(
            f"{config.get('model_type')} config: kvcore does not plan {self.model} models yet: "
            f"{self.reason}. Planning it as plain attention would size the cache wrongly, so kvcore "
            "refuses it; a model-family plugin that knows these caches can replace this refusal "
            "(KVCORE_BLOCK_PLUGINS=kvcore.plugins.models.refused, docs/how-to/add-a-model-family.md)"
        )

    def family(self) -> ModelFamily:
        """The refusal as a :class:`~kvcore.ModelFamily`."""
        defaults = {t: {"max_position_embeddings": self.max_position_embeddings} for t in self.model_types}
        return ModelFamily(
            name=self.name,
            model_types=self.model_types,
            layer_specs=self.layer_specs,
            config_defaults=defaults,
        )


#: The refused families (``docs/reference/models.md`` has the same list). Each
#: ``max_position_embeddings`` is the default of the text config class in transformers 5.24.0:
#: minimax_m3_vl/configuration_minimax_m3_vl.py:89,
#: glm5_next/configuration_glm5_next.py:121, mimo_v2_flash/configuration_mimo_v2_flash.py:84,
#: step3p7/configuration_step3p7.py:152; the Gemma 4 assistant's text config is Gemma 4's.
REFUSED: tuple[Refusal, ...] = (
    Refusal(
        name="gemma4_assistant",
        max_position_embeddings=131_072,
        model="Gemma 4 assistant (drafter)",
        model_types=("gemma4_assistant", "gemma4_unified_assistant"),
        reason=(
            "every one of its layers reads the target model's keys and values "
            "(Gemma4AssistantConfig sets num_kv_shared_layers to num_hidden_layers), so it holds no "
            "cache of its own; plan the target Gemma 4 model instead"
        ),
    ),
    Refusal(
        name="minimax_m3",
        max_position_embeddings=524_288,
        model="MiniMax-M3 (sparse)",
        model_types=("minimax_m3_vl", "minimax_m3_vl_text", "minimax_m3_text"),
        reason=(
            "its 'minimax_m3_sparse' layers attend through a block-sparse Lightning indexer whose own "
            "key cache (index_n_heads, index_head_dim, index_block_size; transformers' "
            "MiniMaxM3VLTextConfig.sparse_attention_config) kvcore has no spec for"
        ),
    ),
    Refusal(
        name="glm5_next",
        max_position_embeddings=1_048_576,
        model="GLM-5 Next",
        model_types=("glm5_next", "glm5_next_text"),
        reason=(
            "it mixes Kimi-delta-attention state layers with 'indexed_attention' layers whose DSA "
            "indexer selects from pools of compressed token groups (transformers' "
            "Glm5NextTextConfig); kvcore has no spec for a compressed-pool cache"
        ),
    ),
    Refusal(
        name="mimo_v2",
        max_position_embeddings=131_072,
        model="MiMo-V2-Flash",
        model_types=("mimo_v2_flash",),
        reason=(
            "its keys and values have different head sizes (head_dim 192, v_head_dim 128; sliding "
            "layers swa_head_dim / swa_v_head_dim with swa_num_key_value_heads), which vLLM caches "
            "with head_size_v (vllm/model_executor/models/mimo_v2.py:304-338); kvcore's attention "
            "specs have one head size for keys and values"
        ),
    ),
    Refusal(
        name="step3p5",
        max_position_embeddings=128_000,
        model="Step-3.5",
        model_types=("step3p5", "step3p7"),
        reason=(
            "vLLM gives its sliding layers the KV heads and head size of 'attention_other_setting' "
            "(num_attention_groups, head_dim; vllm/model_executor/models/step3p5.py:412-440) and "
            "slides every even layer when layer_types is absent (step3p5.py:151-154), while "
            "transformers 5.24's Step3p7TextConfig (model type step3p5) takes only the query heads "
            "from it and makes every layer full when layer_types is absent; kvcore will not pick "
            "one of two disagreeing readings"
        ),
    ),
)

kvcore_register_model_families = family_hook(*(refusal.family() for refusal in REFUSED))
