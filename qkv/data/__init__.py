"""Data: the registry of real corpora (``corpora``), the embedded demo corpus (``synthetic``), translation
pairs (``translation``), token files of a language model (``lm``) and fine-tuning pairs (``sft``); the ``qkv
data`` command that lists, fetches and checks the corpora is ``qkv.cli.data``.

This file imports ``corpora`` and ``synthetic``, which need only the standard library, so ``import qkv.data``
is cheap; ``lm``, ``translation`` and ``sft`` (numpy, torch) are imported by name where they are used.
"""

from qkv.data.corpora import (
    Corpus,
    DataError,
    check_corpus,
    fetch,
    find_corpus,
    get_corpus,
    list_corpora,
    read_parallel,
    read_parallel_files,
    read_text,
)
from qkv.data.synthetic import SEED_SENTENCE, UNSEEN_EXAMPLES, demo_corpus, make_pairs

__all__ = [
    "Corpus", "DataError", "check_corpus", "fetch", "find_corpus", "get_corpus", "list_corpora",
    "read_parallel", "read_parallel_files", "read_text",
    "SEED_SENTENCE", "UNSEEN_EXAMPLES", "demo_corpus", "make_pairs",
]
