"""Classifiers used by filters (prompt-injection model runtime lives here)."""
