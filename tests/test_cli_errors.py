"""Every command with a bad input of each class: one line ``qkv <command>: error: ...`` that names the problem,
the exit code of its class (2 bad input, 1 a failure while running), and never a traceback.

The classes: a run that is not there, of the wrong kind, without its config, with a damaged config,
tokenizer or weights, weights of another model; a device that does not exist; a file that is not
there; a recipe that is not YAML, an unknown key, a bad value; numbers out of range. Each case runs
the real ``qkv`` entry point in this process (a traceback would be an exception here: the test fails);
the last test runs a few as subprocesses and reads their stderr.
"""

import json
import shutil
import subprocess
import sys

import pytest

from qkv.cli import main

LM_RECIPE = ("model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, max_len: 16}}\n"
             "data: {{path: {text}}}\n"
             "train: {{steps: 2, batch_size: 2, warmup: 1, eval_every: 2, eval_iters: 1}}\n")


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """Real tiny runs (a GPT and a translator, trained for 2 steps) and broken copies of them, by name."""
    root = tmp_path_factory.mktemp("cli_errors")
    (root / "text.txt").write_text("To be, or not to be, that is the question.\n" * 40, encoding="utf-8")
    (root / "lm.yaml").write_text(LM_RECIPE.format(text=root / "text.txt"), encoding="utf-8")
    (root / "sft.jsonl").write_text('{"prompt": "To be", "response": " or not"}\n' * 8, encoding="utf-8")
    assert main(["train", "lm", "--recipe", str(root / "lm.yaml"), "--run", str(root / "lm"), "--quiet"]) == 0
    assert main(["train", "mt", "--recipe", "demo", "--run", str(root / "mt"), "--quiet", "train.steps=2",
                 "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1", "train.eval_every=2",
                 "train.eval_bleu_sentences=4", "data.demo_train=200", "data.demo_valid=8", "data.demo_test=8"]) == 0

    def broken(name, damage):
        shutil.copytree(root / "mt", root / name)
        damage(root / name)

    (root / "empty").mkdir()
    broken("badconfig", lambda d: (d / "config.json").write_text('{"model": ', encoding="utf-8"))
    broken("badtok", lambda d: (d / "tokenizer.json").write_text("nonsense", encoding="utf-8"))
    broken("badweights", lambda d: (d / "model.safetensors").write_bytes(b"garbage"))
    broken("badheads", lambda d: (d / "config.json").write_text(json.dumps(
        {**json.loads((d / "config.json").read_text()),
         "model": {**json.loads((d / "config.json").read_text())["model"], "n_heads": 3}}), encoding="utf-8"))
    # A run's config.json is read as a recipe is: a key no recipe has, anywhere in it, is refused by name.
    for kind in ("mt", "lm"):
        edit = lambda d, change: (d / "config.json").write_text(json.dumps(change(json.loads((d / "config.json").read_text()))))
        for name, change in {"topkey": lambda c: {**c, "note": "mine"},
                             "section": lambda c: {**{k: v for k, v in c.items() if k != "data"}, "dta": c["data"]},
                             "trainkey": lambda c: {**c, "train": {**c["train"], "stepz": 3}}}.items():
            shutil.copytree(root / kind, root / f"{kind}_{name}")
            edit(root / f"{kind}_{name}", change)
    (root / "binary.txt").write_bytes(b"\xff\xfe not UTF-8\n")
    (root / "bad.yaml").write_text("model: [\n", encoding="utf-8")
    (root / "empty.yaml").write_text("# nothing yet\n", encoding="utf-8")
    (root / "typo.yaml").write_text("modle: {}\n", encoding="utf-8")
    (root / "negative.yaml").write_text("model:\n  d_model: -3\n", encoding="utf-8")
    (root / "bad.jsonl").write_text('{"prompt": "a"}\n', encoding="utf-8")
    return root


# (argv with {R} for the place, exit code, what the one line must say)
CASES = [
    # Runs that are not what the command needs.
    (["translate", "--run", "{R}/nowhere"], 2, "run directory not found: {R}/nowhere"),
    (["translate", "--run", "{R}/lm"], 2, "this is a GPT run: use qkv generate"),
    (["generate", "--run", "{R}/mt", "x"], 2, "this is a translation run: use qkv translate"),
    (["eval", "lm", "--run", "{R}/mt"], 2, "this is a translation run: use qkv eval mt"),
    (["eval", "mt", "--run", "{R}/lm"], 2, "not an encoder-decoder"),
    (["train", "mt", "--run", "{R}/lm", "--resume"], 2, "this is a GPT run: use qkv train lm --resume"),
    (["train", "lm", "--run", "{R}/mt", "--resume"], 2, "this is a translation run: use qkv train mt --resume"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new1", "--init-from", "{R}/mt"], 2,
     "--init-from needs a run of"),
    (["finetune", "--run", "{R}/mt", "--data", "{R}/sft.jsonl", "--out", "{R}/ft1", "train.warmup=0"], 2,
     "qkv finetune needs a run of"),
    (["plot", "attention", "--run", "{R}/empty", "hi"], 2, "{R}/empty: no config.json"),
    (["export", "hf", "--run", "{R}/nowhere", "--out", "{R}/hf1"], 2, "run directory not found: {R}/nowhere"),
    (["export", "ctranslate2", "--run", "{R}/empty", "--out", "{R}/ct1"], 2, "{R}/empty: no config.json"),
    (["generate", "--run", "{R}/badconfig", "x"], 2, "{R}/badconfig/config.json:1: not valid JSON"),
    (["translate", "--run", "{R}/badtok"], 2, "{R}/badtok/tokenizer.json: not a JSON tokenizer file"),
    (["translate", "--run", "{R}/badweights"], 1, "{R}/badweights/model.safetensors: not a readable safetensors"),
    (["eval", "mt", "--run", "{R}/badheads"], 2, "d_model=16 is not divisible by n_heads=3"),
    # A run's config.json with a key no recipe has: the file, the key, the nearest known one.
    (["translate", "--run", "{R}/mt_topkey"], 2, "{R}/mt_topkey/config.json: unknown key 'note'"),
    (["translate", "--run", "{R}/mt_section"], 2,
     "{R}/mt_section/config.json: unknown key 'dta' (did you mean 'data'?)"),
    (["translate", "--run", "{R}/mt_trainkey"], 2,
     "{R}/mt_trainkey/config.json: train: unknown key 'stepz' (did you mean 'steps'?)"),
    (["eval", "mt", "--run", "{R}/mt_section"], 2, "unknown key 'dta' (did you mean 'data'?)"),
    (["generate", "--run", "{R}/lm_topkey", "x"], 2, "{R}/lm_topkey/config.json: unknown key 'note'"),
    (["generate", "--run", "{R}/lm_section", "x"], 2,
     "{R}/lm_section/config.json: unknown key 'dta' (did you mean 'data'?)"),
    (["generate", "--run", "{R}/lm_trainkey", "x"], 2,
     "{R}/lm_trainkey/config.json: train: unknown key 'stepz' (did you mean 'steps'?)"),
    (["eval", "lm", "--run", "{R}/lm_section"], 2, "unknown key 'dta' (did you mean 'data'?)"),
    (["train", "lm", "--run", "{R}/lm_topkey", "--resume"], 2, "{R}/lm_topkey/config.json: unknown key 'note'"),
    (["train", "mt", "--run", "{R}/mt_section", "--resume"], 2, "unknown key 'dta' (did you mean 'data'?)"),
    (["export", "hf", "--run", "{R}/mt_topkey", "--out", "{R}/hf2"], 2, "{R}/mt_topkey/config.json: unknown key"),
    (["translate", "--run", "{R}/mt", "--weights", "{R}/lm/model.safetensors"], 2,
     "cannot load into Transformer: missing keys"),
    (["translate", "--run", "{R}/mt", "--weights", "nope"], 2, "--weights nope: no such weights file"),
    (["train", "lm", "--run", "{R}/nowhere", "--resume"], 2, "run directory not found"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/lm"], 2, "already holds a run"),
    (["finetune", "--run", "{R}/lm", "--data", "{R}/sft.jsonl", "--out", "{R}/lm", "train.warmup=0"], 2,
     "--out must differ from the base --run"),
    (["finetune", "--run", "{R}/lm", "--data", "{R}/sft.jsonl", "--out", "{R}/ft2", "--resume", "train.warmup=0"],
     2, "nothing to resume"),
    # Devices that are not there.
    (["translate", "--run", "{R}/mt", "--device", "tpu"], 2, "unknown device 'tpu'"),
    (["eval", "lm", "--run", "{R}/lm", "--device", "cuda:3"], 2, "torch sees no CUDA device"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new2", "train.device=gpu"], 2, "unknown device 'gpu'"),
    # Files that are not there, or not text.
    (["translate", "--run", "{R}/mt", "--input", "{R}/none.txt"], 2, "input file not found: {R}/none.txt"),
    (["translate", "--run", "{R}/mt", "--input", "{R}/text.txt", "--output", "{R}/mt"], 2, "{R}/mt: Is a directory"),
    (["eval", "mt", "--hyp", "{R}/none", "--ref", "{R}/text.txt"], 2, "file not found: {R}/none"),
    (["eval", "mt", "--hyp", "{R}/text.txt", "--ref", "{R}/sft.jsonl"], 2, "must be line-aligned"),
    (["eval", "lm", "--run", "{R}/lm", "--text", "{R}/binary.txt"], 2, "{R}/binary.txt:1: not valid UTF-8"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new3", "data.path={R}/binary.txt"], 2,
     "{R}/binary.txt:1: not valid UTF-8"),
    (["finetune", "--run", "{R}/lm", "--data", "{R}/none.jsonl", "--out", "{R}/ft3"], 2, "no such fine-tuning file"),
    (["finetune", "--run", "{R}/lm", "--data", "{R}/bad.jsonl", "--out", "{R}/ft4"], 2,
     "{R}/bad.jsonl:1: missing key 'response'"),
    # Recipes and overrides.
    (["train", "lm", "--recipe", "{R}/none.yaml", "--run", "{R}/new5"], 2, "recipe file not found"),
    (["train", "lm", "--recipe", "{R}/bad.yaml", "--run", "{R}/new6"], 2, "{R}/bad.yaml:2: not valid YAML"),
    (["train", "lm", "--recipe", "{R}/typo.yaml", "--run", "{R}/new7"], 2, "unknown key 'modle' (did you mean 'model'?)"),
    (["train", "lm", "--recipe", "{R}/negative.yaml", "--run", "{R}/negrun"], 2,
     "{R}/negative.yaml: ModelConfig.d_model must be positive, got -3"),
    (["train", "lm", "--recipe", "shakespear"], 2, "did you mean 'shakespeare_char'?"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new8", "train.lrr=1"], 2, "did you mean 'lr'?"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new9", "train.lr=-1"], 2, "lr > 0"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new10", "model.d_model=abc"], 2, "expected an integer"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new11", "train.lr"], 2, "not of the form key=value"),
    (["train", "mt", "--recipe", "demo", "--run", "{R}/new12", "data.corpus=nope"], 2, "unknown corpus 'nope'"),
    (["train", "mt", "--recipe", "demo", "--run", "{R}/new13", "train.test_beam=0"], 2, "test_beam"),
    (["demo", "--run", "{R}/new14", "train.steps=-3"], 2, "train.steps must be >= 1"),
    # Recipes that pass for numbers but cannot mean what they say.
    (["train", "mt", "--recipe", "demo", "--run", "{R}/new15", "train.peak_lr=inf"], 2,
     "train.peak_lr must be a finite number >= 0"),
    (["train", "lm", "--recipe", "{R}/lm.yaml", "--run", "{R}/new16", "train.lr=inf"], 2, "need a finite lr > 0"),
    (["finetune", "--run", "{R}/lm", "--data", "{R}/sft.jsonl", "--out", "{R}/ft6", "train.lr=inf",
      "train.warmup=0"], 2, "need a finite lr > 0"),
    (["train", "lm", "--recipe", "{R}/empty.yaml", "--run", "{R}/new17"], 2, "{R}/empty.yaml: the recipe is empty"),
    (["train", "mt", "--recipe", "{R}/empty.yaml", "--run", "{R}/new18"], 2, "{R}/empty.yaml: the recipe is empty"),
    (["train", "mt", "--recipe", "demo", "--run", "{R}/new19", "data.demo_valid=0"], 2,
     "the validation split 'valid' of demo is empty"),
    (["train", "mt", "--recipe", "demo", "--run", "{R}/new20", "data.max_tokens=1"], 2,
     "data.max_tokens=1 does not fit one sentence"),
    (["finetune", "--run", "{R}/lm", "--data", "{R}/sft.jsonl", "--out", "{R}/ft5", "--mix", "-1",
      "train.warmup=0"], 2, "must be >= 0"),
    # Values checked against the model.
    (["generate", "--run", "{R}/lm", "--top-p", "2", "x"], 2, "top_p must be in (0, 1]"),
    (["generate", "--run", "{R}/lm", "-n", "2", "x" * 100], 2, "exceeds the model's context of 16 tokens"),
    (["translate", "--run", "{R}/mt", "--nbest", "8", "--beam", "2"], 2, "need 1 <= --nbest <= --beam"),
    (["explore", "--port", "99999"], 2, "--port must be in 0..65535"),
    (["plot", "attention", "--run", "{R}/mt", "   "], 2, "the text is empty"),
    (["plot", "curves", "--run", "{R}/nowhere"], 2, "no metrics.jsonl"),
    (["data", "fetch", "nope"], 2, "unknown corpus 'nope'"),
    (["info", "--preset", "nope"], 2, "unknown preset 'nope'"),
]
# Refused by argparse as the arguments are read: its usage line, then one error line (exit 2).
USAGE_CASES = [
    (["generate", "--run", "r", "-n", "0", "x"], "argument -n/--max-new-tokens: must be an integer >= 1, got 0"),
    (["finetune", "--run", "r", "--data", "d", "--out", "o", "--lora", "0"], "argument --lora: must be an integer >= 1"),
    (["info", "--vocab", "0"], "argument --vocab: must be an integer >= 1, got 0"),
    (["translate", "--run", "r", "--alpha", "nan"], "argument --alpha: must be a finite number"),
    (["data", "verify"], "invalid choice: 'verify'"),
    (["train", "mt", "--recipe", "demo", "--data-dir", "/nowhere"], "argument --data-dir: no such directory: /nowhere"),
    (["data", "list", "--data-dir", "/nowhere"], "argument --data-dir: no such directory: /nowhere"),
]


@pytest.mark.parametrize("argv, code, says", CASES, ids=[" ".join(c[0][:2]) + f" #{i}" for i, c in enumerate(CASES)])
def test_a_bad_input_is_one_line_with_its_exit_code(place, capsys, monkeypatch, argv, code, says):
    monkeypatch.delenv("QKV_DEBUG", raising=False)
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # commands that read stdin find it empty
    argv = [a.replace("{R}", str(place)) for a in argv]
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"qkv {argv[0]}: error: "), err
    assert says.replace("{R}", str(place)) in err[0], err[0]


@pytest.mark.parametrize("argv, says", USAGE_CASES, ids=[" ".join(c[0][:2]) for c in USAGE_CASES])
def test_a_bad_argument_is_refused_before_any_work(capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("qkv ") and says in err[-1], err


def test_no_traceback_reaches_stderr(place):
    """The same boundary as a user meets it: the installed entry point in its own process."""
    for argv in (["translate", "--run", f"{place}/badweights"], ["generate", "--run", f"{place}/mt", "x"],
                 ["train", "lm", "--recipe", f"{place}/bad.yaml", "--run", f"{place}/new15"],
                 ["translate", "--run", f"{place}/mt_section"]):
        proc = subprocess.run([sys.executable, "-m", "qkv", *argv], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
