"""Fine-tuning: response-only loss, the mixed loss, LoRA runs, exact resume, and clear data errors."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from qkv.data.sft import Pair, SFTDataError, SFTExample, collate, encode_pairs, read_jsonl_pairs, write_jsonl_pairs
from qkv.training.finetune import FinetuneConfig, FinetuneData, FinetuneRecipe, finetune, finetune_loss, pretraining_data
from qkv.runs import Run, load_model
from qkv.evaluation.losses import masked_nll
from qkv.errors import ConfigError
from qkv.settings import from_dict
from qkv.recipes import LMDataConfig, LMRecipe
from qkv.training.train_lm import train_lm

PAIRS = [("我累了。", "I'm tired."), ("我很好。", "I'm fine."), ("他来了。", "He came."), ("你好。", "Hello.")]
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n") * 20


def _pairs():
    return [Pair(f"Chinese: {zh}\nEnglish:", f" {en}", f"test:{i}") for i, (zh, en) in enumerate(PAIRS)]


def _jsonl(path, pairs) -> str:
    """``pairs`` written as a fine-tuning file; its path, which a recipe names."""
    return str(write_jsonl_pairs(pairs, path))


def _recipe(base_run, train: str, valid: str = "", **settings) -> FinetuneRecipe:
    return FinetuneRecipe(FinetuneData(str(base_run), train, valid), _cfg(**settings))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A tiny pretrained GPT whose character vocabulary also covers the fine-tuning pairs."""
    root = tmp_path_factory.mktemp("ft")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (root / "extra.txt").write_text("\n".join(p.prompt + p.response for p in _pairs()), encoding="utf-8")
    recipe = from_dict(LMRecipe, {
        "model": {"d_model": 32, "n_heads": 4, "d_ff": 64, "n_layers": 2, "max_len": 48, "dropout": 0.1},
        "data": {"path": str(root / "corpus.txt"), "vocab_extra": [str(root / "extra.txt")]},
        "train": {"batch_size": 4, "steps": 20, "warmup": 2, "eval_every": 20, "eval_iters": 2, "lr": 3e-3},
    })
    train_lm(recipe, root / "base", quiet=True, plot=False)
    return root / "base"


def test_pretraining_text_is_split_as_the_base_run_splits_its_corpus(base_run, tmp_path):
    text = "".join(f"All:\nSpeak {'a' * i}.\n\n" for i in range(20))
    (tmp_path / "more.txt").write_text(text, encoding="utf-8")
    base, cfg = Run(base_run), FinetuneConfig(pretrain_text=str(tmp_path / "more.txt"))
    tokenizer = base.tokenizer()
    by_document = pretraining_data(base, cfg, tokenizer, LMDataConfig(split="documents"))
    assert by_document.valid.tolist() == tokenizer.encode(f"All:\nSpeak {'a' * 9}.\n\nAll:\nSpeak {'a' * 19}.\n\n")
    by_position = pretraining_data(base, cfg, tokenizer, LMDataConfig())
    assert by_position.valid.tolist() == tokenizer.encode(text)[int(0.9 * len(text)):]
    own = pretraining_data(base, FinetuneConfig(), tokenizer, LMDataConfig())  # the base run's tokens.bin
    assert own.train.tolist() + own.valid.tolist() == tokenizer.encode(TEXT)


def test_collate_masks_exactly_the_response_targets():
    ex = SFTExample(ids=(5, 6, 7, 8, 9, 2), n_prompt=3)  # prompt 5 6 7 | response 8 9 | <eos>
    short = SFTExample(ids=(5, 8, 2), n_prompt=1)
    x, y, mask = collate([ex, short], pad_id=0)
    assert x.tolist() == [[5, 6, 7, 8, 9], [5, 8, 0, 0, 0]]
    assert y.tolist() == [[6, 7, 8, 9, 2], [8, 2, 0, 0, 0]]
    assert mask.tolist() == [[False, False, True, True, True], [True, True, False, False, False]]


def test_the_loss_ignores_prompt_targets():
    ex = SFTExample(ids=(5, 6, 7, 8, 9, 2), n_prompt=3)
    x, y, mask = collate([ex], pad_id=0)
    logits = torch.randn(1, 5, 11, requires_grad=True)
    loss = masked_nll(logits, y, mask).loss
    loss.backward()
    assert torch.all(logits.grad[0, :2] == 0) and torch.all(logits.grad[0, 2:].abs().sum(-1) > 0)
    other = y.clone()
    other[0, :2] = torch.tensor([1, 3])  # other prompt tokens to predict: the loss does not see them
    assert masked_nll(logits, other, mask).loss.item() == loss.item()
    full = F.cross_entropy(logits[0, 2:], y[0, 2:])
    torch.testing.assert_close(loss, full)


def test_mixed_loss_is_task_plus_lambda_pretrain(base_run):
    model, tok = load_model(base_run)
    batch = collate(encode_pairs(_pairs(), tok, 48), tok.pad_id)
    pre = (torch.randint(4, tok.vocab_size, (2, 16)), torch.randint(4, tok.vocab_size, (2, 16)))
    total0, task0, p0, kl0 = finetune_loss(model, batch, pre, 0.0)
    assert p0 is None and kl0 is None and torch.equal(total0, task0)
    total, task, p, kl = finetune_loss(model, batch, pre, 0.5)
    assert kl is None
    expected_pre = F.cross_entropy(model(pre[0]).flatten(0, 1), pre[1].flatten())
    torch.testing.assert_close(p, expected_pre)
    torch.testing.assert_close(total, task + 0.5 * expected_pre)
    torch.testing.assert_close(task, task0)


def test_the_kl_cure_is_zero_at_the_base_and_pulls_back_to_it(base_run):
    model, tok = load_model(base_run)
    base, _ = load_model(base_run)
    batch = collate(encode_pairs(_pairs(), tok, 48), tok.pad_id)
    pre = (torch.randint(4, tok.vocab_size, (2, 16)), torch.randint(4, tok.vocab_size, (2, 16)))
    total, task, p, kl = finetune_loss(model, batch, pre, 0.0, kl=0.7, base=base)
    assert p is None and kl.abs() < 1e-6 and torch.allclose(total, task)  # the model is the base
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight) * 0.05)
    model.zero_grad()
    total, task, p, kl = finetune_loss(model, batch, pre, 0.0, kl=0.7, base=base)
    probs_base = F.softmax(base(pre[0]).flatten(0, 1), -1)
    expected = (probs_base * (probs_base.log() - F.log_softmax(model(pre[0]).flatten(0, 1), -1))).sum(-1).mean()
    torch.testing.assert_close(kl, expected)  # KL(p_base || p), averaged over positions
    torch.testing.assert_close(total, task + 0.7 * kl)
    kl.backward()
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert all(q.grad is None for q in base.parameters())  # the base is never trained
    with pytest.raises(ValueError, match="needs the frozen base"):
        finetune_loss(model, batch, pre, 0.0, kl=0.7)


def test_kl_finetuning_logs_the_divergence_and_stays_closer_to_the_base(base_run, tmp_path):
    pairs = _jsonl(tmp_path / "pairs.jsonl", _pairs() * 4)
    plain = finetune(_recipe(base_run, pairs), tmp_path / "plain", quiet=True, plot=False)
    held = finetune(_recipe(base_run, pairs, kl=5.0), tmp_path / "kl", quiet=True, plot=False)
    assert held.final["pretrain_loss"] < plain.final["pretrain_loss"]
    lines = [json.loads(line) for line in (tmp_path / "kl" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["split"] == "train"]
    assert train and all(r["kl"] >= 0 for r in train)
    assert json.loads((tmp_path / "kl" / "results.json").read_text())["kl"] == 5.0


def _cfg(**kw):
    base = dict(steps=8, batch_size=4, warmup=1, eval_every=4, eval_iters=2, log_every=1, lr=3e-3)
    base.update(kw)
    return FinetuneConfig(**base)


def test_finetune_learns_the_task_and_resumes_exactly(base_run, tmp_path):
    pairs = _jsonl(tmp_path / "pairs.jsonl", _pairs())
    recipe = _recipe(base_run, pairs, pairs, mix=0.5)
    straight = finetune(recipe, tmp_path / "a", quiet=True, plot=False)
    assert straight.final["task_loss"] < straight.summary["before"]["task_loss"] - 0.3
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert results == straight.summary and set(results["before"]) == set(results["after"]) == {"task_loss", "pretrain_loss"}
    first = finetune(recipe, tmp_path / "b", stop_at=3, quiet=True, plot=False)
    assert Run(tmp_path / "a").exists and not Run(tmp_path / "b").exists  # stopped part way: not finished
    torch.manual_seed(777)
    rest = finetune(recipe, tmp_path / "b", resume=True, quiet=True, plot=False)
    assert first.losses + rest.losses == straight.losses and Run(tmp_path / "b").exists
    train = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in train if r["split"] == "train"][0]["pretrain_loss"] > 0  # the pretraining batches were used
    assert rest.final == straight.final


def test_resume_refuses_other_data_or_adapters_and_leaves_the_record(base_run, tmp_path):
    # A file stands for the data: compared by its path, and by its examples' fingerprint.
    run, spec = tmp_path / "ft", _jsonl(tmp_path / "a.jsonl", _pairs())
    other = _jsonl(tmp_path / "other.jsonl", _pairs())
    finetune(_recipe(base_run, spec), run, stop_at=2, quiet=True, plot=False)
    record = (run / "finetune.json").read_text()
    for recipe, changed in ((_recipe(base_run, other), "--data"), (_recipe(base_run, spec, lora_rank=2), "train.lora_rank")):
        with pytest.raises(ConfigError, match=f"{changed}=.*the run's.*another run"):
            finetune(recipe, run, resume=True, quiet=True, plot=False)
        assert (run / "finetune.json").read_text() == record
    # The same file, edited in place: its path is the run's, its examples are not.
    edited = [replace(p, response=p.response + "!") if i == 0 else p for i, p in enumerate(_pairs())]
    _jsonl(tmp_path / "a.jsonl", edited)
    with pytest.raises(ConfigError, match=r"--data's examples \(sha256\)='[0-9a-f]{16}' \(the run's: '[0-9a-f]{16}'\)"):
        finetune(_recipe(base_run, spec), run, resume=True, quiet=True, plot=False)
    assert (run / "finetune.json").read_text() == record
    _jsonl(tmp_path / "a.jsonl", _pairs())
    rest = finetune(_recipe(base_run, str(tmp_path / "." / "a.jsonl"), steps=10), run, resume=True, quiet=True,
                    plot=False)  # the same file, written another way; more steps
    assert rest.step == 10
    # A record written before runs kept the fingerprint: its examples are not checked.
    old = json.loads((run / "finetune.json").read_text())
    del old["data_sha256"]
    (run / "finetune.json").write_text(json.dumps(old), encoding="utf-8")
    _jsonl(tmp_path / "a.jsonl", edited)
    assert finetune(_recipe(base_run, spec, steps=12), run, resume=True, quiet=True, plot=False).step == 12


def test_lora_finetune_trains_a_low_rank_update_and_exports_a_plain_gpt(base_run, tmp_path):
    from qkv.generation.completer import Completer

    pairs = _jsonl(tmp_path / "pairs.jsonl", _pairs())
    result = finetune(_recipe(base_run, pairs, pairs, lora_rank=2), tmp_path / "lora", quiet=True, plot=False)
    assert result.final["task_loss"] < result.summary["before"]["task_loss"]
    base, tuned = load_model(base_run)[0], load_model(tmp_path / "lora")[0]  # loads into a plain GPT
    b, t = base.state_dict(), tuned.state_dict()
    w = "layers.0.feed_forward.w_1.weight"
    delta = t[w] - b[w]
    assert delta.abs().max() > 0 and torch.linalg.matrix_rank(delta, atol=1e-6) <= 2
    assert torch.equal(t["token_embedding.weight"], b["token_embedding.weight"])  # not a target: frozen
    assert (tmp_path / "lora" / "adapter.safetensors").is_file()
    out = Completer.from_run(tmp_path / "lora").complete("Chinese: 我累了。\nEnglish:", max_new_tokens=5,
                                                          temperature=0)
    assert isinstance(out, str)


def test_a_malformed_record_names_the_file_and_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c", "response": 3}\n', encoding="utf-8")
    with pytest.raises(SFTDataError, match=r"pairs.jsonl:3: 'response' must be a string"):
        read_jsonl_pairs(path)
    path.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "c"\n', encoding="utf-8")
    with pytest.raises(SFTDataError, match=r"pairs.jsonl:2: not a JSON object"):
        read_jsonl_pairs(path)
    path.write_text('{"prompt": "a"}\n', encoding="utf-8")
    with pytest.raises(SFTDataError, match=r"pairs.jsonl:1: missing key 'response'"):
        read_jsonl_pairs(path)
    with pytest.raises(FileNotFoundError):
        read_jsonl_pairs(tmp_path / "none.jsonl")


def test_an_example_longer_than_the_context_names_its_record(base_run):
    _, tok = load_model(base_run)
    long = [Pair("Chinese: " + "我" * 60, " I'm tired.", "pairs.jsonl:7")]
    with pytest.raises(SFTDataError, match="pairs.jsonl:7: .* context of 48"):
        encode_pairs(long, tok, 48)
    long = [Pair("Chinese: 我", " I'm tired." * 8, "x:1")]
    (ex,) = encode_pairs(long, tok, 48, truncate=True)
    assert len(ex.ids) == 49
