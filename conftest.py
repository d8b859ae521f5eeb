"""Root pytest configuration: strict JAX settings, and Markdown code blocks as tests.

Every ``python`` code block in README.md and guides/*.md runs under pytest through
Sybil. Blocks written as ``>>>`` sessions are doctests, so every result they show is
compared with what the library really returns.
"""

import doctest

import jax
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

# Implicit rank promotion hides layout bugs (an (N, C) array broadcast against an
# (N, H, W, C) one); raise instead, as Equinox's suite does.
jax.config.update("jax_numpy_rank_promotion", "raise")

pytest_collect_file = Sybil(
    parsers=[
        PythonCodeBlockParser(doctest_optionflags=doctest.NORMALIZE_WHITESPACE),
        SkipParser(),
    ],
    patterns=["README.md", "guides/*.md"],
).pytest()
