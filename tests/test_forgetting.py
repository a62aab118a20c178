"""The forgetting experiment (qkv.experiments.forgetting): its grid, its recipes and its report.

The experiment itself runs for an hour (docs/EXPERIMENTS.md); these tests check what it is made of
without training: every variant and seed, the settings each one fine-tunes with, the table's means and
spreads over seeds, and the report.
"""

import pytest

from qkv.experiments import forgetting
from qkv.training.finetune import FinetuneConfig


def test_every_cure_with_every_seed_seed_one_first():
    grid = forgetting.variants()
    kinds = {v.name.rsplit("_seed", 1)[0] for v in grid}
    assert kinds == {"sft", "mix0.1", "mix0.3", "mix1", "kl0.1", "kl0.3", "kl1", "lora8", "control"}
    assert len(grid) == len(kinds) * len(forgetting.SEEDS) == len({v.name for v in grid})
    assert [v.seed for v in grid[:len(kinds)]] == [1] * len(kinds)  # one pass of seed 1 gives the whole table
    assert len(forgetting.variants(max_seeds=1)) == len(kinds)


def test_each_variant_fine_tunes_with_its_own_cure_and_seed():
    by_name = {v.name: v for v in forgetting.variants()}
    cfg = forgetting.finetune_config(by_name["mix0.3_seed2"], steps=300)
    assert isinstance(cfg, FinetuneConfig) and (cfg.mix, cfg.kl, cfg.lora_rank, cfg.seed) == (0.3, 0.0, 0, 2)
    assert cfg.warmup == 30 and cfg.threads == 1
    kl = forgetting.finetune_config(by_name["kl1_seed3"], steps=300)
    assert (kl.mix, kl.kl, kl.seed) == (0.0, 1.0, 3)
    lora = forgetting.finetune_config(by_name["lora8_seed1"], steps=100)
    assert lora.lora_rank == 8 and lora.lr > FinetuneConfig(**forgetting.FINETUNE).lr and lora.warmup == 10
    sft = forgetting.finetune_config(by_name["sft_seed1"], steps=300)
    assert (sft.mix, sft.kl, sft.lora_rank) == (0.0, 0.0, 0)


def test_the_base_recipe_covers_the_task_at_context_128(tmp_path):
    recipe = forgetting.base_recipe(tmp_path / "task.txt", steps=2000)
    assert recipe.context == 128 and recipe.model.max_len == 128 and recipe.data.tokenizer == "char"
    assert recipe.data.vocab_extra == [str(tmp_path / "task.txt")] and recipe.train.steps == 2000
    assert recipe.train.warmup == 100


def fake_results():
    grid = forgetting.variants(max_seeds=2)
    results = {}
    for v in grid:
        k = 1.0 if v.seed == 1 else 3.0
        results[v.name] = {"trainable_parameters": 100, "exact_match": 10 * k, "bleu": 20 * k, "task_loss": k,
                           "pretrain_loss": 2.0 + 0.1 * k, "train_seconds": 60 * k}
    return grid, results


def test_the_table_gives_mean_and_spread_over_seeds_and_the_change_from_the_base():
    grid, results = fake_results()
    base = {"exact_match": 0.0, "bleu": 0.0, "task_loss": 3.0, "pretrain_loss": 2.0}
    rows = forgetting.table(results, grid, base)
    assert len(rows) == 9 and all(r["n_seeds"] == 2 for r in rows)
    sft = next(r for r in rows if r["variant"] == "sft")
    assert sft["exact_match"] == pytest.approx(20.0) and sft["exact_match_sd"] == pytest.approx(14.142, abs=1e-3)
    assert sft["forgetting"] == pytest.approx(0.2)
    del results["sft_seed2"]  # a seed not scored yet: the row has one
    assert next(r for r in forgetting.table(results, grid, base) if r["variant"] == "sft")["n_seeds"] == 1
    md = forgetting.markdown(rows, base)
    assert "| plain SFT (λ = 0) | 2 | 100 | 20.0 ± 14.1 |" in md and "| base (no fine-tuning) |" in md


def test_the_report_is_written_from_the_results_there_are(tmp_path):
    from qkv.files import write_json

    grid, results = fake_results()
    assert forgetting.write_report(tmp_path, grid) == []  # no base scored yet: nothing to compare
    write_json(tmp_path / "base.json", {"exact_match": 0.0, "bleu": 0.0, "task_loss": 3.0, "pretrain_loss": 2.0})
    for name, r in results.items():
        write_json(tmp_path / f"{name}.json", r)
    md, png = forgetting.write_report(tmp_path, grid)
    assert md.read_text(encoding="utf-8").count("\n") == 12 and png.stat().st_size > 10_000
