"""Built-in model families: each module registers :class:`kvcore.ModelFamily` objects through
``kvcore_register_model_families``.

- :mod:`.kit`: the family kit, public API for plugin authors (typed config reads whose errors
  name the field, attention geometry, layer types and names, SSM state shapes);
- :mod:`.attention_only`: one table of the families whose layers are all attention (Llama,
  Mistral, Qwen 2/3, Phi-3, Gemma 2/3, Laguna, gpt-oss);
- :mod:`.llama4`, :mod:`.deepseek`, :mod:`.jamba`, :mod:`.nemotron_h`, :mod:`.mamba` (Mamba-1,
  Mamba-2, GraniteMoeHybrid, Falcon-H1, Zamba2), :mod:`.qwen3_next` (Qwen3-Next, Qwen3.5),
  :mod:`.gemma4`, :mod:`.gemma3n`, :mod:`.kimi_linear`, :mod:`.whisper`, :mod:`.mllama`: the
  families that read their layers their own way;
- :mod:`.refused`: model types kvcore refuses by name, with the reason;
- :mod:`.generic`: the fallback that honours ``layer_types`` for model types no family claims.

Writing a new family is shown in ``docs/how-to/add-a-model-family.md``.
"""
