"""Prompt-injection / jailbreak classifier: data, honest evaluation, (later) training and runtime."""
