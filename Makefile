# Everything a fresh machine needs goes through these targets; see README.md. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JUPYTER_CONFIG := $(VENV)/.jupyter-configured
# Every version the venv gets, pinned: a course graded in March and in May runs the same
# nbgrader, nbclient and nbconvert. `make lock` writes it anew from pyproject.toml.
LOCK   := requirements/constraints.txt
# The PyTorch release `make lock` pins. Its Linux x86_64 wheel on PyPI is the CUDA build (several GB);
# the lab's CI machines hold its CPU build locally, which pip prefers. The lock records it without
# the "+cpu" label, so elsewhere pip takes PyPI's wheel of the same release.
TORCH_PIN := torch==2.13.0
# What `make venv` installs: every extra but the GPU one (see pyproject.toml).
EXTRAS := all
# Silence mkdocs-material's banner about mkdocs 2: pyproject.toml pins mkdocs below 2.
export NO_MKDOCS_2_WARNING := 1

.PHONY: help venv serve site site-offline test test-fast lock bench bench-cluster release clean distclean

help:                    ## this list
	@awk -F':.*## ' '/^[a-zA-Z_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The venv is (re)built whenever pyproject.toml or the lock file changes.
$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed; run: make PYTHON=/path/to/python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
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

venv: $(STAMP) $(JUPYTER_CONFIG)  ## create .venv/ and install the lab into it, pinned by requirements/constraints.txt

serve: $(STAMP) $(JUPYTER_CONFIG)  ## build the site and serve it on http://127.0.0.1:8000 (rebuilds on edit)
	$(PY) -m mkdocs serve --strict -a 127.0.0.1:8000

site: $(STAMP)           ## static build into site/
	$(PY) -m mkdocs build --strict

site-offline: $(STAMP)   ## a copy of the site that opens from file:// (site-offline/index.html), search included
	LAB_OFFLINE=true $(PY) -m mkdocs build --strict -d site-offline

test: $(STAMP) $(JUPYTER_CONFIG)  ## the whole suite
	$(PY) -m pytest

# The markers are registered in pyproject.toml; tests/test_hygiene.py checks the set is used.
test-fast: $(STAMP) $(JUPYTER_CONFIG)  ## the suite without what starts MPI ranks, a browser or a grading run, or takes > 5 s
	$(PY) -m pytest -m "not slow and not browser and not mpi and not grader"

# A fresh venv outside the checkout, the newest releases that pyproject.toml allows, frozen.
lock:                    ## re-resolve every dependency to its newest allowed release into requirements/constraints.txt
	rm -rf $(VENV)-lock
	$(PYTHON) -m venv $(VENV)-lock
	$(VENV)-lock/bin/python -m pip install --quiet --upgrade pip
	$(VENV)-lock/bin/python -m pip install --quiet -e '.[$(EXTRAS)]' '$(TORCH_PIN)'
	mkdir -p $(dir $(LOCK))
	{ echo "# Every package make venv installs, at the version it installs; pip install -c $(LOCK) ..."; \
	  echo "# Written by make lock from pyproject.toml ($(EXTRAS) extras) with $$($(VENV)-lock/bin/python --version)."; \
	  $(VENV)-lock/bin/python -m pip freeze --all --exclude-editable | grep -v "^pip==" | sed 's/^\(torch==[^+]*\)+.*/\1/'; } > $(LOCK)
	rm -rf $(VENV)-lock

bench: $(STAMP)          ## measure on this machine; writes docs/assets/bench/*.json, which the site plots
	$(PY) -m benchmarks --all --publish

bench-cluster: $(STAMP)  ## needs root and slurm-wlm: the same allreduce under mpiexec, under srun, on a virtual cluster
	$(PY) -m reference_impl.comm.slurm_node $(PY) -m benchmarks cluster --launcher "srun --mpi=pmi2" --publish

release: $(STAMP)        ## instructors: learner notebooks into exercises/release/ (keeps any edited one); learners use `grader start`
	$(PY) -m grader release

clean:                   ## build outputs (keeps the venv, and what is a learner's: work/, exercises/release/, grader-feedback/)
	rm -rf site site-offline .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean         ## also the venv
	rm -rf $(VENV) *.egg-info
