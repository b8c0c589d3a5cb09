"""YAML configs shipped with wmrl (`wmrl train NAME` finds NAME.yaml here)."""
