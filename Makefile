# make app  — start the Streamlit app on the bundled checkpoints
# make test — run the test suite
# Each target creates or refreshes the local virtual environment .venv from requirements.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-installed
PORT ?= 8501
# pytest processes for make test (pytest-xdist): one per core of a 2-core machine
TEST_WORKERS ?= 2

.PHONY: app test venv bench clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@echo "Setting up $(VENV): installing torch, streamlit, numba and the rest of requirements.txt (first time: a few minutes; pip names each package as it goes)..."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "[1/2] torch (its wheel unpacks for a minute or two without a word from pip)..."
	$(PY) -m pip install --disable-pip-version-check --progress-bar on "$$(grep -m1 '^torch==' requirements.txt)"
	@echo "[2/2] the rest of requirements.txt..."
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)
	@echo "$(VENV) is ready."

app: $(STAMP)
	$(PY) -m streamlit run app.py --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

test: $(STAMP)
	$(PY) -m ruff check --output-format concise .
	$(PY) -m ruff format --check .
	$(PY) -m mypy fireviz
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
