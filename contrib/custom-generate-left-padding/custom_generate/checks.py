"""Argument checks, imported relatively by generate.py (transformers copies this file along with it)."""


def check_left_padding(value):
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"left_padding must be an integer >= 0, got {value!r}")
