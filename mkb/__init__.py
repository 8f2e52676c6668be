"""MetaKernelBench: measures whether a skill learned in one GPU-kernel DSL helps in another."""

__version__ = "0.1.0"
