import json


def test_plugins_lists_kinds_and_policies_with_origins(run_cli):
    status, out, _ = run_cli("plugins", "--json")
    assert status == 0
    data = json.loads(out)
    kinds = {k["kind"]: k for k in data["spec_kinds"]}
    assert set(kinds) >= {"full_attention", "sliding_window", "chunked_local_attention", "mla"}
    assert kinds["mla"]["plugin"] == "kvcore.plugins.mla"
    policies = {p["policy"]: p for p in data["policies"]}
    assert policies["shared_buffer"]["plugin"] == "kvcore.policies.shared_buffer"
    plugins = {p["name"]: p for p in data["plugins"]}
    assert plugins["kvcore.plugins.mla"]["hooks"] == [
        "kvcore_cache_layout",
        "kvcore_register_spec_kinds",
        "kvcore_register_spec_strategies",
    ]


def test_plugins_table_and_blocking(run_cli):
    status, out, _ = run_cli("--block-plugin", "kvcore.plugins.mla", "plugins")
    assert status == 0
    assert "sliding_window" in out and "kvcore.plugins.mla" not in out


def test_model_families_are_listed_with_their_model_types(run_cli):
    status, out, _ = run_cli("plugins", "--json")
    assert status == 0
    families = {f["family"]: f for f in json.loads(out)["model_families"]}
    assert families["deepseek"]["model_types"] == ["deepseek_v2", "deepseek_v3", "deepseek_v32"]
    assert families["generic"]["fallback"] and not families["llama"]["fallback"]
    status, out, _ = run_cli("plugins")
    assert "model families" in out and "qwen2, qwen3" in out
