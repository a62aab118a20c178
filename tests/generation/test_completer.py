"""Completer: text in, text out; streaming, stop strings, seeds, start token, context limits, bad arguments."""

import io

import pytest
import torch

from qkv import GPT, preset
from qkv.generation.completer import Completer
from qkv.generation.decode import generate
from qkv.tokenizers.char import CharTokenizer

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,\n"


@pytest.fixture
def completer():
    torch.manual_seed(0)
    tok = CharTokenizer(list(ALPHABET))
    model = GPT(preset("tiny-gpt", vocab_size=tok.vocab_size, max_len=24))
    return Completer(model, tok, start_text="\n")


class Chunks(io.StringIO):
    """A stream that remembers each write."""

    def __init__(self):
        super().__init__()
        self.chunks = []

    def write(self, s):
        self.chunks.append(s)
        return super().write(s)


def test_greedy_completion_is_the_decoded_generate_output(completer):
    ids = completer.tokenizer.encode("the cat")
    (row,) = generate(completer.model, [ids], 10, temperature=0)
    eos = completer.tokenizer.eos_id
    row = row[: row.index(eos)] if eos in row else row
    assert completer.complete("the cat", max_new_tokens=10, temperature=0) == completer.tokenizer.decode(row)


def test_streaming_writes_the_same_text_token_by_token(completer):
    stream = Chunks()
    text = completer.complete("ab", max_new_tokens=12, temperature=1.0, seed=3, stream=stream)
    assert "".join(stream.chunks) == text
    assert len(stream.chunks) > 1


def test_stop_strings_cut_the_text_and_never_stream_past_it(completer):
    full = completer.complete("ab", max_new_tokens=16, temperature=1.0, seed=5)
    assert len(full) >= 8
    stop = full[4:6]
    stream = Chunks()
    cut = completer.complete("ab", max_new_tokens=16, temperature=1.0, seed=5, stop=[stop, "zzzz"], stream=stream)
    assert cut == full[: full.find(stop)]
    assert "".join(stream.chunks) == cut


def test_a_seed_makes_sampling_reproducible(completer):
    a = completer.complete("ab", max_new_tokens=15, temperature=1.0, seed=1)
    assert a == completer.complete("ab", max_new_tokens=15, temperature=1.0, seed=1)
    assert a != completer.complete("ab", max_new_tokens=15, temperature=1.0, seed=2)


def test_an_empty_prompt_starts_from_the_start_text_or_bos(completer):
    assert completer.complete("", max_new_tokens=6, temperature=0) == completer.complete("\n", max_new_tokens=6, temperature=0)
    assert completer.encode_prompt("") == completer.tokenizer.encode("\n")
    completer.start_text = ""
    assert completer.encode_prompt("") == [completer.tokenizer.bos_id]
    no_specials = Completer(completer.model, CharTokenizer(list(ALPHABET), specials=False), start_text="")
    with pytest.raises(ValueError, match="no <bos>"):
        no_specials.complete("", max_new_tokens=2)


def test_a_prompt_longer_than_the_context_is_an_error_unless_the_window_slides(completer):
    long = "the quick brown fox jumps over"  # 30 characters > context 24
    with pytest.raises(ValueError, match="exceeds the model's context of 24.*--sliding-window"):
        completer.complete(long, max_new_tokens=5)
    with pytest.raises(ValueError, match="context"):
        completer.complete("abc", max_new_tokens=30)
    # The sliding window equals nanoGPT's crop: each step reads the last 24 tokens, uncached.
    text = completer.complete(long, max_new_tokens=20, temperature=0, sliding_window=True)
    ids = completer.tokenizer.encode(long)
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(completer.model(torch.tensor([ids[-24:]]))[0, -1].argmax()))
    expected = ids[len(long):]
    eos = completer.tokenizer.eos_id
    expected = expected[: expected.index(eos)] if eos in expected else expected
    assert text == completer.tokenizer.decode(expected)


def test_bad_sampling_arguments_are_clear_errors(completer):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        completer.complete("ab", temperature=-0.1)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        completer.complete("ab", top_p=0.0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        completer.complete("ab", top_p=1.5)
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        completer.complete("ab", top_k=-1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        completer.complete("ab", max_new_tokens=-1)


def test_batch_completion_equals_one_at_a_time_when_greedy(completer):
    prompts = ["a", "the cat sat", "", "xy z"]
    batch = completer.complete_batch(prompts, max_new_tokens=8, temperature=0)
    assert batch == [completer.complete(p, max_new_tokens=8, temperature=0) for p in prompts]


def test_eos_ends_the_completion(completer):
    eos = completer.tokenizer.eos_id

    def force_eos(module, args, logits):
        if args[0].shape[1] == 1:  # the step after the first new token: force <eos>
            logits[..., eos] = 1e4
        return logits

    completer.model.register_forward_hook(force_eos)  # the decoding copy carries it
    out = completer.complete("ab", max_new_tokens=10, temperature=0)
    assert len(out) == 1
