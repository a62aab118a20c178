"""The layering of docs/ARCHITECTURE.md, held by a test: who may import whom, and no import hidden in a function.

Each module's qkv imports are read from its source (``ast``), at every depth: one at the top of the
file and one inside a function are told apart, so a function-level import that dodges a cycle fails.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import qkv
from qkv.config import ARCHS
from qkv.models.kinds import KINDS
from qkv.recipes import RUN_RECIPES

PACKAGE = Path(qkv.__file__).resolve().parent

# What each part may import (besides itself, and besides the floor every part may: qkv.errors, qkv.files,
# qkv.devices, qkv.settings, qkv.config and qkv.parallel).
# A part is a top-level module or package of qkv. `training` may use `generation` (BLEU while training)
# and `evaluation`; nothing below points back up.
ALLOWED = {
    "errors": set(),
    "files": set(),
    "devices": set(),
    "settings": set(),
    "config": set(),
    "parallel": set(),
    "locks": set(),
    "modules": set(),
    "models": {"modules"},
    "tokenizers": set(),
    "data": {"tokenizers"},
    "recipes": {"data"},
    "weights": set(),
    "runs": {"models", "tokenizers", "data", "weights", "locks", "recipes"},
    "evaluation": {"data"},
    "accel": {"models", "modules"},
    "generation": {"runs", "models", "modules", "tokenizers", "accel"},
    "interpret": {"runs", "models", "modules", "tokenizers", "generation"},
    "interop": {"runs", "models", "modules", "tokenizers"},
    "training": {"runs", "models", "modules", "tokenizers", "data", "weights", "evaluation", "generation", "interop",
                 "recipes"},
    "demo": {"runs", "data", "generation", "interpret", "training"},
    "experiments": {"runs", "data", "evaluation", "generation", "interpret", "training", "locks", "recipes"},
    "cli": {"runs", "models", "modules", "tokenizers", "data", "weights", "evaluation", "generation", "interpret",
            "training", "demo", "experiments", "interop", "accel", "recipes"},
}
EVERYONE = {"errors", "files", "devices", "settings", "config", "parallel"}
# The floor, bottom up: each of its modules imports only those before it, so that it has no cycle.
FLOOR = ("errors", "files", "devices", "settings", "config", "parallel")


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(module, at_top_level)`` for every ``qkv`` import of ``path`` (``TYPE_CHECKING`` blocks aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.split(".")[0] == "qkv":
                found.append((child.module, top))
                if child.module == "qkv":  # from qkv import x: x may be a part
                    found.extend((f"qkv.{a.name}", top) for a in child.names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names if a.name.split(".")[0] == "qkv")
            visit(child, inner)

    visit(tree, True)
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_imports_only_what_its_layer_may(path):
    rel = path.relative_to(PACKAGE)
    own = rel.parts[0].removesuffix(".py")
    if own == "__init__":  # the package's lazy public names (PEP 562): every part, on first use
        return
    allowed = ALLOWED[own] | EVERYONE | {own}
    for module, top in _imports(path):
        part = _part(module)
        if not part or part in ("__init__",):
            continue
        assert top, f"{rel}: imports {module} inside a function; import it at the top of the file"
        assert part in allowed, f"{rel} ({own}) imports {module}: {own} may import {sorted(allowed)}"


# The paper's modules and the models built from them are the paper only: the speed-ups (qkv.accel) transform
# them from outside, and no machinery of compiling, exporting or quantizing is imported by them.
PAPER = ("modules", "models")
COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch.export", "torch.ao", "torch.compiler")


def _all_imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth: qkv's and third parties'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found.extend(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend(a.name for a in node.names)
    return found


@pytest.mark.parametrize("path", [p for p in SOURCES if p.relative_to(PACKAGE).parts[0] in PAPER],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_papers_modules_import_no_speed_up(path):
    assert "accel" not in ALLOWED[path.relative_to(PACKAGE).parts[0]]
    for module in _all_imports(path):
        assert not module.startswith("qkv.accel"), f"{path.name} imports {module}: speed-ups are applied from outside"
        assert not module.startswith(COMPILER_MODULES), f"{path.name} imports {module}: that belongs in qkv.accel"


def test_the_speed_up_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\ndef f():\n    from torch._inductor import config\n    import qkv.accel.kernels\n")
    assert {"torch._inductor", "qkv.accel.kernels"} <= set(_all_imports(bad))


@pytest.mark.parametrize("part", FLOOR)
def test_the_floor_imports_only_what_lies_below(part):
    path = PACKAGE / f"{part}.py"
    below = set(FLOOR[:FLOOR.index(part)])
    for module, _ in _imports(path):
        assert _part(module) in below, f"{part}.py imports {module}: the floor's modules import only {sorted(below)}"


def test_every_model_kind_is_registered_once():
    """A recipe's model.arch is checked against config.ARCHS; runs, decoding and the builders read models.KINDS; a
    run's config.json is read into the recipe of its kind (recipes.RUN_RECIPES)."""
    assert tuple(KINDS) == ARCHS == tuple(RUN_RECIPES)


def test_every_part_is_listed():
    parts = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py")) or (p / "__init__.py").is_file()}
    assert parts == set(ALLOWED)


def test_the_rule_catches_a_violation(tmp_path):
    """The checker itself: an upward import and a hidden one are both seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("from qkv.training import loop\n\ndef f():\n    from qkv.runs import Run\n")
    assert _imports(bad) == [("qkv.training", True), ("qkv.runs", False)]


# One name per concept (docs/ARCHITECTURE.md, "One name per concept"): the paper's d_k and d_v, never the
# synonyms they once had here.
RETIRED = {"head_dim": "d_v (or d_k)", "key_dim": "d_k", "block_size": "max_len", "n_ctx": "max_len",
           "n_embd": "d_model", "n_head": "n_heads", "n_layer": "n_layers"}


def _identifiers(path: Path) -> set[str]:
    """Every name ``path`` defines or reads of its own: variables, arguments, functions, classes, attributes it
    sets or reads of ``self`` and ``cfg`` (another library's names, such as GPT-2's config fields, are its own)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cfg"):
            names.add(node.attr)
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_one_name_per_concept(path):
    for name in sorted(_identifiers(path) & set(RETIRED)):
        raise AssertionError(f"{path.relative_to(PACKAGE)} names {name!r}: qkv calls it {RETIRED[name]}")


def test_the_naming_rule_catches_a_synonym(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(head_dim):\n    self.key_dim = head_dim\n    return cfg.block_size + hf.n_embd\n")
    assert {"head_dim", "key_dim", "block_size"} <= _identifiers(bad) and "n_embd" not in _identifiers(bad)


# The run directory's file names (docs/ARCHITECTURE.md, "The run directory"): qkv/runs.py names them, with the
# three it takes from the modules that write those files; every other module asks qkv.runs.
RUN_FILES = {"config.json", "tokenizer.json", "tokenizer.bpe", "model.safetensors", "best.safetensors",
             "average.safetensors", "last.pt", "last.safetensors", "metrics.jsonl", "results.json", "curves.png",
             "pronouns.json", "pronouns.png", "finetune.json", "finished.json", "adapter.safetensors", "tokens.bin"}
NAMED_WHERE_WRITTEN = {("tokenizers", "__init__.py"): "tokenizer.json", ("tokenizers", "gpt2.py"): "tokenizer.bpe",
                       ("data", "lm.py"): "tokens.bin"}


def _run_file_names(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every string in ``path`` that is exactly one of the run directory's file names."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_FILES]


@pytest.mark.parametrize("path", [p for p in SOURCES if p != PACKAGE / "runs.py"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_runs_names_the_run_files(path):
    allowed = NAMED_WHERE_WRITTEN.get(path.relative_to(PACKAGE).parts[-2:])
    for line, name in _run_file_names(path):
        assert name == allowed, f"{path.relative_to(PACKAGE)}:{line} names {name!r}: take it from qkv.runs"


def test_the_run_file_rule_catches_a_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Reads last.pt."""\nresume = (run / "last.pt").is_file()\n')
    assert _run_file_names(bad) == [(2, "last.pt")]


# The optional libraries (docs/ARCHITECTURE.md, "Who may import whom"): reached through errors.require where they
# are used, so that a missing one fails only the command that needs it, in one line naming the extra.
OPTIONAL = ("transformers", "tiktoken", "ctranslate2", "torch.utils.tensorboard", "tensorboard")


def _optional_imports(path: Path) -> list[str]:
    """The optional libraries ``path`` imports with an import statement (``TYPE_CHECKING`` blocks aside)."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            names = ([child.module] if isinstance(child, ast.ImportFrom) and child.module else
                     [a.name for a in child.names] if isinstance(child, ast.Import) else [])
            found.extend(n for n in names if n == "torch.utils" and isinstance(child, ast.ImportFrom)
                         and any(a.name == "tensorboard" for a in child.names) or n.startswith(OPTIONAL))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_optional_libraries_are_required_where_used(path):
    for module in _optional_imports(path):
        raise AssertionError(f"{path.relative_to(PACKAGE)} imports {module}: reach it with qkv.errors.require")


def test_the_optional_rule_catches_an_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import tiktoken\n    from transformers import GPT2LMHeadModel\n"
                   "    from torch.utils import tensorboard\n")
    assert _optional_imports(bad) == ["tiktoken", "transformers", "torch.utils"]


def test_every_trainer_has_the_one_trainer_shape():
    """(recipe, run_dir, *, resume, overwrite, quiet, ...) -> TrainResult (docs/ARCHITECTURE.md, "The training
    loop")."""
    import inspect

    from qkv.training.finetune import finetune
    from qkv.training.train_lm import train_lm
    from qkv.training.train_mt import train

    for trainer in (train, train_lm, finetune):
        params = list(inspect.signature(trainer).parameters.values())
        assert [p.name for p in params[:2]] == ["recipe", "run_dir"], trainer.__qualname__
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:2]), trainer.__qualname__
        assert [(p.name, p.kind, p.default) for p in params[2:5]] == [
            (name, inspect.Parameter.KEYWORD_ONLY, False) for name in ("resume", "overwrite", "quiet")
        ], trainer.__qualname__
        assert inspect.signature(trainer).return_annotation in ("TrainResult", "loop.TrainResult"), trainer.__qualname__


# The files a reader opens (docs/ARCHITECTURE.md, "Following the data"): each table row is one file to open
# (alternatives the run chooses among, joined by "or"), with the functions and classes the data passes through
# there. Each must be defined where the row says, and each path must stay within the budget its heading gives.
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def _defined(path: Path) -> set[str]:
    """The top-level functions and classes of ``path``, and ``Class.method`` for the methods of its classes."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def data_path_problems(text: str, package: Path) -> list[str]:
    """What the "Following the data" section of ``text`` says that ``package``'s code does not hold."""
    section = text.split("### Following the data", 1)[1].split("\n## ", 1)[0]
    problems, paths = [], re.findall(r"\*\*(.+?)\*\*.*?\*\*(\d+) files\*\*, at most (\d+)\.\n\n((?:\|.*\n)+)", section)
    if not paths:
        return ["no path with a '**N files**, at most M.' heading and a table"]
    for name, count, budget, table in paths:
        rows = [line.split("|")[1:3] for line in table.strip().split("\n")[2:]]  # past the header and its rule
        if len(rows) != int(count) or int(count) > int(budget):
            problems.append(f"{name}: {len(rows)} rows for {count} files, budget {budget}")
        for files_cell, names_cell in rows:
            files = [package / f for f in re.findall(r"`([\w/]+\.py)`", files_cell)]
            missing = [str(f.relative_to(package)) for f in files if not f.is_file()]
            if not files or missing:
                problems.append(f"{name}: {files_cell.strip()}: no such file {missing}")
                continue
            defined = set().union(*(_defined(f) for f in files))
            methods = {d.split(".")[-1] for d in defined}
            for wanted in re.findall(r"`([\w.]+)`", names_cell):
                if wanted not in defined and ("." in wanted or wanted not in methods):
                    problems.append(f"{name}: {files_cell.strip()} defines no {wanted}")
    return problems


def test_the_data_paths_name_what_the_code_holds():
    assert data_path_problems(ARCHITECTURE.read_text(encoding="utf-8"), PACKAGE) == []


def test_the_data_path_check_catches_a_stale_row():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    moved = text.replace("| `generation/decode.py` | `generate`", "| `generation/gone.py` | `generate`")
    renamed = text.replace("`generate` (the loop", "`generate_all` (the loop")
    over = text.replace("**9 files**, at most 9.", "**9 files**, at most 8.")
    assert [len(data_path_problems(t, PACKAGE)) for t in (moved, renamed, over)] == [1, 1, 1]


# The tables checked against the code as it runs: a tiny `qkv generate` and a tiny translation training, traced.
# A file is on a path where a function of it is on the call stack when the data takes its next form (a *sink*
# returns: the corpus read, the text encoded, the logits or the loss computed), or where the activations pass
# through it (a function entered inside the model's forward). The trace ends at the path's last sink, the
# first logits or the first loss. A file the data passes through that its table leaves out, or a row that it
# does not pass through, fails.


class DataTrace:
    """The files of qkv (paths relative to the package) the data passes through while ``call`` runs, up to the
    first return of ``end``, from ``start`` (the command's function: its callers are not on the path). ``sinks``
    and ``end`` are ``"file:qualname"`` patterns (fnmatch), ``forward`` is the model's forward, every function
    inside it on the path."""

    def __init__(self, start: str, sinks: set[str], forward: str, end: str) -> None:
        self.start, self.sinks, self.forward, self.end = start, sinks | {forward, end}, forward, end
        self.files: dict[str, str] = {}  # each file, and where the data met it first (for the failure's line)

    def _key(self, frame) -> tuple[str, str] | None:
        try:
            rel = Path(frame.f_code.co_filename).resolve().relative_to(PACKAGE).as_posix()
        except ValueError:
            return None
        return rel, f"{rel}:{frame.f_code.co_qualname}"

    def run(self, call) -> set[str]:
        import fnmatch
        import sys

        inside, done = [0], [False]

        def profile(frame, event, arg):
            if done[0] or event not in ("call", "return"):
                return
            key = self._key(frame)
            if key is None:
                return
            rel, name = key
            if name == self.forward:
                inside[0] += 1 if event == "call" else -1
            if event == "call" and inside[0]:
                self.files.setdefault(rel, f"{name}, inside {self.forward}")
            if event == "return" and any(fnmatch.fnmatchcase(name, s) for s in self.sinks):
                f = frame
                while f is not None:  # every qkv function on the stack holds the data, or its next form
                    up = self._key(f)
                    if up is not None:
                        self.files.setdefault(up[0], f"{up[1]}, on the stack when {name} returned")
                        if up[1] == self.start:
                            break
                    f = f.f_back
                done[0] = fnmatch.fnmatchcase(name, self.end)

        sys.setprofile(profile)
        try:
            call()
        finally:
            sys.setprofile(None)
        return {f: why for f, why in self.files.items() if f not in {f"{part}.py" for part in FLOOR}}


def _table_files(heading: str) -> list[list[str]]:
    """The rows of the path table under ``heading``: each row's files (one, or the alternatives joined by "or")."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split(heading, 1)[1]
    table = re.search(r"\n\n((?:\|.*\n)+)", section).group(1)
    rows = [line.split("|")[1] for line in table.strip().split("\n")[2:]]
    return [re.findall(r"`([\w/]+\.py)`", cell) for cell in rows]


def _trace_problems(rows: list[list[str]], traced: dict[str, str]) -> list[str]:
    listed = {f for row in rows for f in row}
    return ([f"the data passes through {f} ({traced[f]}), which the table leaves out" for f in sorted(set(traced) - listed)]
            + [f"the table lists {' or '.join(row)}, which the data does not pass through" for row in rows
               if not set(traced) & set(row)])


def test_the_generate_path_is_the_files_a_traced_generation_passes_through(gpt_run, monkeypatch, capsys):
    from qkv.accel import kernels
    from qkv.cli import main

    if not kernels.available("onednn"):
        pytest.skip("a packed kernel carries the step's products through accel/kernels.py; this torch has none")
    monkeypatch.setattr(kernels, "_backend", "onednn")  # the products through PackedLinear, on any CPU
    trace = DataTrace("cli/lm.py:cmd_generate", {"tokenizers/*.py:*.encode"}, forward="models/gpt.py:GPT.forward", end="models/gpt.py:GPT.forward")
    traced = trace.run(lambda: main(["generate", "--run", str(gpt_run), "小明", "-n", "3", "--seed", "1"]))
    capsys.readouterr()
    assert _trace_problems(_table_files("**`qkv generate` to the logits**"), traced) == []


def test_the_translation_path_is_the_files_a_traced_training_step_passes_through(tmp_path):
    from qkv.data.translation import DataConfig
    from qkv.recipes import MTRecipe, MTTrainConfig
    from qkv.config import ModelConfig
    from qkv.training.train_mt import train

    recipe = MTRecipe(model=ModelConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, max_len=64),
                      data=DataConfig(corpus="demo", vocab_size=120, max_tokens=400, max_src_len=40, max_tgt_len=40, demo_train=200, demo_valid=8,
                                      demo_test=8),
                      train=MTTrainConfig(steps=1, warmup=1, eval_every=1, eval_bleu_sentences=0, test_beam=1))
    trace = DataTrace("training/train_mt.py:train", {"data/synthetic.py:demo_corpus", "data/corpora.py:read_parallel", "tokenizers/*.py:*.encode_batch"},
                      forward="models/transformer.py:Transformer.forward", end="evaluation/losses.py:label_smoothed_nll")
    traced = trace.run(lambda: train(recipe, tmp_path / "run", quiet=True))
    assert _trace_problems(_table_files("**One translation batch from text to loss**"), traced) == []


def test_the_trace_check_catches_a_file_left_out_and_a_row_not_passed():
    rows = [["cli/lm.py"], ["tokenizers/char.py", "tokenizers/bpe.py"], ["models/gpt.py"]]
    passed = dict.fromkeys(["cli/lm.py", "tokenizers/bpe.py", "models/gpt.py"], "")
    assert _trace_problems(rows, passed) == []
    assert len(_trace_problems(rows, {**passed, "modules/packing.py": ""})) == 1
    assert len(_trace_problems(rows, {"cli/lm.py": "", "models/gpt.py": ""})) == 1


@pytest.mark.parametrize("module", ["qkv", "qkv.data"])
def test_importing_the_package_and_its_corpus_registry_imports_no_torch(module):
    """What qkv/__init__.py and qkv/data/__init__.py promise: their names load on first use, torch with them."""
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# A measured figure in the code drifts from the benchmark it came from (two docstrings once gave a compile two
# different times): timings and speed ratios live in docs/BENCHMARKS.md, beside the command that measures them,
# and the code says what a rule does and points there.
FIGURE = re.compile(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|us)\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x "
                    r"(?:faster|slower|HF|CTranslate2|the default)\b")


def figures_in(text: str) -> list[str]:
    return FIGURE.findall(text)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_code_quotes_no_benchmark_figure(path):
    assert figures_in(path.read_text(encoding="utf-8")) == [], "move the figure to docs/BENCHMARKS.md and point there"


def test_the_figure_rule_catches_a_timing_and_a_ratio():
    assert figures_in("the step took 2.7 ms, 1.4-1.6x faster; 20 us a call; 3x HF") == ["2.7 ms", "1.4-1.6x faster",
                                                                                          "20 us", "3x HF"]
    assert figures_in("a 2 MB buffer, 10% of F.linear, (B, 1, 1, L), 4x d_model") == []
