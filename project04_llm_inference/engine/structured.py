"""Structured output with xgrammar: a request's constraint (`StructuredOutputsParams`) compiled
once into a grammar over the model's vocabulary, a matcher per request that follows its
committed tokens, and the token bitmask applied to the logits in the sampler.

Where each part runs, and why:
- Compiling (`Grammars.compile`) happens when a request arrives: the server does it in its
  tokenizer threads, so a bad schema is answered 400 before the engine sees it.
- The matcher advances in `LLMEngine.update_from_output`, the one commit path, with the kept
  tokens only: a token dropped after a stop, or by an abort, never reaches it.
- The mask is filled on the host per constrained row (one bit per token; several rows in
  parallel by xgrammar's thread pool), copied to the logits' device and applied there by xgrammar's kernel
  (`apply_token_bitmask_inplace`), inside `sampler.sample`, to the rows of constrained requests
  only: free requests in the same batch are untouched. Under CUDA graphs the mask is applied to
  the logits the graph's forward wrote (a gathered copy), outside the graph.
- A matcher whose grammar has ended (it took a stop token) constrains nothing more: with
  `ignore_eos` the request then goes on free.

xgrammar is an optional extra (`structured`): where it is missing, a request that asks for
structured output is refused with one line naming the extra.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch

from ..config import StructuredOutputsParams

MISSING = (
    "structured_outputs: structured output needs the xgrammar package "
    "(pip install 'ai-infra-capstones[structured]'), which is not installed"
)


class GrammarError(ValueError):
    """A constraint that cannot be compiled (its message names the field)."""


def available() -> bool:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


def _xgr():
    try:
        import xgrammar
    except ImportError:
        raise GrammarError(MISSING) from None
    return xgrammar


def tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: list[int]):
    """xgrammar's view of the tokenizer: each id's token as stored in tokenizer.json, and how
    those strings map to bytes (byte-level BPE, byte fallback or raw), read from the same file.
    Ids past the tokenizer's own (a padded embedding) are never allowed."""
    xgr = _xgr()
    backend = tokenizer.path.read_text()
    vocab = tokenizer._tok.get_vocab(with_added_tokens=True)
    encoded = [""] * min(max(vocab.values(), default=-1) + 1, vocab_size)
    for tok, i in vocab.items():
        if i < len(encoded):
            encoded[i] = tok
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend)
    return xgr.TokenizerInfo(
        encoded,
        meta["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=sorted(stop_token_ids),
        add_prefix_space=meta["add_prefix_space"],
    )


class Grammars:
    """The compiler of one model's constraints (created on first use, thread-safe: xgrammar's
    compiler caches compiled grammars and may be called from several threads)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler = None

    def _get_compiler(self):
        if self._compiler is None:
            if self.tokenizer is None:
                raise GrammarError(
                    "structured_outputs: structured output needs the model folder's tokenizer.json"
                )
            xgr = _xgr()
            info = tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def compile(self, spec: StructuredOutputsParams, field: str = "structured_outputs"):
        """The compiled grammar of spec; a GrammarError naming `field` if it does not compile."""
        if spec.compiled is not None:
            return spec.compiled
        c = self._get_compiler()
        try:
            if spec.json is not None:
                schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
                # compact JSON: no free whitespace, which a weak model would repeat forever
                g = c.compile_json_schema(schema, any_whitespace=False)
            elif spec.json_object:
                g = c.compile_json_schema('{"type": "object"}', any_whitespace=False)
            elif spec.regex is not None:
                g = c.compile_regex(spec.regex)
            elif spec.grammar is not None:
                g = c.compile_grammar(spec.grammar)
            else:
                alts = " | ".join(json.dumps(x) for x in spec.choice)
                g = c.compile_grammar(f"root ::= {alts}")
        except GrammarError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError / ValueError with its reason
            # its messages open with "[time] source.cc:line: "
            why = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
            raise GrammarError(f"{field}: does not compile: {why[:300]}") from None
        spec.compiled = g
        return g

    def matcher(self, spec: StructuredOutputsParams) -> Matcher:
        xgr = _xgr()
        return Matcher(xgr.GrammarMatcher(self.compile(spec)))


@dataclass
class Matcher:
    """One request's grammar state: the tokens it has committed so far."""

    m: object  # xgrammar.GrammarMatcher

    @property
    def active(self) -> bool:
        return not self.m.is_terminated()

    def accept(self, token: int) -> None:
        if self.active and not self.m.accept_token(token):
            # the mask allowed only tokens the grammar takes: this is a bug, not bad input
            raise RuntimeError(f"token {token} was sampled against its request's grammar")


_BATCH = None  # xgrammar's batch filler (its thread pool), made on first use


def _batch_matcher(xgr):
    global _BATCH
    if _BATCH is None:
        _BATCH = xgr.BatchGrammarMatcher()
    return _BATCH


def apply_grammar_masks(logits: torch.Tensor, matchers: list[Matcher | None]) -> None:
    """Mask, in place, the tokens each constrained row's grammar forbids. logits (N, V) float32
    on its device; matchers[i] is row i's (None: a free row, untouched)."""
    rows = [i for i, m in enumerate(matchers) if m is not None and m.active]
    if not rows:
        return
    xgr = _xgr()
    n, v = logits.shape
    bitmask = xgr.allocate_token_bitmask(n, v)  # (N, ceil(V / 32)) int32, all allowed
    if len(rows) == 1:
        matchers[rows[0]].m.fill_next_token_bitmask(bitmask, rows[0])
    else:  # the rows filled by xgrammar's thread pool
        _batch_matcher(xgr).batch_fill_next_token_bitmask(
            [matchers[i].m for i in rows], bitmask, rows
        )
    if logits.device.type == "cuda":
        bitmask = bitmask.pin_memory().to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
