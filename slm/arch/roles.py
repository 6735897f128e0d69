"""The linear layers an adapter may modify, by role, and what their shapes say about a base.

Shared by every adapter reader (PEFT, GGUF LoRA) and by whatever re-orders q/k rows (the
overlays, the oracle): one table, so that a role added here is known to all of them.

A role is the part of slm's tensor name between the layer number and ".weight":
"blk.3.attn_q.weight" has the role "attn_q"; the output projection "output.weight" has the
role "output". Dimensions are named by the base's sizes: H hidden, Q = num_heads * head_dim,
KV = num_kv_heads * head_dim, F intermediate, V vocabulary.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Protocol

# role -> (out, in) dimensions of its weight, in NumPy order
LINEAR_ROLES: dict[str, tuple[str, str]] = {
    "attn_q": ("Q", "H"), "attn_k": ("KV", "H"), "attn_v": ("KV", "H"), "attn_output": ("H", "Q"),
    "ffn_gate": ("F", "H"), "ffn_up": ("F", "H"), "ffn_down": ("H", "F"), "output": ("V", "H"),
}
ROLE_ORDER = list(LINEAR_ROLES)
# the dimensions that are one architecture field each (Q and KV are products of two)
DIM_FIELDS = {"H": "hidden_size", "F": "intermediate_size", "V": "vocab_size"}
DIM_WORDS = {"H": "hidden size", "Q": "query width (num_heads * head_dim)",
             "KV": "key/value width (num_kv_heads * head_dim)", "F": "intermediate size",
             "V": "vocabulary size"}
_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


class Shaped(Protocol):
    module: str
    out_features: int
    in_features: int


def linear_role(name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'attn_q', 'output.weight' -> 'output'; None if not a linear
    layer slm can put an adapter on."""
    if name == "output.weight":
        return "output"
    m = _NAME.fullmatch(name)
    if m and m.group(2) in LINEAR_ROLES:
        return m.group(2)
    return None


def target_order(name: str) -> tuple[int, int]:
    """Sort key of adapter targets: by layer, then by role in the block's order."""
    m = _NAME.fullmatch(name)
    role = linear_role(name)
    layer = int(m.group(1)) if m else 1 << 30
    return layer, ROLE_ORDER.index(role) if role else len(ROLE_ORDER)


def qk_heads(arch: Mapping[str, Any]) -> dict[str, int]:
    """The roles whose output rows are grouped by attention head, with their head counts: what
    a q/k row re-ordering between layouts (slm.arch.QK_LAYOUTS) needs to know."""
    return {"attn_q": arch["num_heads"], "attn_k": arch["num_kv_heads"]}


def requires_from_shapes(targets: Iterable[Shaped], family: str | None = None) -> dict[str, Any]:
    """What fully-shaped targets say of their base: the sizes they reveal (hidden_size,
    intermediate_size, vocab_size), and the family if the file names one."""
    found: dict[str, int] = {}
    for t in targets:
        out_var, in_var = LINEAR_ROLES[linear_role(t.module)]
        for var, value in ((out_var, t.out_features), (in_var, t.in_features)):
            if var in DIM_FIELDS:
                found.setdefault(var, value)
    requires: dict[str, Any] = {} if family is None else {"family": family}
    for var, field_name in DIM_FIELDS.items():
        if var in found:
            requires[field_name] = found[var]
    return requires
