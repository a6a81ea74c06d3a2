# fastpmi — make help lists the targets.
#
# Every build and test passes -ldflags=-checklinkname=0: giouring (netio's
# io_uring backend) links into syscall internals, which Go's linker refuses
# without it.

SHELL      := /bin/bash
GO         ?= go
LDFLAGS    := -ldflags=-checklinkname=0
BIN        := build/bin
CPROG      := build/cprog
LIB        ?= build/lib
N          ?= 8
APT_PKGS   := mpich libmpich-dev libpmi2-0-dev iproute2 gcc make openssh-client openssh-server \
              munge slurmctld slurmd slurm-client hwloc-nox groff-base \
              libpmix-dev openmpi-bin libopenmpi-dev pkg-config
FUZZTIME   ?= 30s

.PHONY: help deps build run test test-race bench bench-ompi bench-scale plots paper fuzz check clean cprog tidy-check lib docs install install-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

# openssh-server, munge and Slurm's daemons are for the tests' own sshd,
# munged, slurmctld and slurmds inside test hosts: while packages install,
# a policy-rc.d (unless the machine has one) keeps their services from
# starting on this machine.
deps: ## install what builds and tests need (Debian packages, Go modules)
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		norc=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' | $$SUDO tee /usr/sbin/policy-rc.d >/dev/null && $$SUDO chmod 755 /usr/sbin/policy-rc.d && norc=1; \
		fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; rc=$$?; \
		[ -z "$$norc" ] || $$SUDO rm -f /usr/sbin/policy-rc.d; \
		[ $$rc = 0 ] || exit $$rc; \
	fi
	$(GO) mod download

# With OpenPMIx's server library installed (libpmix-dev), pmid and
# pmirun-pmix are built with -tags pmix: they serve PMIx ranks (Open MPI)
# with --mpi pmix (docs/pmix.md). pmirun itself is always pure Go, linked
# statically (it starts sooner): it hands a one-node PMIx job to the
# pmirun-pmix beside it. Without the library, pmirun-pmix is not built
# and pmid is pure Go too; both say so when asked for PMIx.
# (Expanded when used: deps may install the library first.)
GOTAGS      = $(shell pkg-config --exists pmix 2>/dev/null && echo -tags pmix)

build: ## build pmirun, pmid, pmibench into build/bin (with PMIx support when libpmix-dev is installed)
	$(GO) build $(LDFLAGS) $(GOTAGS) -o $(BIN)/ ./cmd/pmid ./cmd/pmibench
	CGO_ENABLED=0 $(GO) build $(LDFLAGS) -o $(BIN)/ ./cmd/pmirun
	$(if $(GOTAGS),$(GO) build $(LDFLAGS) $(GOTAGS) -o $(BIN)/pmirun-pmix ./cmd/pmirun)

# libfastpmi (clib/): a drop-in libpmi2.so.0 over fastpmi's shared memory.
# LIB=DIR builds it elsewhere (the end-to-end tests build their own);
# CLIB_SAN=1 builds it with AddressSanitizer and UndefinedBehaviorSanitizer
# (run its programs with LD_PRELOAD=$$(gcc -print-file-name=libasan.so)).
CLIB_SRC    := $(wildcard clib/*.c)
CLIB_HDR    := $(wildcard clib/*.h clib/include/fastpmi/*.h)
CLIB_CFLAGS := -O2 -g -std=gnu11 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -Iclib -Iclib/include
ifeq ($(CLIB_SAN),1)
CLIB_CFLAGS += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
endif

lib: $(LIB)/libpmi2.so.0 $(LIB)/libpmi2.so $(LIB)/include/fastpmi/pmi2ext.h ## build libfastpmi into build/lib (libpmi2.so.0, fastpmi/pmi2ext.h)

$(LIB)/libpmi2.so.0: $(CLIB_SRC) $(CLIB_HDR)
	@mkdir -p $(LIB)
	gcc $(CLIB_CFLAGS) -shared -Wl,-soname,libpmi2.so.0 -o $@ $(CLIB_SRC) -lpthread
$(LIB)/libpmi2.so: $(LIB)/libpmi2.so.0
	ln -sf libpmi2.so.0 $@
$(LIB)/include/fastpmi/pmi2ext.h: clib/include/fastpmi/pmi2ext.h
	@mkdir -p $(dir $@)
	cp $< $@

CPROG_MPI  := mpi_allreduce mpi_hello mpi_abort mpi_pubname mpi_args mpi_appnum
CPROG_OMPI := ompi_allreduce ompi_abort ompi_die ompi_spawn ompi_accept ompi_hello ompi_pubname
CPROG_PMI2 := pmi2_test pmi2_bench pmi2_spawn pmi2_spawnbench pmi2_cost pmi2_appnum
CPROG_ALL  := $(addprefix $(CPROG)/,$(CPROG_MPI) $(CPROG_OMPI) $(CPROG_PMI2) pmix_bench pmix_dmodex pmix_spawn pmix_join exit_early forkfloor true_static)
CFLAGS     ?= -O2 -Wall

cprog: $(CPROG_ALL) ## build the C test and benchmark programs into build/cprog

# MPI programs: Debian's MPICH (PMI-1); Open MPI programs (ompi_*, PMIx):
# Debian's Open MPI, from ompi_X.c or else the MPICH program's mpi_X.c;
# PMI-2 programs: Slurm's libpmi2. Each MPI by its own compiler wrapper:
# installing Open MPI moves Debian's mpicc alternative.
$(CPROG_ALL): | deps
$(addprefix $(CPROG)/,$(CPROG_MPI)): $(CPROG)/%: tests/cprog/%.c
	@mkdir -p $(CPROG)
	mpicc.mpich $(CFLAGS) -o $@ $<
$(CPROG)/ompi_die $(CPROG)/ompi_spawn $(CPROG)/ompi_accept: $(CPROG)/%: tests/cprog/%.c
	@mkdir -p $(CPROG)
	mpicc.openmpi $(CFLAGS) -o $@ $<
$(addprefix $(CPROG)/,$(filter-out ompi_die ompi_spawn ompi_accept,$(CPROG_OMPI))): $(CPROG)/ompi_%: tests/cprog/mpi_%.c
	@mkdir -p $(CPROG)
	mpicc.openmpi $(CFLAGS) -o $@ $<
$(addprefix $(CPROG)/,$(CPROG_PMI2)): $(CPROG)/%: tests/cprog/%.c
	@mkdir -p $(CPROG)
	gcc $(CFLAGS) -o $@ $< -lpmi2 -ldl
# PMIx clients of their own (OpenPMIx's libpmix): put, commit, fence, get;
# pmix_dmodex reads its peers' keys by direct modex.
$(CPROG)/pmix_spawn $(CPROG)/pmix_join: tests/cprog/pmix_check.h
$(CPROG)/pmix_bench $(CPROG)/pmix_dmodex $(CPROG)/pmix_spawn $(CPROG)/pmix_join: $(CPROG)/pmix_%: tests/cprog/pmix_%.c
	@mkdir -p $(CPROG)
	gcc $(CFLAGS) $$(pkg-config --cflags pmix) -o $@ $< $$(pkg-config --libs pmix)
$(CPROG)/exit_early: tests/cprog/exit_early.c
	@mkdir -p $(CPROG)
	gcc $(CFLAGS) -o $@ $<
# The fork+exec floor (pmibench -floor): a minimal launcher, and the
# smallest static program it starts.
$(CPROG)/forkfloor: tests/cprog/forkfloor.c
	@mkdir -p $(CPROG)
	gcc $(CFLAGS) -o $@ $<
$(CPROG)/true_static: tests/cprog/true_static.c
	@mkdir -p $(CPROG)
	gcc $(CFLAGS) -static -o $@ $<

run: deps build cprog lib ## run real jobs on this machine: the Go example and an MPICH program (N=8 ranks)
	$(GO) build -o $(BIN)/hello ./examples/hello
	$(BIN)/pmirun -n $(N) --verbose $(BIN)/hello
	$(BIN)/pmirun -n $(N) --label --verbose $(CPROG)/mpi_allreduce

tidy-check: ## fail if go.mod or go.sum is not tidy (prints the diff go mod tidy would apply)
	$(GO) mod tidy -diff

# Every package runs twice: at full speed, and under the race detector
# (test-race). The end-to-end tests' programs are built without it.
# agent/pmix's server tests need the pmix tag (GOTAGS: libpmix-dev, which
# deps installs); the end-to-end tests build pmirun and pmid with it.
test: deps tidy-check lib install-check ## install what is needed and run every test
	$(GO) vet $(LDFLAGS) ./...
	$(GO) vet $(LDFLAGS) $(GOTAGS) ./agent/pmix/ ./cmd/...
	$(GO) test $(LDFLAGS) -count=1 -timeout 20m ./...
	$(GO) test $(LDFLAGS) $(GOTAGS) -count=1 -race ./agent/pmix/
	$(MAKE) --no-print-directory test-race
	$(GO) test $(LDFLAGS) -count=1 -run '^$$' -bench . -benchtime=1x ./...

test-race: ## every package's tests under the race detector
	$(GO) test $(LDFLAGS) -count=1 -race -timeout 20m ./...

# -slurm starts a one-node Slurm for the run (root; stopped at the end).
bench: deps build cprog ## pmirun vs Hydra vs Slurm (srun --mpi=pmi2) side by side
	$(BIN)/pmibench -n 1,4,16,64,128 -runs 10 -pmirun $(BIN)/pmirun -slurm \
		-pmi2-prog $(CPROG)/pmi2_bench -hello-prog $(CPROG)/mpi_hello

bench-ompi: deps build cprog ## Open MPI hello and the PMIx workload: pmirun --mpi pmix vs srun --mpi=pmix vs Open MPI's mpirun (docs/pmix.md)
	$(BIN)/pmibench -mpi pmix -mpiexec none -ompi /usr/bin/mpirun.openmpi -slurm -workload hello,pmix \
		-hello-prog $(CPROG)/ompi_hello -n 1,16,64,128 -runs 5 -markdown -pmirun $(BIN)/pmirun

bench-scale: build ## scale benchmark: loopback agents x goroutine ranks to P=16384, both backends (docs/scale.md)
	$(BIN)/pmibench -scale -nodes 4,16,64 -ppn 16,64,128,256 -rounds 10 -netio net,uring -markdown \
		-pmirun $(BIN)/pmirun
	$(BIN)/pmibench -scale -nodes 64 -ppn 16,64,128,256 -late auto -rounds 10 -netio net,uring -markdown \
		-pmirun $(BIN)/pmirun

# The README's figures: pmibench draws SVG and PNG into build/plots; the
# PNGs are what docs/img keeps.
plots: deps build cprog ## regenerate docs/img/*.png: start-up vs N per launcher (Hydra, Slurm, Open MPI), pmirun's phases, scale curves, spawn latency
	$(BIN)/pmibench -n 1,4,16,64,128 -workload true,pmi2,hello -runs 5 -pmirun $(BIN)/pmirun -slurm -ompi /usr/bin/mpirun.openmpi \
		-pmi2-prog $(CPROG)/pmi2_bench -hello-prog $(CPROG)/mpi_hello -markdown -plot build/plots
	$(BIN)/pmibench -mpi pmix -mpiexec none -ompi /usr/bin/mpirun.openmpi -slurm -workload hello,pmix \
		-hello-prog $(CPROG)/ompi_hello -n 1,16,64,128 -runs 5 -markdown -pmirun $(BIN)/pmirun -plot build/plots
	$(BIN)/pmibench -scale -nodes 4,16 -ppn 16,64,256 -rounds 10 -netio net,uring -markdown \
		-pmirun $(BIN)/pmirun -plot build/plots
	$(BIN)/pmibench -spawn -slurm -timeout 120s -markdown -pmirun $(BIN)/pmirun -prog $(CPROG)/pmi2_spawnbench -plot build/plots
	mkdir -p docs/img && cp build/plots/*.png docs/img/

# The research's figures 9-12 and Table II (docs/paper.md), up to
# P = 16,384: about 10 minutes on 2 cores. The PNGs go to docs/img.
paper: deps build ## regenerate docs/img/paper-*.png: the research's figures 9-12 and Table II (pmibench -paper, docs/paper.md)
	$(BIN)/pmibench -paper -nodes 4,16,64 -ppn 256 -rounds 10 -netio net -markdown \
		-pmirun $(BIN)/pmirun -json build/paper.json -plot build/plots
	mkdir -p docs/img && cp build/plots/paper-*.png docs/img/

fuzz: ## run every fuzz target for FUZZTIME each
	@for pkg in $$($(GO) list ./...); do \
		for t in $$($(GO) test $(LDFLAGS) -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
			echo "== $$pkg $$t"; \
			$(GO) test $(LDFLAGS) -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

check: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(LDFLAGS) ./...
	$(GO) tool staticcheck ./...

# The one go install line that works (giouring needs the linker flag; see
# the README). install-check runs exactly it against an empty module cache
# (modules come from the module proxy), so a change that breaks a fresh
# install fails here, and checks that the same line without the flag
# still fails to link (if it ever links, the README's advice can go).
GOINSTALL  := $(GO) install -ldflags=-checklinkname=0 ./cmd/pmirun ./cmd/pmid ./cmd/pmibench

install: ## install pmirun, pmid, pmibench into GOBIN (go install, with the flag giouring needs)
	$(GOINSTALL)

install-check: ## go install on an empty module cache works (and needs -checklinkname=0)
	@tmp=$$(mktemp -d) && trap 'chmod -R u+w $$tmp; rm -rf $$tmp' EXIT && \
	export GOMODCACHE=$$tmp/modcache GOBIN=$$tmp/bin GOFLAGS=-modcacherw && \
	timeout 600 $(GOINSTALL) && \
	for b in pmirun pmid pmibench; do $$tmp/bin/$$b --version >/dev/null || exit 1; done && \
	if timeout 600 $(GO) install ./cmd/pmirun 2>$$tmp/err; then \
		echo "go install links without -ldflags=-checklinkname=0 now: update the README"; exit 1; \
	fi && grep -q 'invalid reference' $$tmp/err && echo "install-check: ok"

docs: ## regenerate the man pages and bash completion from the option tables
	$(GO) run $(LDFLAGS) ./internal/cli/gendocs

clean: ## remove build outputs
	rm -rf build
