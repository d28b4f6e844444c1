"""The HTML of ``searchgym view``'s page: one file, its CSS and script inline (the template
``searchgym/assets/view.html``), the episodes embedded as JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

__all__ = ["embed_json", "render_page"]

_DATA_MARK = "__SEARCHGYM_VIEW_DATA__"

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(value: Any) -> str:
    """``value`` as JSON that is safe inside an HTML ``<script>`` element: ``<``, ``>`` and ``&`` (and the
    two line separators JavaScript once treated as line ends) are written as ``\\uXXXX`` escapes, so no
    text in the data (``</script>``, ``<!--``) can end the element; ``JSON.parse`` reads back the same value."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_ESCAPES[m.group(0)], text)


def render_page(episodes: Iterable[dict[str, Any]], meta: Mapping[str, Any]) -> str:
    """The self-contained HTML page: the template (``searchgym/assets/view.html``: its CSS and script
    inline) with the data embedded as JSON.

    Args:
        episodes: From :func:`page_episodes`.
        meta: ``title``, ``files`` and ``colour`` (``None``, or ``mode``: ``"logp"`` / ``"delta"``, and
            ``label``: what the values are).
    """
    template = resources.files("searchgym").joinpath("assets/view.html").read_text(encoding="utf-8")
    if template.count(_DATA_MARK) != 1:
        raise RuntimeError(f"the view template must hold {_DATA_MARK} once")
    data = embed_json({"meta": dict(meta), "episodes": list(episodes)})
    head, tail = template.split(_DATA_MARK)
    return head + data + tail
