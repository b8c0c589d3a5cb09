"""Domain-agnostic world models (LLM outcome predictors, learned regressors, latent dynamics)."""
