"""``searchgym view``: episodes as one self-contained HTML page (the page data, per-token values, the HTML)."""
