"""The embodied domain: robosuite manipulation tasks with language, lerobot datasets, VLA policies."""
