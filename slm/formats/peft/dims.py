"""The base dimensions (H, Q, KV, F, V; slm.arch.roles) of a PEFT adapter's targets.

A PEFT file does not say the shape of every weight it modifies: an IA3 vector gives only one
of (out, in), and SHiRA stores r * (out + in) values whose (row, column) indices need `in` to
become flat positions. Two ways to settle them:

  * `from_base`: the base's own tensor shapes (what `slm import adapter --base NAME` passes).
    Every shape the adapter reveals is checked against the base's; nothing is guessed.
  * `solve`: from the adapter alone. Each module's known dimensions are pooled by name (a
    Llama attn_q's in is H, its out Q, ...), SHiRA's sums propagate them, and when the sums
    leave one degree of freedom a square attn_q (num_heads * head_dim == hidden_size) is
    assumed; the hidden size that yields goes into the manifest's `requires`, so a base that
    breaks the assumption fails the hidden-size check at activation.
"""

from __future__ import annotations

from typing import Mapping

from slm.arch.roles import DIM_WORDS, LINEAR_ROLES, linear_role
from slm.errors import Incompatible, InvalidInput
from slm.formats.peft.tensors import Pending


class Dims:
    """The base's sizes (H, Q, KV, F, V) as far as they are known."""

    def __init__(self, fname: str):
        self.fname = fname
        self.values: dict[str, int] = {}
        self.source: dict[str, str] = {}

    def set(self, var: str, value: int, source: str) -> bool:
        if value <= 0:
            raise InvalidInput(f"{self.fname}: {source} implies a {DIM_WORDS[var]} of {value}")
        if var in self.values:
            if self.values[var] != value:
                raise InvalidInput(
                    f"{self.fname}: inconsistent shapes: {self.source[var]} gives a "
                    f"{DIM_WORDS[var]} of {self.values[var]}, {source} gives {value}"
                )
            return False
        self.values[var], self.source[var] = value, source
        return True

    def solve(self, pending: list[Pending]) -> None:
        sums = []
        for t in pending:
            out_var, in_var = LINEAR_ROLES[linear_role(t.name)]
            if t.out is not None:
                self.set(out_var, t.out, t.module)
            if t.inp is not None:
                self.set(in_var, t.inp, t.module)
            if t.dim_sum is not None:
                sums.append((out_var, in_var, t.dim_sum, t.module))
        self._propagate(sums)
        if any(t.dim_sum is not None and LINEAR_ROLES[linear_role(t.name)][1] not in self.values
               for t in pending):
            # The sums leave one degree of freedom; Llama checkpoints have a square attn_q.
            for out_var, in_var, total, module in sums:
                if {out_var, in_var} == {"Q", "H"} and "H" not in self.values and "Q" not in self.values:
                    if total % 2:
                        raise InvalidInput(f"{self.fname}: {module} has an odd out + in = {total}; "
                                           f"cannot infer the hidden size (pass the base's shapes)")
                    self.set("H", total // 2, f"{module} (assuming num_heads * head_dim == hidden_size)")
                    self.set("Q", total // 2, f"{module} (assuming a square attn_q)")
                    break
            self._propagate(sums)
        for t in pending:
            in_var = LINEAR_ROLES[linear_role(t.name)][1]
            if t.dim_sum is not None and in_var not in self.values:
                raise InvalidInput(
                    f"{self.fname}: cannot tell the shape of {t.module} from the adapter alone "
                    f"(SHiRA without attn_q/attn_output); pass the base's tensor shapes"
                )

    def _propagate(self, sums) -> None:
        changed = True
        while changed:
            changed = False
            for out_var, in_var, total, module in sums:
                if out_var in self.values and in_var not in self.values:
                    changed |= self.set(in_var, total - self.values[out_var], module)
                elif in_var in self.values and out_var not in self.values:
                    changed |= self.set(out_var, total - self.values[in_var], module)
                elif out_var in self.values and in_var in self.values:
                    if self.values[out_var] + self.values[in_var] != total:
                        raise InvalidInput(
                            f"{self.fname}: {module} holds {total} * r SHiRA values, but its shape "
                            f"is ({self.values[out_var]}, {self.values[in_var]})"
                        )

    def fix_from_base(self, t: Pending, base_shapes: Mapping[str, tuple[int, int]]) -> None:
        shape = base_shapes.get(t.name)
        if shape is None or len(shape) != 2:
            raise Incompatible(f"{self.fname}: the base has no linear weight {t.name} for {t.module}")
        out, inp = int(shape[0]), int(shape[1])
        if (t.out is not None and t.out != out) or (t.inp is not None and t.inp != inp) or (
                t.dim_sum is not None and t.dim_sum != out + inp):
            got = (t.out, t.inp) if t.dim_sum is None else f"out + in = {t.dim_sum}"
            raise Incompatible(f"{self.fname}: {t.module} does not fit the base's {t.name} "
                               f"{(out, inp)} (adapter has {got})")
        t.out, t.inp = out, inp
        out_var, in_var = LINEAR_ROLES[linear_role(t.name)]
        self.set(out_var, out, t.name)
        self.set(in_var, inp, t.name)


def from_base(pending: list[Pending], base_shapes: Mapping[str, tuple[int, ...]], fname: str) -> Dims:
    dims = Dims(fname)
    for t in pending:
        dims.fix_from_base(t, base_shapes)
    return dims


def solve(pending: list[Pending], fname: str) -> Dims:
    dims = Dims(fname)
    dims.solve(pending)
    return dims
