"""A CPU emulator of the CUDA device dialect for candidates at reduced shapes (emulator.py; CLI: __main__.py)."""
