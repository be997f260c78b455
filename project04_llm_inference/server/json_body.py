"""A request body -> its JSON value, refused with a 400 (`APIError`) before it can cost much.

What the standard library's parser accepts but a server should not: NaN and Infinity (not
JSON), integers of thousands of digits (converting them is quadratic in their length), nesting
thousands deep (the parser recurses), and strings holding a lone UTF-16 surrogate escape
("\\ud800", which no UTF-8 encoder or tokenizer takes). Runs in a worker thread (`api.py`),
never on the event loop.
"""

from __future__ import annotations

import json

from .protocol import APIError

MAX_JSON_DEPTH = 64  # nesting of objects and lists in a body
MAX_JSON_INT_DIGITS = 64  # longer integers are refused while parsing (converting is quadratic)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(text)


def _check_tree(body) -> None:
    """Nesting depth and strings: every string (keys too) must encode as UTF-8, which a lone
    surrogate escape ("\\ud800") does not."""
    stack = [(body, 1)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise APIError(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(x, str):
            items = ()
            strings = (x,)
        elif isinstance(x, dict):
            items, strings = x.values(), x.keys()
        elif isinstance(x, list):
            items, strings = x, ()
        else:
            continue
        for t in strings:
            if not t.isascii():
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError:
                    raise APIError(
                        "malformed JSON body: a string holds a lone UTF-16 surrogate"
                    ) from None
        stack.extend((v, depth + 1) for v in items if isinstance(v, (str, list, dict)))


def parse_json(raw: bytes):
    """A request body -> its JSON value, or an APIError saying what is wrong with it."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_int=_bounded_int)
    except RecursionError:
        raise APIError(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, the two hooks above
        raise APIError(f"malformed JSON body: {e}") from None
    _check_tree(body)
    return body
