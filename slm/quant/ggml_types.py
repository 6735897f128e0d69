"""The one table of GGML tensor type ids and names (ggml.h, enum ggml_type).

Every id a GGUF file may carry, whether or not slm has a codec for it, so that a refusal can
name the type ("unsupported GGML tensor type IQ2_XXS (id 16)"). Ids 4, 5 and 31-33, 36-38
were types that ggml removed; they stay unnamed. Which of these slm can read or write is the
registry's business (registry.SUPPORTED_GGML_TYPES), not this table's.
"""

from __future__ import annotations

from enum import IntEnum


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


def ggml_type_label(type_id: int) -> str:
    """"IQ2_XXS (id 16)" for a known id, "unknown (id 99)" otherwise: for error messages."""
    try:
        return f"{GGMLType(int(type_id)).name} (id {int(type_id)})"
    except ValueError:
        return f"unknown (id {int(type_id)})"
