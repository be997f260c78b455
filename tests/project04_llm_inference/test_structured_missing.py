"""Without xgrammar (the optional `structured` extra), a request asking for structured output is
answered 400 naming its field and the extra; nothing else changes. Runs whether or not xgrammar
is installed (its import is made to fail)."""

from __future__ import annotations

import sys

import pytest

from project04_llm_inference.engine.structured import Grammars
from project04_llm_inference.server.protocol import APIError, ModelInfo, parse_request


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs"),
    ],
)
def test_structured_output_without_xgrammar_is_400(monkeypatch, extra, field):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` now fails
    info = ModelInfo(
        names=["m"],
        max_model_len=64,
        vocab_size=100,
        tokenizer=None,
        chat=None,
        grammars=Grammars(object(), 100, {2}),
    )
    with pytest.raises(APIError) as e:
        parse_request(info, {"prompt": [1, 2, 3], **extra}, chat=False)
    assert e.value.status == 400 and e.value.param == field
    assert "xgrammar" in e.value.message and "[structured]" in e.value.message
    # a request without a constraint is untouched
    assert parse_request(info, {"prompt": [1, 2, 3]}, chat=False).choices
