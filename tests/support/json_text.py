"""Hypothesis strategies for text that hand-written JSON must match ``json.dumps`` on:
the hot paths that join strings between quotes themselves (the receiver's stored
headers, the attempt log's headers) take a fast path only for plain text."""

from __future__ import annotations

from hypothesis import strategies as st

PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def plain(max_size: int) -> st.SearchStrategy[str]:
    """Printable ASCII without a quote or a backslash: written as it is."""
    return st.text(
        alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'),
        max_size=max_size,
    )


def mixed(max_size: int, special: str = '"\\\x7f\t\x00é') -> st.SearchStrategy[str]:
    """Printable ASCII with the ``special`` characters common (about every other one):
    what JSON escapes, and beyond ASCII."""
    return st.text(alphabet=PRINTABLE | st.sampled_from(special), max_size=max_size)
