"""Loading a runnable model (weights + overlays + tokenizer) from the store, read-only: a
Loaded is the slm.engine.target.Target that requests run on."""

from __future__ import annotations

from dataclasses import dataclass

from slm.compose.composition import Composition
from slm.compose.memory import Estimate
from slm.model.allocator import release_freed_memory
from slm.model.decoder import Config, Decoder
from slm.model.tokenizer import TextTokenizer, load_tokenizer
from slm.model.weights import load_tensors
from slm.ops.infer import compositions
from slm.ops.ship import policy
from slm.ops.infer.compositions import Staged
from slm.store import StoreDir


@dataclass
class Loaded:
    composition: Composition
    staged: Staged
    model: Decoder
    tokenizer: TextTokenizer

    @property
    def id(self) -> str:
        return self.composition.id

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: token ids are below it."""
        return self.model.cfg.vocab_size

    @property
    def context_length(self) -> int:
        """The model's context: the positions a prompt and its answer share."""
        return self.model.cfg.context_length

    def memory_estimate(self, positions: int, prompt_tokens: int, sequences: int = 1, all_logits: bool = False,
                        mode: str | None = None) -> Estimate:
        """slm.engine.target.Target's: the estimate `slm activate` checks, for a generation."""
        from slm.ops.infer import budget

        return budget.of_staged(self.staged, positions, prompt_tokens, all_logits, sequences, mode)


def load_composition(store: StoreDir, comp: Composition, verify: bool = True) -> Loaded:
    """Stage (validate, re-hash every blob) and build the executor over memory-mapped blobs.

    The one place weights are loaded to run (slm run, with or without --base; the API's
    Runtime and sessions; the server; verify's numerics), so the store's signing policy is
    enforced here, before a blob is read: no path to inference can skip it."""
    policy.enforce(store, comp)
    staged = compositions.stage(store, comp, verify_base=verify)
    base = staged.base
    tokenizer = load_tokenizer(store.objects.read_verified(base.tokenizer_digest))
    tensors = load_tensors(base.tensors, store.objects.map)
    cfg = Config.from_architecture(base.architecture, base.qk_row_layout)
    loaded = Loaded(comp, staged, Decoder(cfg, tensors, overlays=staged.overlays), tokenizer)
    # Building a tokenizer parses its vocabulary into Python objects and hands it to the Rust
    # library, then frees the Python side: at 128k tokens tens of MB that the C heap keeps
    # (slm run asks it to keep freed blocks for prompts: slm.model.allocator) and nothing reuses.
    # Given back before the weights' pages come in: peak RSS is the mapped file plus what is
    # live, not plus what the loading left behind.
    release_freed_memory()
    return loaded


def load_base_model(store: StoreDir, ref: str, verify: bool = True) -> Loaded:
    """The base alone (the composition with no adapters)."""
    return load_composition(store, compositions.build(store, ref, []), verify)
