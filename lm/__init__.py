"""The LM toolkit: what every causal-LM part of wmrl shares (policies, LLM world models, SFT)."""
