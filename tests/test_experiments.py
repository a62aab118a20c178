"""The experiment runner: a tiny Table 3 grid writes its table, skips what is done, resumes what was cut."""

import json
import os
import subprocess
import sys

import torch

from qkv.cli import main
from qkv.experiments import search, table3
from qkv.experiments.grid import Variant, claim, read_results
from qkv.devices import cpu_identity
from qkv.settings import recipe_file
from qkv.training import loop, recipes
from qkv.weights import read_weights

TINY = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1", "model.max_len=64",
        "data.vocab_size=120", "data.max_tokens=200", "data.demo_train=100", "data.demo_valid=6", "data.demo_test=5",
        "data.max_src_len=40", "data.max_tgt_len=40"]


def grid_argv(tmp_path, name: str, *more: str) -> list[str]:
    return ["experiment", "table3", "--recipe", "demo", "--rows", "base,B", "--seeds", "1", "--steps", "4",
            "--out", str(tmp_path / name / "runs"), "--results", str(tmp_path / name / "results"), "--quiet",
            *more, *TINY]


def test_a_tiny_grid_writes_its_table_and_a_second_call_trains_nothing(tmp_path, capsys, monkeypatch):
    assert main(grid_argv(tmp_path, "g")) == 0
    results = tmp_path / "g" / "results"
    found = sorted(p.name for p in results.glob("*.json"))
    assert found == ["B_d_k16_seed1.json", "B_d_k32_seed1.json", "base_seed1.json"], found
    row = json.loads((results / "B_d_k16_seed1.json").read_text())
    assert row["overrides"] == ["model.d_k=16", "train.seed=1"] and row["steps"] == 4
    assert row["base_changes"] == TINY and row["length_ratio"] > 0  # how the grid changed its base, recorded
    assert 0 <= row["bleu"] <= 100 and row["ppl"] > 1 and row["parameters"] > 0
    assert row["machine"].startswith(cpu_identity() + ", ")  # the CPU its train_seconds were measured on
    base = json.loads((results / "base_seed1.json").read_text())
    assert row["parameters"] != base["parameters"]  # d_k 16 of d_model 16 over 2 heads: bigger keys
    md = (results / "table3.md").read_text()
    assert "| B | d_k=16 | 1 |" in md and "| 5.16 | 25.1 | 58M |" in md  # ours beside the paper's row
    assert (results / "table3.png").stat().st_size > 1000

    def never(*args, **kwargs):
        raise AssertionError("a finished variant was trained again")

    monkeypatch.setattr(table3, "train", never)
    assert main(grid_argv(tmp_path, "g")) == 0
    assert "3 of 3 variants scored" in capsys.readouterr().err
    # Compared with another grid's folder (here itself): every change keeps its sign, seed for seed.
    assert main(grid_argv(tmp_path, "g", "--report", "--against", str(results))) == 0
    against = (results / "against_results.md").read_text()
    assert "| B | d_k=16 | 1 |" in against and against.endswith("| 2 of 2 | | | 2 of 2 |\n"), against

    assert row["wall_seconds"] > 0 and row["resumed"] is False and "left:" not in capsys.readouterr().err
    # What the rest of a larger grid would take here, from the variants trained here.
    assert main(grid_argv(tmp_path, "g", "--report", "--rows", "base,A")) == 0
    hours = json.loads((results / "base_seed1.json").read_text())["wall_seconds"] * 4 / 3600  # the base's, 4 times
    assert f"the 4 left: about {hours:.1f} h with --jobs 1 on this CPU (the mean of the 1 variant trained here)" \
        in capsys.readouterr().err

    # Another budget on the same results: one line, nothing trained, never a table of two budgets.
    assert main(grid_argv(tmp_path, "g", "--steps", "5")) == 2
    err = capsys.readouterr().err
    assert "base_seed1.json: made with steps 4, this grid asks for 5" in err and "Traceback" not in err
    assert main(grid_argv(tmp_path, "g", "model.norm=pre")) == 2  # other changes to the base, alike
    assert "made with base_changes" in capsys.readouterr().err
    # A report shows whatever grid is there, as long as the results agree among themselves.
    assert main(grid_argv(tmp_path, "g", "--report", "--steps", "5")) == 0
    (results / "B_d_k32_seed1.json").write_text(json.dumps({**row, "steps": 5}))
    assert main(grid_argv(tmp_path, "g", "--report")) == 2
    assert "B_d_k32_seed1.json: made with steps 5, base_seed1.json with 4" in capsys.readouterr().err
    # A report with no result of its grid (a mistyped folder): one line, and no empty table left there.
    assert main(grid_argv(tmp_path, "typo", "--report")) == 2
    assert "no results of this grid to report" in capsys.readouterr().err
    assert not (tmp_path / "typo" / "results" / "table3.md").exists()


def test_an_interrupted_variant_resumes_to_the_result_of_an_uninterrupted_one(tmp_path, monkeypatch):
    assert main(grid_argv(tmp_path, "straight", "--rows", "base")) == 0
    real = loop.optimizer_step

    def dies(optimizer, loss, step, *args):
        if step == 3:  # after the checkpoint of step 2
            raise KeyboardInterrupt
        return real(optimizer, loss, step, *args)

    monkeypatch.setattr(loop, "optimizer_step", dies)
    assert main(grid_argv(tmp_path, "cut", "--rows", "base")) == 130  # interrupted, as by Ctrl-C
    monkeypatch.undo()
    assert not list((tmp_path / "cut" / "results").glob("*.json"))
    assert not list((tmp_path / "cut" / "runs").glob("*.claim"))  # the claim went with the process
    assert main(grid_argv(tmp_path, "cut", "--rows", "base")) == 0
    a, b = (json.loads(next((tmp_path / n / "results").glob("base*.json")).read_text()) for n in ("straight", "cut"))
    for key in ("bleu", "nll", "ppl", "parameters", "steps"):
        assert a[key] == b[key], key


def test_two_workers_side_by_side_fill_the_grid_once(tmp_path, capfd):
    """--jobs 2: two processes of the same command share the grid by their claims, each variant trained once."""
    argv = [a for a in grid_argv(tmp_path, "w", "--jobs", "2") if a != "--quiet"]  # the workers' log lines
    assert main(argv) == 0
    results, runs = tmp_path / "w" / "results", tmp_path / "w" / "runs"
    names = ["B_d_k16_seed1", "B_d_k32_seed1", "base_seed1"]
    assert sorted(p.stem for p in results.glob("*.json")) == names and not list(runs.glob("*.claim"))
    trained = [line.split(":")[1].strip() for line in capfd.readouterr().err.splitlines()
               if line.startswith("table3: ") and line.endswith(")") and ": training (" in line]
    assert sorted(trained) == names, trained


# A process that locks a claim file as a worker holds it, before it has written anything in it (a worker
# between creating its claim and writing its process id), and says so.
HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep(60)
"""


def test_a_held_claim_is_left_to_its_worker_and_a_dead_ones_is_free_at_once(tmp_path):
    variant = Variant(name="v", row="A")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "v.claim")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert (tmp_path / "v.claim").read_text() == ""  # no process id yet: the claim holds all the same
        with claim(tmp_path, variant) as mine:
            assert not mine
    finally:
        holder.kill()
        holder.wait()
    with claim(tmp_path, variant) as mine:  # its process is gone, and its lock with it
        assert mine and (tmp_path / "v.claim").read_text() == str(os.getpid())
        with claim(tmp_path, variant) as again:  # one holder, even within a process
            assert not again
    assert not (tmp_path / "v.claim").exists()


def test_a_claim_whose_file_was_replaced_before_its_lock_is_tried_again(tmp_path, monkeypatch):
    """Between a worker's open and its lock, the holder may remove the file and let go, and a third worker
    create and lock a new one: the lock then won is on a file no longer there, and must not count."""
    from qkv import locks

    path, third = tmp_path / "v.claim", []
    real = locks.fcntl.flock

    def flock(fd, operation):
        if not third:
            path.unlink()
            third.append(subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE,
                                          text=True))
            assert third[0].stdout.readline().strip() == "holding"
        return real(fd, operation)

    monkeypatch.setattr(locks.fcntl, "flock", flock)
    path.touch()  # a claim file left by a holder that is about to let go
    try:
        with claim(tmp_path, Variant(name="v", row="A")) as mine:
            assert not mine  # the third worker holds the file that is there now
    finally:
        third[0].kill()
        third[0].wait()


# Workers racing for one variant many times over: whoever holds it logs in and out, and nobody else may
# log in between.
RACER = """
import os, sys, time
from pathlib import Path
from qkv.experiments.grid import Variant, claim
out, log = Path(sys.argv[1]), sys.argv[2]
for _ in range(40):
    with claim(out, Variant(name="v", row="A")) as mine:
        if mine:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, b"in\\n")
            time.sleep(0.002)
            os.write(fd, b"out\\n")
            os.close(fd)
"""


def test_workers_racing_for_a_claim_hold_it_one_at_a_time(tmp_path):
    log = tmp_path / "log"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / "claims"), str(log)]) for _ in range(4)]
    assert [r.wait(timeout=120) for r in racers] == [0] * 4
    lines = log.read_text().split()
    assert lines and lines == ["in", "out"] * (len(lines) // 2)  # never two "in" in a row
    assert not list((tmp_path / "claims").glob("*.claim"))


def test_without_posix_locks_a_grid_runs_one_worker(tmp_path, monkeypatch, capsys):
    from qkv.cli import experiment as cli_experiment
    from qkv import locks

    monkeypatch.setattr(locks, "fcntl", None)
    with claim(tmp_path, Variant(name="v", row="A")) as mine:
        assert mine
    monkeypatch.setattr(cli_experiment, "SIDE_BY_SIDE", False)
    assert main(grid_argv(tmp_path, "w", "--jobs", "2")) == 2
    assert "--jobs 2: workers side by side need POSIX file locks" in capsys.readouterr().err
    assert not list((tmp_path / "w" / "results").glob("*.json"))


def test_the_grid_mirrors_the_paper_and_a_bad_row_is_one_line(capsys):
    grid = table3.variants()
    assert len([v for v in grid if v.row == "A"]) == 12 and len([v for v in grid if v.row == "E"]) == 9
    assert len(grid) == 39 and len({v.name for v in grid}) == 39
    assert all(v.tags["paper"] is None or v.tags["paper"] in table3.PAPER for v in grid)
    assert main(["experiment", "table3", "--rows", "Z"]) == 2
    err = capsys.readouterr().err
    assert "--rows: unknown ['Z']" in err and "D_P_drop00" in err  # the single changes are named too


def test_single_changes_are_picked_by_name_beside_whole_rows():
    picked = table3.variants(["base", "D_P_drop00", "E"], max_seeds=1)
    assert [v.name for v in picked] == ["base_seed1", "D_P_drop00_seed1", "E_learned_seed1", "E_RoPE_seed1",
                                        "E_none_seed1"]
    assert picked[1].overrides == ("model.dropout=0.0", "train.seed=1")
    assert {v.name for v in table3.variants()} >= {v.name for v in picked}  # the same names as the whole grid


def test_each_variant_is_compared_with_the_base_seed_for_seed():
    grid = [Variant(name=f"{row}_seed{s}", row=row, label=row, seed=s) for row in ("base", "A", "E") for s in (1, 2, 3)]

    def res(bleu, ppl):
        return {"bleu": bleu, "ppl": ppl, "parameters": 10, "steps": 4}

    results = {"base_seed1": res(30.0, 11.0), "base_seed2": res(31.0, 10.5), "A_seed1": res(31.0, 10.9),
               "A_seed2": res(31.5, 10.6), "A_seed3": res(20.0, 20.0), "E_seed3": res(29.0, 12.0)}
    rows = {r["row"]: r for r in table3.table(results, grid)}
    a = rows["A"]
    # Seeds 1 and 2 pair (+1.0, +0.5); seed 3 has no base to pair with, though it counts in the mean.
    assert a["seeds"] == 3 and a["paired"] == 2
    assert abs(a["bleu_delta"] - 0.75) < 1e-9 and abs(a["bleu_delta_sd"] - 0.5 ** 0.5 / 2) < 1e-9
    assert abs(a["ppl_delta"] - 0.0) < 1e-9
    assert "paired" not in rows["E"] and "paired" not in rows["base"]
    md = table3.markdown(list(rows.values()))
    assert "| +0.00 ± 0.14 (2) | +0.8 ± 0.4 (2) |" in md
    assert all(line.count("|") == 13 for line in md.splitlines())  # every line has the header's 12 cells


def test_two_budgets_are_compared_seed_for_seed():
    grid = [Variant(name=f"{row}_seed{s}", row=row, label=row, seed=s) for row in ("base", "A") for s in (1, 2)]

    def res(bleu, ppl, steps):
        return {"bleu": bleu, "ppl": ppl, "parameters": 10, "steps": steps}

    short = {"base_seed1": res(25.0, 15.0, 430), "base_seed2": res(25.5, 14.8, 430),
             "A_seed1": res(24.0, 15.8, 430), "A_seed2": res(26.0, 15.0, 430)}
    # Seed 1 keeps both signs; seed 2 keeps the perplexity's (+0.2, +0.1) and not the BLEU's (+0.5, -0.5).
    long = {"base_seed1": res(30.0, 11.0, 600), "base_seed2": res(30.5, 11.1, 600),
            "A_seed1": res(29.0, 11.3, 600), "A_seed2": res(30.0, 11.2, 600)}
    assert table3.paired_deltas(short, grid)["A_seed2"] == {"bleu": 0.5, "ppl": short["A_seed2"]["ppl"] - 14.8}
    md = table3.against(short, long, grid)
    assert "| A | A | 2 | +0.50 | +0.20 | 2 of 2 | -0.2 | -0.8 | 1 of 2 |" in md, md
    assert "PPL - base, 430 steps | PPL - base, 600 steps" in md and md.endswith("| 2 of 2 | | | 1 of 2 |\n")
    # A variant without a base of its seed in one of the two grids is left out of both.
    del long["base_seed2"]
    assert "| A | A | 1 | +0.80 | +0.30 | 1 of 1 | -1.0 | -1.0 | 1 of 1 |" in table3.against(short, long, grid)


def test_the_plot_labels_points_away_from_the_base_without_overlapping():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    base = {"ppl": 15.0, "bleu": 25.0}
    assert table3._beside({"ppl": 15.5, "bleu": 24.5}, base)  # within 1 BLEU and 6%: left unlabelled
    assert not table3._beside({"ppl": 16.5, "bleu": 24.5}, base)  # 10% more perplexity
    assert not table3._beside({"ppl": 15.0, "bleu": 23.5}, base)  # 1.5 BLEU less
    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([10, 20, 20, 15], [10, 15, 15.1, 20], "o")
    fig.canvas.draw()
    table3._place_labels(ax, [("one far off", 10, 10), ("first", 20, 15), ("second", 20, 15.1)])
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) == 3
    assert not boxes[1].overlaps(boxes[2]), "two labels of nearby points drawn over each other"
    frame = ax.bbox  # the points at the right edge are labelled on their left, inside the axes
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes), [(b.x0, b.x1) for b in boxes]


def search_argv(tmp_path, *more: str) -> list[str]:
    return ["experiment", "search", "--recipe", "demo", "--steps", "4", "--knobs", "model.norm,dropout-0.2",
            "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--quiet", *more, *TINY]


def test_a_tiny_search_scores_each_knob_on_the_validation_split_and_keeps_its_results(tmp_path, capsys, monkeypatch):
    assert main(search_argv(tmp_path)) == 0
    results = tmp_path / "results"
    assert sorted(p.name for p in results.glob("*.json")) == ["base_seed1.json", "dropout-0.2_seed1.json",
                                                                "norm-pre_seed1.json"]
    row = json.loads((results / "norm-pre_seed1.json").read_text())
    assert row["overrides"] == ["model.norm=pre", "train.seed=1"] and row["steps"] == 4
    assert row["recipe"] == "demo" and row["base_changes"] == TINY and 0 <= row["bleu"] <= 100
    cfg = json.loads((tmp_path / "runs" / "norm-pre_seed1" / "config.json").read_text())
    assert cfg["data"]["test"] == cfg["data"]["valid"]  # chosen on the validation split: no test set read
    assert cfg["train"]["test_beam"] == 4 and cfg["train"]["average_last"] == 0
    md = (results / "search.md").read_text()
    assert "| model.norm | norm-pre | 1 |" in md and "| base | base | 1 |" in md
    assert (results / "search.png").stat().st_size > 1000

    monkeypatch.setattr(table3, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained again")))
    assert main(search_argv(tmp_path)) == 0 and "3 of 3 variants scored" in capsys.readouterr().err
    assert main(search_argv(tmp_path, "--steps", "5")) == 2  # another budget on the same results: one line
    assert "made with steps 4, this grid asks for 5" in capsys.readouterr().err
    assert main(["experiment", "search", "--knobs", "model.nope"]) == 2
    err = capsys.readouterr().err
    assert "--knobs: unknown ['model.nope']" in err and "norm-pre" in err and "Traceback" not in err


def test_a_search_at_the_whole_budget_scores_the_average_of_its_kept_checkpoints_once(tmp_path, capsys, monkeypatch):
    argv = ["experiment", "search", "--recipe", "demo", "--steps", "4", "--knobs", "norm-pre", "--out",
            str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--quiet", *TINY, "train.eval_every=2"]
    assert main(argv) == 0
    row = json.loads((tmp_path / "results" / "norm-pre_seed1.json").read_text())
    assert row["average"]["checkpoints"] == [2, 4] and 0 <= row["average"]["bleu"] <= 100
    run = tmp_path / "runs" / "norm-pre_seed1"
    average, _ = read_weights(run / "average.safetensors")
    steps = [read_weights(run / f"step_000000{n}.safetensors")[0] for n in (2, 4)]
    name = "decoder_layers.0.feed_forward.w_1.weight"
    assert not torch.equal(steps[0][name], steps[1][name])  # two different checkpoints, and their mean
    torch.testing.assert_close(average[name], (steps[0][name] + steps[1][name]) / 2)
    # decoded at each length penalty, the recipe's own (0.6) giving the average's BLEU
    scored = row["average"]["length_penalty"]
    assert list(scored) == [search.alpha_key(a) for a in search.LENGTH_PENALTIES]
    assert scored["0.6"]["bleu"] == row["average"]["bleu"] and all(s["length_ratio"] > 0 for s in scored.values())
    best = max(scored, key=lambda a: scored[a]["bleu"])
    md = (tmp_path / "results" / "search.md").read_text()
    assert "BLEU, averaged" in md and f"| {row['bleu']:.1f} | {row['average']['bleu']:.1f} |" in md
    assert f"| {scored[best]['bleu']:.1f} (α {best}) |" in md

    # a length penalty added to the search: the runs' averages are decoded at it alone, the rest kept
    calls = []
    real = search.averaged
    monkeypatch.setattr(search, "LENGTH_PENALTIES", (*search.LENGTH_PENALTIES, 5.0))
    monkeypatch.setattr(search, "averaged", lambda run, alphas: calls.append(list(alphas)) or real(run, alphas))
    assert main(argv) == 0 and calls == [[5.0], [5.0]]  # the base and norm-pre
    again = json.loads((tmp_path / "results" / "norm-pre_seed1.json").read_text())["average"]["length_penalty"]
    assert list(again) == [*scored, "5"] and again["1"] == scored["1"]

    monkeypatch.setattr(search, "averaged", lambda *a: (_ for _ in ()).throw(AssertionError("averaged again")))
    assert main(argv) == 0 and "2 of 2 variants scored" in capsys.readouterr().err


def test_variants_combined_are_one_variant_of_both_changes_whatever_their_order(tmp_path, capsys):
    grid = search.variants(["dropout-0.2+norm-pre", "norm-pre+dropout-0.2"], seeds=2)
    assert [v.name for v in grid] == ["base_seed1", "base_seed2", "norm-pre+dropout-0.2_seed1",
                                      "norm-pre+dropout-0.2_seed2"]  # one name, in the order of the knobs
    both = grid[2]
    assert both.row == search.COMBINED_ROW and both.overrides == ("model.norm=pre", "model.dropout=0.2", "train.seed=1")
    model = search.recipe_of(both, "multi30k_de_en", 863).model
    assert (model.norm, model.dropout) == ("pre", 0.2)
    for bad, says in (("dropout-0.2+dropout-0.3", "sets one knob twice"), ("dropout-0.2+nope-1", "combines ['nope-1']")):
        assert main(["experiment", "search", "--recipe", "multi30k_de_en", "--knobs", bad]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    # a second round: the variants scored and the two together, in the table and in the plot's last knob panel
    knobs = ["norm-pre", "dropout-0.2", "dropout-0.2+norm-pre"]
    assert main(search_argv(tmp_path, "--knobs", ",".join(knobs))) == 0
    assert json.loads((tmp_path / "results" / "norm-pre+dropout-0.2_seed1.json").read_text())["overrides"] == [
        "model.norm=pre", "model.dropout=0.2", "train.seed=1"]
    md = (tmp_path / "results" / "search.md").read_text()
    assert "| combined | norm-pre+dropout-0.2 | 1 |" in md and "| model.norm | norm-pre | 1 |" in md
    grid = search.variants(knobs)
    rows = search.table(read_results(tmp_path / "results", grid), grid)
    base = next(r for r in rows if r["row"] == "base")
    assert [x for x, _ in search._combined(rows, base)] == ["base", "norm-pre", "dropout-0.2", "norm-pre+\ndropout-0.2"]


def test_a_search_keeps_the_base_it_ran_from_after_the_recipe_adopts_a_variant(tmp_path, capsys, monkeypatch):
    recipe = tmp_path / "mine.yaml"
    shipped = recipe_file("mt", "demo").read_text()
    recipe.write_text(shipped)
    argv = ["experiment", "search", "--recipe", str(recipe), "--steps", "4", "--knobs", "dropout-0.2,norm-pre",
            "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--quiet", *TINY]
    assert main(argv) == 0
    capsys.readouterr()
    recorded = json.loads((tmp_path / "results" / "norm-pre_seed1.json").read_text())["base_knobs"]
    assert recorded["model.dropout"] == 0.1 and recorded["model.norm"] == "post"

    # the recipe adopts dropout 0.2: its search has no dropout-0.2 to train (it is the base), nor combinations of it
    recipe.write_text(shipped.replace("dropout: 0.1", "dropout: 0.2", 1))
    now = search.base_knobs(recipe, TINY)
    assert now == {**recorded, "model.dropout": 0.2} and search.same_as_base(now) == ["dropout-0.2"]
    names = [v.name for v in search.variants(["dropout-0.2", "norm-pre", "dropout-0.2+norm-pre"], base=now)]
    assert names == ["base_seed1", "norm-pre_seed1"]
    # training into the old folder: one line that names the one knob that differs
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "search: dropout-0.2 is the base's own value" in err
    assert "made with base_knobs {'model.dropout': 0.1}, this grid asks for {'model.dropout': 0.2}" in err
    assert "Traceback" not in err
    # its report still shows the base it ran from, and says what the recipe has changed since
    assert main([*argv, "--report"]) == 0
    md = (tmp_path / "results" / "search.md").read_text()
    assert "| model.dropout | dropout-0.2 | 1 |" in md
    assert "The base is the recipe as it was when these ran: model.dropout 0.1 (now 0.2)." in md
    grid = search.variants(["dropout-0.2"])
    rows = search.table(read_results(tmp_path / "results", grid), grid)
    base = next(r for r in rows if r["row"] == "base")
    assert [x for x, _ in search._knob(rows, base, recorded, "model.dropout")] == [0.1, 0.2]

    # the search around today's recipe gets its own --results, and its runs follow it (not the old runs resumed)
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "search", "--recipe", str(recipe), "--steps", "4", "--knobs", "dropout-0.2,norm-pre",
                 "--results", str(tmp_path / "today"), "--quiet", *TINY]) == 0
    assert sorted(p.name for p in (tmp_path / "today").glob("*.json")) == ["base_seed1.json", "norm-pre_seed1.json"]
    assert json.loads((tmp_path / "today" / "base_seed1.json").read_text())["base_knobs"] == now
    assert json.loads((tmp_path / "runs" / "search" / "today" / "base_seed1" / "config.json").read_text())[
        "model"]["dropout"] == 0.2


def test_the_search_varies_one_knob_at_a_time_and_knows_each_recipes_budget(capsys):
    grid = search.variants()
    assert grid[0].name == "base_seed1" and len({v.name for v in grid}) == len(grid)
    assert all(v.overrides[-1] == "train.seed=1" for v in grid)
    wide = next(v for v in grid if v.label == "d_model-384")
    assert wide.overrides[:3] == ("model.d_model=384", "model.n_heads=6", "model.d_ff=1536")  # the base's shape
    assert search.short_steps("multi30k_de_en") == 3452 // 4
    # a quarter of en->de (350) and of zh->en (601) would end inside their warmup of 400: twice the warmup
    assert search.short_steps("multi30k_en_de") == search.short_steps("cmn_eng_zh_en") == 800
    short, whole = (search.recipe_of(grid[0], "multi30k_de_en", steps).train for steps in (863, 3452))
    assert (short.eval_every, short.keep_checkpoints) == (431, 1)  # halfway, one checkpoint to resume from
    shipped = recipes.load("mt", "multi30k_de_en").train
    # at the whole budget: the recipe's cadence and checkpoints, to choose averaging on afterwards
    assert (whole.eval_every, whole.keep_checkpoints) == (shipped.eval_every, shipped.keep_checkpoints) == (250, 5)
    assert short.average_last == whole.average_last == 0 and whole.steps == 3452
    assert main(["experiment", "search", "--recipe", "demo"]) == 2  # no budget known: --steps
    assert "no step budget is known for the recipe 'demo'" in capsys.readouterr().err


def test_a_one_panel_search_plot_shows_its_whole_title(tmp_path):
    """One knob tried is one panel, narrower than its title: the title wraps instead of running off the image."""
    import numpy as np
    from PIL import Image

    rows = [{"row": "base", "label": "base", "bleu": 7.6, "bleu_sd": 0.0},
            {"row": "train.peak_lr", "label": "peak_lr-0.002", "bleu": 1.3, "bleu_sd": 0.0}]
    png = search.plot(rows, {"train.peak_lr": 1e-3},
                      "cmn_eng_zh_en: validation BLEU against each knob, 800 steps", tmp_path / "search.png")
    pixels = np.asarray(Image.open(png).convert("L"))
    assert pixels.shape[1] < 400  # one panel
    edges = np.concatenate([pixels[:, :2], pixels[:, -2:]], axis=1)
    assert edges.min() > 200, "ink at the image's left or right edge: the title is cut"
