# The two commands of the README's quick start, and a few more. Everything installs into .venv.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/pip

.PHONY: setup demo test test-all bench api clean demo-model

$(BIN)/qkv: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch==2.13.0 is pinned in pyproject.toml: the CPU build, not a multi-GB CUDA one.
	$(PIP) install --quiet -e ".[dev]"
	@touch $(BIN)/qkv

setup: $(BIN)/qkv

demo: setup
	$(BIN)/qkv demo

# The default tier: everything but slow tests (a few minutes on 2 cores). Browser tests run when
# Debian's chromium is installed (.ci/run installs it) and skip otherwise.
test: setup
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

test-all: setup
	$(BIN)/python -m pytest -q

# The API reference of qkv's public names (qkv/__init__.py), from their docstrings, by pdoc (pinned in the
# dev extras, so that tests/test_api_docs.py can check docs/api/ is what this writes).
API_OUT ?= docs/api
api:
	$(BIN)/pdoc qkv --no-show-source --no-search -o $(API_OUT)

# The translator the package carries for the explorer (qkv/interpret/explorer/embedded.py): the demo
# recipe, seed 1 (the same bytes on every run of one machine), its graphs for the page, its run files,
# their sha256 (vendor/demo_model/VENDOR.json).
DEMO_MODEL := qkv/interpret/explorer/vendor/demo_model
demo-model: setup
	$(BIN)/qkv train mt --recipe demo --run build/demo-model --overwrite --quiet
	$(BIN)/qkv export onnx --run build/demo-model --out $(DEMO_MODEL)/onnx --form fp16 --overwrite
	cp build/demo-model/config.json build/demo-model/tokenizer.json build/demo-model/model.safetensors $(DEMO_MODEL)/
	$(BIN)/python -m qkv.interpret.explorer.embedded --record-demo

bench: setup
	$(BIN)/python bench/train_gpt.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
