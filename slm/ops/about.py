"""`slm --version`: what this slm is, for a bug report or a fleet inventory."""

from __future__ import annotations


def version_info() -> dict:
    """slm's version, the runtime its compositions record (a manifest's runtime.version: what
    `slm activate --upgrade` rebuilds for), and the kernels: the C extension's build (the SIMD
    level it was compiled for), this CPU's SIMD features, and the numerics mode a run takes by
    default (docs/numerics.md)."""
    import slm
    from slm.compose.composition import RUNTIME
    from slm.model import kernel_choice, modes

    return {"version": slm.__version__, "runtime": dict(RUNTIME), "kernels": kernel_choice.build_info(),
            "mode": modes.resolve(False)}
