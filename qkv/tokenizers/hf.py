"""A qkv tokenizer as Hugging Face's ``PreTrainedTokenizerFast``: ``AutoTokenizer`` encodes as qkv does.

A BPE tokenizer is a ``tokenizers`` model already and goes as it is. A character tokenizer becomes
one: a word-level vocabulary of single characters, every character its own piece (a split on each
character, newlines too), decoded by joining the pieces. A translation tokenizer also appends
``<eos>`` to what it encodes, as qkv's ``Translator`` does to every source sentence; a GPT's adds
nothing (a prompt is its tokens). GPT-2's own tokenizer is not exported: it is GPT-2's, on the Hub.
"""

from __future__ import annotations

from typing import Any

from qkv.errors import require
from qkv.tokenizers import BOS, EOS, PAD, UNK, Tokenizer, TokenizerError
from qkv.tokenizers.bpe import BPETokenizer
from qkv.tokenizers.char import CharTokenizer
from qkv.tokenizers.gpt2 import GPT2Tokenizer


def _char_model(tokenizer: CharTokenizer) -> Any:
    from tokenizers import Regex, Tokenizer as Backend, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(tokenizer.itos)}
    unk = UNK if tokenizer.specials and tokenizer.on_unknown == "unk" else None
    model = Backend(models.WordLevel(vocab, unk_token=unk))
    # (?m): Oniguruma's dot-matches-newline; "isolated": each character a piece of its own.
    model.pre_tokenizer = pre_tokenizers.Split(Regex("(?m:.)"), behavior="isolated")
    model.decoder = decoders.Fuse()
    if tokenizer.specials:
        model.add_special_tokens([PAD, BOS, EOS, UNK])
    return model


def to_transformers(tokenizer: Tokenizer, translation: bool) -> Any:
    """``tokenizer`` as a ``PreTrainedTokenizerFast`` (its specials named; ``<eos>`` appended for translation)."""
    if isinstance(tokenizer, GPT2Tokenizer):
        raise TokenizerError("GPT-2's own tokenizer is not exported: load it with AutoTokenizer.from_pretrained('gpt2')")
    transformers = require("transformers", "hf", "exporting a tokenizer to Hugging Face")
    if isinstance(tokenizer, BPETokenizer):
        from tokenizers import Tokenizer as Backend

        model = Backend.from_str(tokenizer.to_json())  # a copy: the post-processor is added below
    elif isinstance(tokenizer, CharTokenizer):
        model = _char_model(tokenizer)
    else:
        raise TokenizerError(f"cannot export a {type(tokenizer).__name__} to Hugging Face")
    if translation:
        if tokenizer.eos_id is None:
            raise TokenizerError("a translation tokenizer needs <eos>, which ends every source sentence")
        from tokenizers import processors

        model.post_processor = processors.TemplateProcessing(
            single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, tokenizer.eos_id)])
    specials = {name: token for name, token, i in (("pad_token", PAD, tokenizer.pad_id),
                                                     ("bos_token", BOS, tokenizer.bos_id),
                                                     ("eos_token", EOS, tokenizer.eos_id),
                                                     ("unk_token", UNK, tokenizer.unk_id)) if i is not None}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, **specials)


__all__ = ["to_transformers"]
