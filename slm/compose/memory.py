"""The peak-memory estimate of running a composition (the seed's formulas, made concrete).

    P = (O + B + A + D + R + KV) * (1 + slack)
      O   runtime: the interpreter and libraries (+8 MiB with the fused C kernels: their second
          prefill scratch buffer and threads), plus
          the tokenizer (~300 bytes per vocabulary entry: more for a byte-level BPE with its
          merges, less for SentencePiece pieces)
      B   base bytes: every quantized blob is memory-mapped and read once per token
      A   adapters: their float32 tensors, 1.5 times (the bytes read, and the overlay copies made
          from them while they are still held); in the int8 mode 0.4x more, its copies of a
          LoRA's factors (slm.model.int8_factors: A as Q8_0, 0.27 of its bytes, B^T as halves),
          which the exact mode never builds
      D   dequantization scratch: bounded, allocated once (slm.model.kernels)
      R   activations for a prefill of T tokens over S positions:
          4 bytes x T x (6 hidden + 4 ffn + 3 heads x S), plus T x vocab when all logits are kept
      KV  the KV cache: 2 x kv_heads x head_dim x 4 bytes per position a layer keeps: S for a
          full-attention layer, at most its window for a sliding one (slm.model.decoder.KVCache);
          one per sequence of a request (a server's n choices: n caches, n logits rows a step)
The constants come from peak RSS of `slm run` (docs/numerics.md, "Memory", has the figures);
the slack covers the allocator and NumPy temporaries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slm import arch as archs
from slm.errors import InvalidInput

RUNTIME_BYTES = 50 << 20
FUSED_KERNEL_BYTES = 8 << 20  # a second 4 MiB scratch, OpenMP and prefill threads
TOKENIZER_BYTES_PER_TOKEN = 300
SCRATCH_BYTES = 4 << 20
ADAPTER_COPIES = 1.5  # peak bytes per float32 adapter byte (A above)
INT8_FACTOR_COPIES = 0.4  # and in the int8 mode, its copies of the LoRA factors
SLACK = 0.10
DEFAULT_POSITIONS = 512  # what `slm activate` plans for: a 512-token prompt + generation


@dataclass(frozen=True)
class Estimate:
    runtime: int
    base: int
    adapters: int
    scratch: int
    activations: int
    kv_cache: int
    positions: int

    @property
    def total(self) -> int:
        parts = self.runtime + self.base + self.adapters + self.scratch + self.activations + self.kv_cache
        return int(parts * (1 + SLACK))

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "total": self.total}

    def describe(self) -> str:
        mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
        return (f"{mib(self.total)} = (runtime {mib(self.runtime)} + base {mib(self.base)} + adapters "
                f"{mib(self.adapters)} + scratch {mib(self.scratch)} + activations "
                f"{mib(self.activations)} + KV cache {mib(self.kv_cache)}) x {1 + SLACK:g}")


def estimate(arch: dict, base_bytes: int, adapter_float_bytes: int, positions: int,
             prompt_tokens: int | None = None, all_logits: bool = False,
             fused_kernels: bool = False, sequences: int = 1, int8_factors: bool = False) -> Estimate:
    """int8_factors: the composition runs in the int8 mode, which holds its own copies of the
    LoRA factors. sequences: how many sequences of `positions` one request runs at once (a server's n
    choices): each has its own KV cache and its own logits row a step; the prompt is
    prefilled once at a time."""
    T = prompt_tokens if prompt_tokens is not None else positions
    h, f, v = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    per_token = 6 * h + 4 * f + 3 * arch["num_heads"] * positions + (v if all_logits else 0)
    hp = archs.hyperparameters(arch)
    kept = sum(min(positions, hp["sliding_window"]) if kind == "sliding_attention" else positions
               for kind in hp["layer_types"])  # positions cached, over all layers
    return Estimate(
        runtime=RUNTIME_BYTES + (FUSED_KERNEL_BYTES if fused_kernels else 0) + TOKENIZER_BYTES_PER_TOKEN * v,
        base=base_bytes,
        adapters=int((ADAPTER_COPIES + (INT8_FACTOR_COPIES if int8_factors else 0)) * adapter_float_bytes),
        scratch=SCRATCH_BYTES,
        activations=4 * T * per_token + 4 * v * sequences,
        kv_cache=2 * kept * arch["num_kv_heads"] * arch["head_dim"] * 4 * sequences,
        positions=positions,
    )


# ASCII only: without re.ASCII, \d matches any Unicode digit and float() reads it
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*", re.IGNORECASE | re.ASCII)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """'512M', '2G', '1.5GiB', '300000000' -> bytes (binary units)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise InvalidInput(f"memory budget {text!r} is not a size (e.g. 512M, 2G)")
    unit = (m.group(2) or "").lower().replace("i", "").replace("b", "") or ""
    return int(float(m.group(1)) * _UNITS[unit])
