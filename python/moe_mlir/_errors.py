"""Exceptions of moe_mlir."""


class MLIRError(RuntimeError):
    """An MLIR operation failed; the message holds its diagnostics
    (location: severity: text), one per line."""


class RuntimeCallError(RuntimeError):
    """libmoert reported an error in a call of a compiled program or of the
    runtime itself (a failed GPU call, a collective that failed or timed
    out); the message is the runtime's, naming the call and the rank."""
