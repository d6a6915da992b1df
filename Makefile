# vLLM fork: patch queues on pinned upstream releases. `make help` lists targets.
PYTHON ?= python3
BASE ?=
# A variable the targets do not read (a typo, `base=` for `BASE=`) would be
# ignored silently: name it instead.
known_vars := PYTHON BASE JOBS FRESH AUDIT AUDIT_MINUTES AUDIT_SEED HUNKS PATCH TO PROBE PORTED ALL SMOKE FETCH WIDE FIGURES CELLS FROM NO_LOCK ONTO CPU
given_vars := $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
# Settings for the commands underneath (VLLM_FORK_*, PIP_*, ...) pass through.
passed_vars := MAKEFLAGS VLLM_% PIP_% UV_%
unknown_vars := $(filter-out $(known_vars) $(passed_vars),$(given_vars))
ifneq ($(unknown_vars),)
$(error $(foreach v,$(unknown_vars),$(v)=$($(v))) is not a variable of this Makefile; it reads $(known_vars))
endif
# What each target reads besides PYTHON: anything else given to it would be
# dropped, and a dropped PATCH=2 starts a full verify instead of one patch's.
reads_help :=
reads_fork := BASE
reads_export := BASE
reads_check := BASE
reads_fixes := BASE
reads_status := BASE FETCH WIDE
reads_verify := BASE JOBS FRESH AUDIT AUDIT_MINUTES AUDIT_SEED HUNKS PATCH
reads_read-only := BASE FRESH
reads_costs := BASE
reads_lint := BASE
reads_wheel := BASE ALL NO_LOCK
reads_lock := BASE FROM
reads_venv := BASE
reads_engine := BASE SMOKE
reads_test-tooling :=
reads_test := BASE JOBS FRESH AUDIT AUDIT_MINUTES AUDIT_SEED
reads_pr := BASE PATCH ONTO
reads_apply := BASE ONTO CPU
reads_releases :=
reads_rebase := TO PROBE PORTED
reads_bench := BASE FIGURES CELLS
targets := help fork export check fixes status verify read-only costs lint test test-tooling venv lock engine pr apply releases bench rebase wheel
# The targets a user of the fork runs; `make help` lists them first.
user_targets := fixes apply status wheel pr
unknown_goals := $(filter-out $(targets),$(MAKECMDGOALS))
ifneq ($(unknown_goals),)
$(error no target $(unknown_goals) in this Makefile: `make help` lists them; nothing was run)
endif
goals := $(or $(MAKECMDGOALS),help)
unread_vars := $(filter-out PYTHON $(foreach g,$(goals),$(reads_$(g))) $(passed_vars),$(given_vars))
ifneq ($(unread_vars),)
$(error $(foreach v,$(unread_vars),$(v)=$($(v))) is not read by make $(goals): $(foreach g,$(goals),$(g) reads $(or $(reads_$(g)),no variable);) every target reads PYTHON; nothing was run)
endif
# A switch (FRESH=1) is on or off, and nothing else: FRESH=maybe is refused.
switches := FRESH HUNKS WIDE FETCH ALL NO_LOCK SMOKE PROBE PORTED
off_words := 0 no No NO false False FALSE off Off OFF
on_words := 1 yes Yes YES true True TRUE on On ON
not_switched := $(foreach v,$(filter $(switches),$(given_vars)),$(if $(filter-out $(on_words) $(off_words),$($(v))),$(v)=$($(v))))
ifneq ($(not_switched),)
$(error $(not_switched): a switch is on ($(on_words)) or off ($(off_words), or empty); nothing was run)
endif
on = $(filter-out $(off_words),$(1))
base_arg = $(if $(BASE),--base $(BASE))
jobs_arg = $(if $(JOBS),--jobs $(JOBS))
proof_args = $(if $(call on,$(FRESH)),--fresh) $(if $(AUDIT),--audit $(AUDIT)) $(if $(AUDIT_MINUTES),--audit-minutes $(AUDIT_MINUTES)) $(if $(AUDIT_SEED),--audit-seed $(AUDIT_SEED))
forktools = $(PYTHON) -m forktools

.PHONY: $(targets)

# The `## ` lines of the targets named in $(1), in Makefile order, wrapped.
help_for = grep -E '^[a-z-]+:.*\#\# ' $(MAKEFILE_LIST) | awk -F':.*\#\# ' -v want=' $(1) ' '\
	index(want, " " $$1 " ") { \
		line = sprintf("  make %-13s", $$1); n = split($$2, words, " "); \
		for (i = 1; i <= n; i++) { \
			if (length(line) + 1 + length(words[i]) > 80) { print line; line = sprintf("%20s", "") } \
			line = line " " words[i] } \
		print line }'

help: ## list the targets
	@echo "Use the fork:"
	@echo "  pip install -e .   vLLM with the fork's fixes, on a GPU node (README.md)"
	@$(call help_for,$(user_targets))
	@echo "Maintain it:"
	@$(call help_for,$(filter-out $(user_targets),$(targets)))
	@echo "  BASE=<base> limits a target to one base pinned in upstream.toml"

fork: ## materialize vllm/ and tests/ for BASE (default: upstream.toml's)
	$(forktools) fork $(base_arg)

export: ## write the fork tree's commits back into patches/<base>/
	$(forktools) export $(base_arg)

check: ## fail when patches/ and the fork trees disagree, a proof ledger is stale, or a base's compile key hashes a variable a newer base leaves out
	$(forktools) check $(base_arg)

fixes: ## the paths of BASE's patches that change vllm/, in order, for git am (the rest are tests)
	@$(forktools) fixes $(base_arg)

status: ## one base's patches, fix or test, upstream status, newer releases (WIDE=1: every base, full width; FETCH=1: download what that needs)
	$(forktools) status $(base_arg) $(if $(call on,$(WIDE)),--wide) $(if $(call on,$(FETCH)),--fetch)

verify: ## each commit: its tests pass with it, fail without it, kept in patches/<base>/proof.json (FRESH=1: prove every row; AUDIT_MINUTES=m: the audit's slot size, 10 by default; JOBS=n; HUNKS=1 [PATCH=n]: each fix hunk reverted alone)
	$(if $(and $(PATCH),$(if $(call on,$(HUNKS)),,no)),$(error PATCH=$(PATCH) goes with HUNKS=1 (make verify HUNKS=1 PATCH=n); verify also reads BASE JOBS FRESH AUDIT AUDIT_MINUTES AUDIT_SEED))
	$(forktools) verify $(base_arg) $(jobs_arg) $(proof_args) $(if $(call on,$(HUNKS)),--hunks $(if $(PATCH),--patch $(PATCH)))

read-only: ## the queue's read-only cache tests again with every capability dropped (file modes, as unprivileged; verify ran them as you, as root with a bind mount); fails on a skip; in a clean checkout; kept in patches/<base>/read_only.json and reused while its key holds, but in its turn of the audit's rotation (FRESH=1: run again)
	$(forktools) read-only $(base_arg) $(if $(call on,$(FRESH)),--fresh)

costs: ## where the proof's test-seconds go: per base and test file, with and without the fix, and the costliest cases, from the ledgers (runs no test); the audit's rotation slots and the next ten commits' turns
	$(forktools) costs $(base_arg)

lint: ## ruff and the import layering on our code; upstream's CI checks (ruff, typos, mypy, hooks) on every queue
	$(forktools) lint $(base_arg)

wheel: ## the fork wheel for fleets in dist/, with its node lock (ALL=1: every pinned platform; NO_LOCK=1: the wheel alone)
	$(forktools) wheel $(base_arg) $(if $(call on,$(ALL)),--all-platforms) $(if $(call on,$(NO_LOCK)),--no-lock)

lock: ## write locks/<base>/*.txt from the package index and print each move (FROM=ledger: the sets the proof ledgers record)
	$(forktools) lock $(base_arg) $(if $(filter ledger,$(FROM)),--from-ledger,$(if $(FROM),$(error FROM=$(FROM): the only source besides the index is FROM=ledger)))

venv: ## build the per-base test environments from their locks (cached)
	$(forktools) venv $(base_arg)

engine: ## build the CPU engine environments (cached; SMOKE=1 runs the engine on the fork tree)
	$(forktools) engine-env $(base_arg) $(if $(call on,$(SMOKE)),--smoke)

test-tooling: ## the tooling's own tests (about two minutes on 2 CPUs; the first run installs pytest-xdist into the cache)
	$(forktools) test-tooling

test: ## everything CI runs: tooling tests, lint, check, verify, read-only tests
	$(forktools) test $(base_arg) $(jobs_arg) $(proof_args)

pr: ## patch PATCH of BASE for upstream, signed off by you, and its PR body (ONTO=<your vLLM checkout>: applied there on a branch; PYTHON=: run its tests there)
	$(if $(PATCH),,$(error make pr needs PATCH=n: the patch's number in patches/<base>/series (make status lists them)))
	$(forktools) pr $(base_arg) --patch $(PATCH) $(if $(ONTO),--onto $(ONTO) $(if $(filter command line,$(origin PYTHON)),--python $(PYTHON)))

apply: ## every fix your vLLM checkout needs, on a new branch (ONTO=<checkout>; BASE=: another base than its version's; PYTHON=: prove each there; CPU=1: no GPU, the fork's CPU harness), report in apply/
	$(if $(ONTO),,$(error make apply needs ONTO=<your vLLM git checkout>))
	$(forktools) apply --onto $(ONTO) $(base_arg) $(if $(filter command line,$(origin PYTHON)),--python $(PYTHON)) $(if $(CPU),--cpu)

releases: ## every release from the oldest pin to the newest against every fix, as make apply takes it, into docs/releases.md (downloads each release's sdist once, 30 to 50 MB)
	$(forktools) releases

rebase: ## carry the newest queue onto release TO (e.g. TO=0.34.0; PROBE=1 runs tests; PORTED=1 records a hand port), with a report
	$(if $(TO),,$(error make rebase needs TO=<release>: the upstream release to move to (TO=0.35.0)))
	$(forktools) rebase --to $(TO) $(if $(call on,$(PROBE)),--probe-tests) $(if $(call on,$(PORTED)),--ported)

bench: ## fork vs pristine costs, written to BENCHMARKS.md (FIGURES=fleet,...: only those; FIGURES=keys CELLS=seed,...: those cells; VLLM_FORK_BENCH_INSTALL=0: quick)
	$(if $(CELLS),VLLM_FORK_BENCH_CELLS='$(CELLS)') $(forktools) bench $(base_arg) $(if $(FIGURES),--figures $(FIGURES))
