"""The model folder's tokenizer (`tokenizer.json`, through the `tokenizers` library), or none:
then requests are token ids in and out."""

from __future__ import annotations

import json
from pathlib import Path


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        self.path = Path(model_dir) / "tokenizer.json"
        self._tok = _HFTokenizer.from_file(str(self.path))
        cfg_path = Path(model_dir) / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}

    @classmethod
    def from_dir(cls, model_dir: str | Path | None) -> Tokenizer | None:
        if model_dir is None or not (Path(model_dir) / "tokenizer.json").is_file():
            return None
        return cls(model_dir)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
