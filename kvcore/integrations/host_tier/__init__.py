"""The engines' host tiers: which flags set one in vLLM, SGLang and LMCache for a plan's tier,
and what each engine allocates for them (:mod:`kvcore.integrations.host_tier.flags`)."""
