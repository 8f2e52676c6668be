"""The command-line interfaces `mkb-run` and `mkb-analyze` (thin: they parse and call the library)."""
