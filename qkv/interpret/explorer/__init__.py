"""The attention explorer: an interactive page of the paper's figures, its server and its export.

``make_server`` / ``serve`` run the page on a local server (``qkv explore``); ``export_page`` writes
it as one self-contained HTML file. ``figures`` is the Python reference for the page's numbers.
"""

from qkv.interpret.explorer.export import export_page
from qkv.interpret.explorer.payload import AttentionDataError, normalize_attention_data
from qkv.interpret.explorer.server import AttentionProvider, ExplorerServer, make_server, serve

__all__ = [
    "AttentionDataError",
    "AttentionProvider",
    "ExplorerServer",
    "export_page",
    "make_server",
    "normalize_attention_data",
    "serve",
]
