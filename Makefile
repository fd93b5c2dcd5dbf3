# Everything a fresh machine needs goes through these targets; see README.md.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JUPYTER_CONFIG := $(VENV)/.jupyter-configured
# Silence mkdocs-material's banner about mkdocs 2: pyproject.toml pins mkdocs below 2.
export NO_MKDOCS_2_WARNING := 1

.PHONY: venv serve site test bench bench-cluster release clean distclean

# The venv is (re)built whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed; run: make PYTHON=/path/to/python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	@touch $(STAMP)

# nbgrader's student-side "Assignment List" and "Courses" need an exchange directory (a shared
# /srv/nbgrader/exchange) that this lab does not use: learners get notebooks with `grader start`.
# They are turned off in the venv's own Jupyter configuration (.venv/etc/jupyter, the sys-prefix
# level), never in the user's home; the formgrader and "Validate" stay. See docs/grading.md.
$(JUPYTER_CONFIG): $(STAMP) Makefile
	$(VENV)/bin/jupyter server extension disable --sys-prefix \
	  nbgrader.server_extensions.assignment_list nbgrader.server_extensions.course_list
	$(VENV)/bin/jupyter labextension disable --level=sys_prefix \
	  @jupyter/nbgrader:assignment-list @jupyter/nbgrader:course-list
	$(VENV)/bin/jupyter labextension lock --level=sys_prefix \
	  @jupyter/nbgrader:assignment-list @jupyter/nbgrader:course-list
	@touch $(JUPYTER_CONFIG)

venv: $(STAMP) $(JUPYTER_CONFIG)

serve: $(STAMP) $(JUPYTER_CONFIG)  ## build the site and serve it on http://127.0.0.1:8000 (rebuilds on edit)
	$(PY) -m mkdocs serve --strict -a 127.0.0.1:8000

site: $(STAMP)           ## static build into site/
	$(PY) -m mkdocs build --strict

test: $(STAMP) $(JUPYTER_CONFIG)  ## the whole suite
	$(PY) -m pytest

BENCHMARKS := allreduce alpha_beta collectives interconnects overlap determinism graph distributed_session grading custom_ops training pipeline ps ps_cluster deploy autodiff passes optimizers training_loop sharded model_parallel

bench: $(STAMP)          ## measure on this machine; writes docs/assets/bench/*.json, which the site plots
	for b in $(BENCHMARKS); do $(PY) -m benchmarks $$b --publish || exit 1; done

bench-cluster: $(STAMP)  ## needs root: the same allreduce on a virtual cluster of network namespaces
	$(PY) -m benchmarks cluster --publish

release: $(STAMP)        ## instructors: learner notebooks into exercises/release/ (keeps any edited one); learners use `grader start`
	$(PY) -m grader release

clean:                   ## build outputs (keeps the venv, and what is a learner's: work/, exercises/release/, grader-feedback/)
	rm -rf site .pytest_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean         ## also the venv
	rm -rf $(VENV) *.egg-info
