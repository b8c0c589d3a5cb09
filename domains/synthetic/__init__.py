"""Synthetic domains with known true rewards and controllable world-model bias and noise."""
