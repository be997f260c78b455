"""When a sequence stops: stop tokens and EOS, stop strings, max_tokens and max_model_len.

`StopChecker.check` runs after every appended token, so its work per token must not grow with
the output. Stop strings are searched incrementally: the output is detokenized a few tokens at a
time (`TextTail`: the text of the tokens since the last complete character, as incremental
detokenizers do, so a multi-byte character split across tokens is only read once complete), and
only the last `max stop length - 1` characters before the new text, plus the new text, are
searched: any match that ends in older text would have been found when that text was new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence


@dataclass
class TextTail:
    """A sequence's output text, decoded incrementally."""

    pieces: list[str] = field(default_factory=list)  # the text so far, in pieces (joined once)
    num_chars: int = 0
    tail: str = ""  # the last characters of the text (what the next search may overlap)
    prefix_offset: int = 0  # tokens before this are decoded into `pieces` for good
    read_offset: int = 0  # tokens before this are in `pieces`

    def advance(self, tokenizer, ids: list[int]) -> str:
        """The text of ids[read_offset:] appended (empty while a character is incomplete)."""
        prefix = tokenizer.decode(ids[self.prefix_offset : self.read_offset])
        full = tokenizer.decode(ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        new = full[len(prefix) :]
        self.pieces.append(new)
        self.num_chars += len(new)
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return new

    def text(self) -> str:
        return "".join(self.pieces)


class StopChecker:
    def __init__(self, tokenizer, eos_token_ids: set[int], max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def check(self, seq: Sequence) -> None:
        """Set seq.finish_reason (and its text) if its newest token ends it."""
        p, tok = seq.params, seq.output_token_ids[-1]
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_token_ids):
            seq.finish_reason = "stop"
        elif p.stop:
            cut = self._find_stop_string(seq)
            if cut is not None:
                seq.output_text = cut
                seq.finish_reason = "stop"
                return
        if seq.finish_reason is None and (
            len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            seq.finish_reason = "length"
        if seq.finish_reason is not None and self.tokenizer is not None:
            # once per request: the whole output decoded at its end
            seq.output_text = self.tokenizer.decode(seq.output_token_ids)

    def _find_stop_string(self, seq: Sequence) -> str | None:
        """The output text cut before the first stop string, if the newest text completes one.
        Work per token: a decode of the few tokens since the last complete character and a
        search of max stop length + new characters."""
        tail: TextTail | None = seq.text_tail  # type: ignore[assignment]
        if tail is None:
            tail = seq.text_tail = TextTail()
        new = tail.advance(self.tokenizer, seq.output_token_ids)
        if not new:
            return None
        stops = seq.params.stop
        keep = max(len(s) for s in stops) - 1  # old characters a match may start in
        window = tail.tail + new
        start = tail.num_chars - len(window)  # the window's offset in the whole text
        tail.tail = window[max(0, len(window) - keep) :] if keep else ""
        hits = [i for i in (window.find(s) for s in stops) if i >= 0]
        if not hits:
            return None
        return tail.text()[: start + min(hits)]
