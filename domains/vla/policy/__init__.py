"""VLA policies in lerobot's layout (a configuration / modeling pair) and their wmrl.Policy adapters."""
