"""Exceptions of moe_mlir."""


class MLIRError(RuntimeError):
    """An MLIR operation failed; the message holds its diagnostics
    (location: severity: text), one per line."""
