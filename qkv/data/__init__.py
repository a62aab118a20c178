"""Data: the registry of real corpora (``corpora``), the embedded demo corpus (``synthetic``), and the
``qkv data`` command (``commands``).

Everything here imports only the standard library, so ``import qkv.data`` is cheap.
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
