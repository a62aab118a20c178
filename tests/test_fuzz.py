"""Property-based fuzz (Hypothesis) of every way text and settings come in: the tokenizers, Translator,
Completer, the config parser, ``qkv translate``'s line pipe and the explorer's API.

Inputs are arbitrary: any Unicode including lone surrogates (which JSON escapes and ``surrogateescape``
produce), arbitrary bytes, arbitrary JSON. The properties: nothing raises but the documented error type
(:class:`qkv.errors.QkvError`), ids stay in the vocabulary, as many translations come out as sentences go in,
and the explorer answers every request with JSON and never a 500. The models are tiny and untrained:
what is fuzzed is the handling of input, not what a model makes of it.
"""

import json
import os
import socket
import string
import threading

import pytest
import torch

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from qkv.cli import main  # noqa: E402
from qkv.config import ModelConfig
from qkv.errors import ConfigError, QkvError
from qkv.settings import apply_overrides, from_dict, load_yaml, to_dict
from qkv import Completer, Translator  # noqa: E402
from qkv.interpret.explorer.server import make_server  # noqa: E402
from qkv.interpret.model_maps import make_attention_provider  # noqa: E402
from qkv.files import valid_text
from qkv.models import GPT, Transformer  # noqa: E402
from qkv.tokenizers.bpe import BPETokenizer  # noqa: E402
from qkv.tokenizers.char import CharTokenizer  # noqa: E402
from qkv.recipes import LMRecipe, MTRecipe  # noqa: E402
from qkv.weights import save_weights  # noqa: E402

# Few examples each, the same ones every run (derandomize): the default tier stays within seconds and a
# failure is reproducible. QKV_FUZZ_EXAMPLES raises the count for a long campaign.
FUZZ = settings(max_examples=int(os.environ.get("QKV_FUZZ_EXAMPLES", "60")), deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Any code point, lone surrogates included (Hypothesis's own text() leaves them out).
code_points = st.lists(st.integers(0, 0x10FFFF), max_size=24).map(lambda cs: "".join(map(chr, cs)))
any_text = st.one_of(st.text(max_size=24), code_points, st.sampled_from(["", " ", "\n", "小明累了。", "\ud800x"]))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
SENTENCES = ["小明累了，他想睡觉。", "Xiaoming is tired, he wants to sleep.", "To be, or not to be."]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Untrained tiny run directories, one of each kind: ``mt`` (a Transformer) and ``lm`` (a GPT)."""
    root = tmp_path_factory.mktemp("fuzz")
    tok = BPETokenizer.train(SENTENCES * 5, vocab_size=80)
    out = {}
    for name, arch, model_class in (("mt", "transformer", Transformer), ("lm", "gpt", GPT)):
        cfg = ModelConfig(arch=arch, vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                          dropout=0.0, max_len=24)
        path = root / name
        tok.save(path)
        train = {"context": 24} if arch == "gpt" else {}  # a translation recipe has no context: its positions are max_len
        (path / "config.json").write_text(json.dumps({"model": to_dict(cfg), "train": train}))
        torch.manual_seed(0)
        save_weights(path / "model.safetensors", model_class(cfg))
        out[name] = path
    return out


# ------------------------------------------------------------------------------------------------
# Tokenizers


@pytest.fixture(scope="module")
def tokenizers():
    found = {"bpe": BPETokenizer.train(SENTENCES * 5, vocab_size=80),
             "char": CharTokenizer.train("".join(SENTENCES)),  # an unseen character is <unk>
             "char-strict": CharTokenizer.train("".join(SENTENCES), specials=False)}  # ... or an error
    try:  # GPT-2's byte-level BPE (tiktoken) with bytes for ranks: no download
        from tiktoken_ext.openai_public import r50k_pat_str

        from qkv.tokenizers.gpt2 import ENDOFTEXT, GPT2Tokenizer

        ranks = {bytes([i]): i for i in range(256)}
        found["gpt2"] = GPT2Tokenizer({"name": "fuzz", "pat_str": r50k_pat_str, "mergeable_ranks": ranks,
                                       "special_tokens": {ENDOFTEXT: 256}})
    except ImportError:
        pass
    return found


@FUZZ
@given(texts=st.lists(any_text, min_size=1, max_size=4))
def test_tokenizers_take_any_text(tokenizers, texts):
    for name, tok in tokenizers.items():
        special = name != "char-strict"  # no <bos>/<eos> to add
        try:
            batch = tok.encode_batch(texts, add_bos=special, add_eos=special)
        except QkvError as e:
            assert name == "char-strict" and "not in the vocabulary" in str(e), (name, e)
            continue
        assert len(batch) == len(texts)
        for text, ids in zip(texts, batch):
            assert ids == tok.encode(text, add_bos=special, add_eos=special)
            assert all(0 <= i < tok.vocab_size for i in ids), name
            decoded = tok.decode(ids)
            assert isinstance(decoded, str)
            decoded.encode("utf-8")  # whatever came in, what comes out is text UTF-8 can hold
            if name == "gpt2":  # byte-level: nothing is lost but what UTF-8 cannot hold
                assert decoded == valid_text(text)


@FUZZ
@given(ids=st.lists(st.integers(-5, 400), max_size=12))
def test_decoding_any_ids_is_text_or_the_tokenizers_error(tokenizers, ids):
    for tok in tokenizers.values():
        try:
            assert isinstance(tok.decode(ids), str)
        except QkvError:
            assert any(not 0 <= i < tok.vocab_size for i in ids)


# ------------------------------------------------------------------------------------------------
# Translator and Completer


@pytest.fixture(scope="module")
def translator(runs):
    return Translator.from_run(runs["mt"], device="cpu")


@pytest.fixture(scope="module")
def completer(runs):
    return Completer.from_run(runs["lm"], device="cpu")


@FUZZ
@given(texts=st.lists(any_text, max_size=5), beam=st.integers(1, 3))
def test_translator_gives_one_line_per_sentence(translator, texts, beam):
    out = translator.translate(texts, beam=beam, extra=3, truncate=True)
    assert len(out) == len(texts)
    for line in out:
        assert isinstance(line, str) and "\n" not in line
        line.encode("utf-8")


@FUZZ
@given(texts=st.lists(code_points, min_size=1, max_size=3))
def test_translator_without_truncate_raises_only_its_error(translator, texts):
    try:
        assert len(translator.translate(texts, beam=2, extra=2)) == len(texts)
    except QkvError as e:  # a source longer than the model's positions
        assert "positions" in str(e) or "tokens" in str(e)


@FUZZ
@given(prompt=any_text, n=st.integers(1, 4), temperature=st.sampled_from([0.0, 0.7, 1.0]),
       top_k=st.integers(0, 5), top_p=st.sampled_from([1.0, 0.9, 0.01]))
def test_completer_takes_any_prompt(completer, prompt, n, temperature, top_k, top_p):
    try:
        out = completer.complete(prompt, max_new_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p,
                                 seed=0)
    except QkvError as e:  # the prompt does not fit the context
        assert "context" in str(e)
        return
    assert isinstance(out, str)
    out.encode("utf-8")


# ------------------------------------------------------------------------------------------------
# The config parser


@FUZZ
@given(data=st.dictionaries(st.sampled_from(["model", "data", "train", "other"]), json_values, max_size=3))
def test_any_recipe_mapping_is_a_recipe_or_a_config_error(data):
    for cls in (LMRecipe, MTRecipe):
        try:
            from_dict(cls, data)
        except ConfigError:
            pass


@FUZZ
@given(section=st.sampled_from(["model", "data", "train"]), key=st.text(string.ascii_lowercase + "_.", max_size=12),
       value=st.one_of(any_text, st.sampled_from(["-1", "nan", "[1", "{", "1e400", "null", "true", "0"])))
def test_any_override_is_applied_or_a_config_error(section, key, value):
    recipe = from_dict(LMRecipe, {})
    try:
        apply_overrides(recipe, [f"{section}.{key}={value}"])
    except ConfigError:
        pass


@FUZZ
@given(raw=st.one_of(st.binary(max_size=64), any_text.map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_any_recipe_file_is_read_or_a_config_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("yaml") / "r.yaml"
    path.write_bytes(raw)
    try:
        load_yaml(path, LMRecipe)
    except ConfigError as e:
        assert str(path) in str(e)


# ------------------------------------------------------------------------------------------------
# `qkv translate`: as many lines out as in, whatever bytes the lines hold


@FUZZ
@given(lines=st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")),
                      min_size=1, max_size=5))
def test_translate_writes_one_line_per_input_line(runs, tmp_path_factory, capsys, lines):
    folder = tmp_path_factory.mktemp("pipe")
    (folder / "in.txt").write_bytes(b"\n".join(lines) + b"\n")
    code = main(["translate", "--run", str(runs["mt"]), "--input", str(folder / "in.txt"), "--output",
                 str(folder / "out.txt"), "--beam", "2", "--truncate", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    assert len((folder / "out.txt").read_text(encoding="utf-8").split("\n")) == len(lines) + 1


# ------------------------------------------------------------------------------------------------
# The explorer's API, over a real socket


@pytest.fixture(scope="module")
def explorer(runs):
    srv = make_server(quiet=True, attention_provider=make_attention_provider(runs["mt"]))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _ask(srv, method: str, target: bytes, body: bytes = b"", content_type: bytes = b"application/json"):
    port = srv.server_address[1]
    head = (method.encode() + b" " + target + b" HTTP/1.1\r\nHost: 127.0.0.1:" + str(port).encode() +
            b"\r\nConnection: close\r\n")
    if method == "POST":
        head += b"Content-Type: " + content_type + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + b"\r\n" + body)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    status = int(response.split(b" ", 2)[1])
    return status, json.loads(response.partition(b"\r\n\r\n")[2])


@FUZZ
@given(body=st.one_of(json_values.map(lambda v: json.dumps(v).encode()),
                      st.dictionaries(st.just("text"), any_text, min_size=1).map(
                          lambda d: json.dumps(d).encode()),
                      st.binary(max_size=40)))
def test_the_explorer_answers_any_body_with_json_and_never_500(explorer, body):
    status, answer = _ask(explorer, "POST", b"/api/attention", body)
    assert status in (200, 400, 413), (status, answer)
    assert ("maps" in answer) if status == 200 else ("error" in answer)


@FUZZ
@given(query=st.binary(max_size=30).map(lambda b: b.replace(b" ", b"%20").replace(b"\r", b"").replace(b"\n", b"")
                                        .replace(b"#", b"")))
def test_the_explorer_answers_any_query_with_json_and_never_500(explorer, query):
    status, answer = _ask(explorer, "GET", b"/api/attention?text=" + query)
    assert status in (200, 400, 413), (status, answer)
