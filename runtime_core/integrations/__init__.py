"""Integrations with distributed engines; each submodule imports its engine lazily (an extra)."""
