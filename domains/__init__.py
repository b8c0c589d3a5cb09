"""Domains: each is a file of subclasses of the four core interfaces plus one registration."""
