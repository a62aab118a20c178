"""qkv explain (qkv.experiments.pronouns): the gold links located in the model's tokens, the resolution metric
on hand-built maps, and the command on a real tiny demo run."""

import json

import pytest
import torch

from qkv.cli import main
from qkv.data import synthetic as syn
from qkv.experiments import pronouns
from qkv.generation.api import Translator


def test_resolved_on_hand_built_rows():
    row = torch.tensor([[0.7, 0.2, 0.1],   # head 0: largest on key 0
                        [0.3, 0.6, 0.1],   # head 1: on key 1
                        [0.4, 0.4, 0.2]])  # head 2: a tie goes to the first key
    hits, weight = pronouns.resolved(row, target=0)
    assert hits.tolist() == [True, False, True]
    assert weight.tolist() == pytest.approx([0.7, 0.3, 0.4])


def test_pronoun_of_a_translation():
    assert pronouns.pronoun("Xiaoming is tired, he wants to sleep.") == "he"
    assert pronouns.pronoun("She is tired, Xiaoli wants to rest.") == "she"
    assert pronouns.pronoun("Xiaoming wants to sleep.") is None
    assert pronouns.pronoun("The shepherd sleeps.") is None  # a word, not a pronoun


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A tiny translator trained on the demo corpus (40 steps): enough to have every kind of map."""
    run = tmp_path_factory.mktemp("explain") / "run"
    assert main(["train", "mt", "--recipe", "demo", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                 "model.n_layers=1", "model.dropout=0", "data.demo_train=400", "data.demo_valid=40",
                 "data.demo_test=40", "train.steps=30", "train.warmup=5", "train.eval_every=30",
                 "train.eval_bleu_sentences=0", "train.test_beam=1", "train.threads=1", "--run", str(run),
                 "--quiet"]) == 0
    return run


def test_items_locate_each_gold_link_in_the_models_tokens(demo_run):
    tr = Translator.from_run(demo_run, device="cpu")
    examples = [syn.Example("tell_self", "小明", state="累了", other="小红"),
                syn.Example("two", "小明", wish="睡觉", place="在家", other="小红", refers_to_other=True),
                syn.Example("zero", "小红", state="饿了", wish="吃饭"),
                syn.Example("time_place", "小红", wish="吃饭", place="在家", time="今天")]  # no pronoun
    items = pronouns.items_of(examples, tr)
    assert len(items) == 3
    tok = tr.tokenizer
    piece = lambda ids, i: tok.id_to_token(ids[i]).replace("▁", "")  # noqa: E731
    tell, two, zero = items
    assert piece(tell.src, tell.antecedent).startswith("小") and "小明".startswith(piece(tell.src, tell.antecedent))
    assert "自己".startswith(piece(tell.src, tell.zh_row)) and tell.candidates == 2 and tell.needs_antecedent
    assert piece(tell.produced, tell.en_row) == "he"  # the row that writes "he"
    assert "小红".startswith(piece(two.src, two.antecedent)) and piece(two.src, two.zh_row) == "她"
    assert piece(two.produced, two.en_row) == "she" and not two.needs_antecedent
    assert zero.zh_row is None and piece(zero.produced, zero.en_row) == "she"
    assert zero.read[zero.antecedent_read] == zero.produced[zero.antecedent_read - 1]  # read is produced shifted


def test_qkv_explain_writes_the_table_the_json_and_the_heat_map(demo_run, capsys):
    assert main(["explain", "--run", str(demo_run)]) == 0
    out = capsys.readouterr().out
    assert "| kind | layer | head |" in out and "best head:" in out
    results = json.loads((demo_run / "pronouns.json").read_text())
    assert (demo_run / "pronouns.png").stat().st_size > 5000
    kinds = {(r["kind"], r["layer"], r["head"]) for r in results["heads"]}
    assert kinds == {(k, 0, h) for k in pronouns.KINDS for h in (0, 1)}  # 1 layer x 2 heads of each kind
    # The 80 held-out sentences of the run's valid and test splits, topped up to 600 that need their antecedent.
    assert results["sentences"] > 80 and results["needs_antecedent"] == pronouns.NEEDS_AT_LEAST
    for r in results["heads"]:
        assert 0 <= r["share"] <= 1 and 0 <= r["flip"] <= 1 and r["n"] > 0
    scored = [r for r in results["heads"] if r["n"] >= pronouns.MIN_PRONOUNS]
    assert results["best"]["share"] == max(r["share"] for r in scored)
    # Cross- and decoder self-attention are scored only where no Chinese word genders the English pronoun.
    assert all(r["n"] <= results["needs_antecedent"] for r in results["heads"] if r["kind"] != "encoder_self")
    names = [st["name"] for st in results["sets"]]
    assert names[0] == "resolving heads of the best head's layer" and "cross layer 0" in names
    for st in results["sets"]:
        assert sum(n for _, n in st["flip_by_template"].values()) == results["needs_antecedent"]
    seed = results["seed_sentence"]
    assert seed["sentence"] == ("小明累了，他想睡觉。" if results["best"]["kind"] == "encoder_self" else "小明累了，想睡觉。")


def test_qkv_explain_refuses_a_run_of_another_corpus(demo_run, tmp_path, capsys):
    other = tmp_path / "run"
    other.mkdir()
    config = json.loads((demo_run / "config.json").read_text())
    config["data"]["corpus"] = "multi30k"
    (other / "config.json").write_text(json.dumps(config))
    assert main(["explain", "--run", str(other)]) == 2
    assert "demo corpus" in capsys.readouterr().err


def test_held_out_sentences_are_topped_up_with_unseen_ones_that_need_their_antecedent(demo_run):
    from qkv.runs import Run

    every = pronouns.held_out(Run(demo_run))
    assert every[:5] == list(syn.demo_examples(0, 400, 40, 40)["valid"][:5])  # the run's own splits first
    assert len(set(every)) == len(every) and all(ex.held_out for ex in every)  # none seen in training
    assert sum(ex.template in syn.NEEDS_ANTECEDENT for ex in every) == pronouns.NEEDS_AT_LEAST
