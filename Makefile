# moonport build. `make` builds build/moonport; `make test` sets up and runs
# every test; see README.md for the rest.

CC      ?= gcc
VARIANT ?= release
LUAJIT_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUAJIT_LIBS   := $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wstrict-prototypes
# BASE has no LuaJIT include path: only the binding (src/lx, main.c, the
# generated module table) gets it, so a lua.h below the binding fails the
# build (the layering rule of docs/ARCHITECTURE.md).
BASE    := -std=gnu11 -g -pthread -D_GNU_SOURCE -Isrc $(WARN)
ifeq ($(VARIANT),release)
  OPT := -O2
else ifeq ($(VARIANT),asan)
  OPT := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
else ifeq ($(VARIANT),tsan)
  OPT := -O1 -fno-omit-frame-pointer -fsanitize=thread
else
  $(error VARIANT must be release, asan or tsan)
endif
CFLAGS  += $(BASE) $(OPT)
LDFLAGS += $(OPT) -pthread -rdynamic
LDLIBS  += $(LUAJIT_LIBS) -lhiredis -luring -lcares -lssl -lcrypto -lm -ldl

OUT     := build/$(VARIANT)
# The library below the binding: no Lua in it. The C unit tests link only
# this, without LuaJIT.
CORE_SRCS := $(wildcard src/core/*.c src/net/*.c src/cluster/*.c src/redis/*.c src/http/*.c)
CORE_OBJS := $(CORE_SRCS:%.c=$(OUT)/%.o)
CORE_LIB  := $(OUT)/libmoonport-core.a
# Process management (src/server) drives the binding's lanes but has no
# lua.h either; it links into the binary, not the core library.
SERVER_SRCS := $(wildcard src/server/*.c)
SERVER_OBJS := $(SERVER_SRCS:%.c=$(OUT)/%.o)
LX_SRCS   := $(wildcard src/lx/*.c)
LUA_MODS  := $(sort $(wildcard lua/moonport/*.lua lua/moonport/*/*.lua))
LX_OBJS   := $(LX_SRCS:%.c=$(OUT)/%.o) $(OUT)/gen/lx_embedded.o
OBJS      := $(CORE_OBJS) $(SERVER_OBJS) $(LX_OBJS)
UNIT      := $(patsubst spec/c/%.c,$(OUT)/unit/%,$(wildcard spec/c/test_*.c))
BIN       := $(OUT)/moonport

.PHONY: all setup test lint test-lua test-unit test-spec test-direct test-asan test-tsan bench run clean \
        fuzz fuzz-ci fuzz-build test-diff install uninstall deb test-deb
all: $(BIN)
	@if [ "$(VARIANT)" = release ]; then ln -sf release/moonport build/moonport; fi

$(OUT)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(OUT)/src/lx/%.o $(OUT)/gen/lx_embedded.o: CFLAGS += $(LUAJIT_CFLAGS)

# lua/moonport/*.lua, built in as string constants (src/lx/lx_embed.h).
$(OUT)/gen/lx_embedded.c: $(LUA_MODS) scripts/embed-lua
	@mkdir -p $(dir $@)
	luajit scripts/embed-lua $@ $(LUA_MODS)

$(OUT)/gen/lx_embedded.o: $(OUT)/gen/lx_embedded.c
	$(CC) $(CFLAGS) -c $< -o $@

$(CORE_LIB): $(CORE_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

$(BIN): $(LX_OBJS) $(SERVER_OBJS) $(OUT)/src/main.o $(CORE_LIB)
	$(CC) $(LDFLAGS) -o $@ $(LX_OBJS) $(SERVER_OBJS) $(OUT)/src/main.o $(CORE_LIB) $(LDLIBS)

# C unit tests: the core library only, no LuaJIT.
CORE_LDLIBS := -lhiredis -luring -lcares -lssl -lcrypto -lm -ldl
$(OUT)/unit/%: spec/c/%.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(CORE_LDLIBS)

setup:
	@bash scripts/setup

# The README's test command: set up, build, C unit tests, luacheck, then
# the specs (spec/lua's unit specs of lua/moonport and the end-to-end ones).
test: setup
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory test-unit lint test-spec

# luacheck (.luacheckrc) over the Lua the server runs, the specs, the
# examples and the benchmark scripts.
lint:
	@luacheck --quiet --formatter plain lua spec examples bench scripts/embed-lua
	@echo "lint: luacheck clean"

# The busted unit specs of the pure-Lua modules: no server, no build.
test-lua:
	@luajit /usr/bin/busted --output=TAP spec/lua

test-unit: $(UNIT)
	@set -e; for t in $(UNIT); do echo "== $$t"; $$t; done
	@echo "== $(OUT)/unit/test_reactor, with MOONPORT_IO_URING=0 (direct reads and writes)"
	@MOONPORT_IO_URING=0 $(OUT)/unit/test_reactor
	@echo "== $(OUT)/unit/test_tls, with MOONPORT_IO_URING=0"
	@MOONPORT_IO_URING=0 $(OUT)/unit/test_tls

# The specs of the plain socket, HTTP and TLS paths with MOONPORT_IO_URING=0:
# the reactor's direct-call path, used where io_uring is unavailable.
test-direct: all
	@MOONPORT_IO_URING=0 MOONPORT_BIN=$(abspath $(BIN)) bash scripts/run-specs \
	  spec/e2e/echo_spec.lua spec/e2e/backpressure_spec.lua spec/e2e/http_spec.lua spec/e2e/ws_spec.lua spec/e2e/ready_spec.lua \
	  spec/e2e/tls_spec.lua spec/e2e/tls_client_spec.lua

test-spec: all
	@MOONPORT_BIN=$(abspath $(BIN)) bash scripts/run-specs

test-asan: setup
	@$(MAKE) --no-print-directory VARIANT=asan all test-unit
	@MOONPORT_BIN=$(abspath build/asan/moonport) bash scripts/run-specs

test-tsan: setup
	@$(MAKE) --no-print-directory VARIANT=tsan all test-unit
	@MOONPORT_BIN=$(abspath build/tsan/moonport) MOONPORT_TEST_THREADS=4 \
	  bash scripts/run-specs

bench: all
	@bash scripts/setup --bench
	@bash scripts/bench-echo
	@bash scripts/bench-pubsub
	@bash scripts/bench-fanout
	@bash scripts/bench-redis
	@bash scripts/bench-shared
	@bash scripts/bench-router   # what a 50-route mp.router adds to a request
	@BENCH_MULTI=$${BENCH_MULTI:-1} bash scripts/bench-http   # the pinned table, then 2 workers unpinned
	@bash scripts/bench-reload   # errors clients see through 100 reloads, against nginx
	@bash scripts/bench-idle     # bytes per idle TCP, HTTP and WebSocket connection
	@bash scripts/bench-tls      # HTTPS keep-alive and full handshakes against nginx (C, Lua) and node
	@bash scripts/bench-tls-idle # bytes per idle TLS connection against plain and nginx ssl
	@bash scripts/bench-proxy    # mp.fetch as a proxy against nginx proxy_pass and a Node keep-alive Agent

run: setup
	@$(MAKE) --no-print-directory all
	./build/moonport --log-level info examples/echo.lua

# `make install PREFIX=/usr/local DESTDIR=`: the binary, the man page, the
# docs and the examples (the systemd unit and logrotate file are in
# contrib/; the Debian package installs them). INSTALL_BIN picks another
# build of the binary (the install spec uses the one it tests).
PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
MANDIR      ?= $(PREFIX)/share/man
DOCDIR      ?= $(PREFIX)/share/doc/moonport
INSTALL_BIN ?= $(BIN)
DOCS        := README.md docs/API.md docs/ARCHITECTURE.md
EXAMPLES    := $(wildcard examples/*.lua)

install: $(INSTALL_BIN)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 \
	  $(DESTDIR)$(DOCDIR)/examples/chat $(DESTDIR)$(DOCDIR)/contrib
	install -m 755 $(INSTALL_BIN) $(DESTDIR)$(BINDIR)/moonport
	install -m 644 docs/moonport.1 $(DESTDIR)$(MANDIR)/man1/moonport.1
	install -m 644 $(DOCS) $(DESTDIR)$(DOCDIR)/
	install -m 644 $(EXAMPLES) $(DESTDIR)$(DOCDIR)/examples/
	install -m 644 examples/chat/* $(DESTDIR)$(DOCDIR)/examples/chat/
	install -m 644 contrib/moonport.service contrib/moonport.logrotate \
	  contrib/app.lua $(DESTDIR)$(DOCDIR)/contrib/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/moonport $(DESTDIR)$(MANDIR)/man1/moonport.1
	rm -rf $(DESTDIR)$(DOCDIR)

# The Debian package (debian/), built with dpkg-buildpackage from a copy of
# the tracked files under build/deb/ (so its clean step never touches this
# tree's build/); the .deb lands in build/deb/. `make test-deb` builds it
# and checks it (scripts/test-deb). Neither is part of `make test`.
DEB_VERSION = $(shell dpkg-parsechangelog -S Version 2>/dev/null)
deb:
	@bash scripts/setup --deb
	rm -rf build/deb && mkdir -p build/deb/moonport-$(DEB_VERSION)
	git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C build/deb/moonport-$(DEB_VERSION)
	cd build/deb/moonport-$(DEB_VERSION) && dpkg-buildpackage -us -uc -b
	@ls build/deb/*.deb

test-deb: deb
	@bash scripts/test-deb build/deb/moonport_$(DEB_VERSION)_*.deb

# libFuzzer targets (clang) for the HTTP and WebSocket parsers, run on a
# scratch copy of fuzz/corpus/; see docs/FUZZING.md.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS  := -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc $(WARN) \
                -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=undefined
FUZZ_BINS    := build/fuzz/fuzz_http1 build/fuzz/fuzz_ws build/fuzz/fuzz_http1_response \
                build/fuzz/fuzz_tls

build/fuzz/fuzz_http1: fuzz/fuzz_http1.c fuzz/fuzz_check.h src/http/http1.c src/http/http1.h src/http/http1_lex.h
build/fuzz/fuzz_ws: fuzz/fuzz_ws.c fuzz/fuzz_check.h src/http/ws.c src/http/ws.h
build/fuzz/fuzz_tls: LDLIBS_FUZZ := -lssl -lcrypto -lpthread
build/fuzz/fuzz_tls: fuzz/fuzz_tls.c fuzz/fuzz_check.h src/net/tls.c src/net/tls.h
build/fuzz/fuzz_http1_response: fuzz/fuzz_http1_response.c fuzz/fuzz_check.h \
  src/http/http1_response.c src/http/http1_response.h src/http/http1.c src/http/http1.h src/http/http1_lex.h
$(FUZZ_BINS):
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $(filter %.c,$^) $(LDLIBS_FUZZ)

fuzz-build: $(FUZZ_BINS)

fuzz: setup fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/run-fuzz

fuzz-ci: setup fuzz-build
	@FUZZ_SECONDS=20 bash scripts/run-fuzz

# moonport's request parser against Debian's http_parser on every seed.
build/fuzz/diff_http1: fuzz/diff_http1.c src/http/http1.c src/http/http1.h src/http/http1_lex.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc $(WARN) -o $@ \
	  $(filter %.c,$^) -lhttp_parser

# The response parser against it in HTTP_RESPONSE mode, on its own seeds.
build/fuzz/diff_http1_response: fuzz/diff_http1_response.c src/http/http1_response.c \
  src/http/http1_response.h src/http/http1.c src/http/http1.h src/http/http1_lex.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc $(WARN) -o $@ \
	  $(filter %.c,$^) -lhttp_parser

test-diff: setup build/fuzz/diff_http1 build/fuzz/diff_http1_response
	@build/fuzz/diff_http1 fuzz/corpus/http1
	@build/fuzz/diff_http1_response fuzz/corpus/http1_response

clean:
	rm -rf build

-include $(OBJS:.o=.d) $(OUT)/src/main.d
