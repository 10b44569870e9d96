# moonport build. `make` builds build/moonport; `make test` sets up and runs
# every test; see README.md for the rest.

CC      ?= gcc
VARIANT ?= release
LUAJIT_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUAJIT_LIBS   := $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)

# -Wmissing-prototypes: a function that is not static must be declared in
# a header first, so one declared in the wrong header (or none) fails.
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes
# BASE has no LuaJIT include path: only the binding (src/lx and the
# embedded Lua sources, gen/lx_embedded.c) gets it, so a lua.h below the
# binding fails the build (the layering rule of docs/ARCHITECTURE.md).
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
# compression (src/http/compress.c): zlib for streams, libdeflate for
# whole gzip bodies, libbrotli
ZLIBS   := -lz -ldeflate -lbrotlienc -lbrotlidec
LDLIBS  += $(LUAJIT_LIBS) -lhiredis -luring -lcares -lssl -lcrypto -lpcre2-8 $(ZLIBS) -lnghttp2 -lm -ldl
# libpq (src/pg only: its header stays out of the rest of the tree)
PQ_CFLAGS := $(shell pkg-config --cflags libpq 2>/dev/null || echo -I/usr/include/postgresql)
PQ_LIBS   := $(shell pkg-config --libs libpq 2>/dev/null || echo -lpq)
LDLIBS  += $(PQ_LIBS)

OUT     := build/$(VARIANT)
# The library below the binding: no Lua in it. The C unit tests link only
# this, without LuaJIT.
CORE_SRCS := $(wildcard src/core/*.c src/net/*.c src/cluster/*.c src/redis/*.c src/http/*.c src/pg/*.c)
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

.PHONY: all setup setup-test test lint graph-check format-check test-lua test-unit test-spec test-direct test-asan test-tsan bench run clean \
        fuzz fuzz-ci fuzz-build test-diff install uninstall deb test-deb
all: $(BIN)
	@if [ "$(VARIANT)" = release ]; then ln -sf release/moonport build/moonport; fi

# CPPFLAGS, CFLAGS and LDFLAGS from the environment are kept (the Debian
# build's dpkg-buildflags: -D_FORTIFY_SOURCE=2, -fstack-protector-strong,
# relro; scripts/test-deb checks the fortified calls are in).
$(OUT)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(OUT)/src/lx/%.o $(OUT)/gen/lx_embedded.o: CFLAGS += $(LUAJIT_CFLAGS)
$(OUT)/src/pg/%.o: CFLAGS += $(PQ_CFLAGS)

# lua/moonport/*.lua, built in as string constants (src/lx/lx_embed.h).
$(OUT)/gen/lx_embedded.c: $(LUA_MODS) scripts/embed-lua
	@mkdir -p $(dir $@)
	luajit scripts/embed-lua $@ $(LUA_MODS)

$(OUT)/gen/lx_embedded.o: $(OUT)/gen/lx_embedded.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(CORE_LIB): $(CORE_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

$(BIN): $(LX_OBJS) $(SERVER_OBJS) $(OUT)/src/main.o $(CORE_LIB)
	$(CC) $(LDFLAGS) -o $@ $(LX_OBJS) $(SERVER_OBJS) $(OUT)/src/main.o $(CORE_LIB) $(LDLIBS)

# C unit tests: the core library only, no LuaJIT.
CORE_LDLIBS := -lhiredis -luring -lcares -lssl -lcrypto $(ZLIBS) -lnghttp2 -lm -ldl $(PQ_LIBS)
# test_pg sees src/pg's internals, so libpq's header
$(OUT)/unit/test_pg: CFLAGS += $(PQ_CFLAGS)
$(OUT)/unit/%: spec/c/%.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(CORE_LDLIBS)

# `make run` installs what building and running need; the test targets
# also what the tests need (scripts/setup says which is which).
setup:
	@bash scripts/setup

setup-test:
	@bash scripts/setup --test

# The README's test command: set up, build, C unit tests, luacheck, then
# the specs (spec/lua's unit specs of lua/moonport and the end-to-end ones).
test: setup-test
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory test-unit lint test-spec

# luacheck (.luacheckrc) over the Lua the server runs, the specs, the
# examples and the benchmark scripts.
lint:
	@luacheck --quiet --formatter plain lua spec examples bench scripts/embed-lua
	@echo "lint: luacheck clean"
	@python3 scripts/include-graph

# No circle among src/ modules, by their includes and by the symbols their
# built objects use and define (scripts/include-graph says how).
graph-check: all
	@python3 scripts/include-graph --objects $(OUT)

# The C lines this branch changed (since its merge base with FORMAT_BASE,
# main by default; HEAD^ without one) in .clang-format's style: the rest
# of a file is left as it is. `clang-format-diff -p1 -i` on the same diff
# fixes them.
FORMAT_BASE ?= main
format-check:
	@base=$$(git merge-base HEAD $(FORMAT_BASE) 2>/dev/null || git rev-parse HEAD^); \
	out=$$(git diff -U0 --no-color $$base -- 'src/*.[ch]' 'spec/c/*.[ch]' 'fuzz/*.[ch]' \
	       | clang-format-diff -p1); \
	if [ -n "$$out" ]; then printf '%s\n' "$$out"; \
	  echo "format-check: changed lines above are not in .clang-format's style"; exit 1; fi; \
	echo "format-check: the changed C lines are formatted"

# The busted unit specs of the pure-Lua modules: no server, no build.
test-lua:
	@luajit /usr/bin/busted --output=TAP spec/lua

test-unit: $(UNIT)
	@set -e; for t in $(UNIT); do echo "== $$t"; $$t; done
	@echo "== $(OUT)/unit/test_reactor, with MOONPORT_IO_URING=0 (direct reads and writes)"
	@MOONPORT_IO_URING=0 $(OUT)/unit/test_reactor
	@echo "== $(OUT)/unit/test_tls, with MOONPORT_IO_URING=0"
	@MOONPORT_IO_URING=0 $(OUT)/unit/test_tls

# The specs of the plain socket, HTTP, TLS, pub/sub and SSE paths with MOONPORT_IO_URING=0:
# the reactor's direct-call path, used where io_uring is unavailable.
test-direct: all
	@MOONPORT_IO_URING=0 MOONPORT_BIN=$(abspath $(BIN)) bash scripts/run-specs \
	  spec/e2e/echo_spec.lua spec/e2e/backpressure_spec.lua spec/e2e/http_spec.lua spec/e2e/ws_spec.lua spec/e2e/ready_spec.lua \
	  spec/e2e/tls_spec.lua spec/e2e/tls_client_spec.lua spec/e2e/pubsub_spec.lua spec/e2e/sse_spec.lua

test-spec: all
	@MOONPORT_BIN=$(abspath $(BIN)) bash scripts/run-specs

test-asan: setup-test
	@$(MAKE) --no-print-directory VARIANT=asan all test-unit
	@MOONPORT_BIN=$(abspath build/asan/moonport) bash scripts/run-specs

test-tsan: setup-test
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
	@bash scripts/bench-callgrind # instructions per request: hello, JSON, static, a streamed body
	@bash scripts/bench-upload   # a 1 GiB multipart upload to disk, against busboy and Bun
	@BENCH_MULTI=$${BENCH_MULTI:-1} bash scripts/bench-http   # the pinned table, then 2 workers unpinned
	@bash scripts/bench-reload   # errors clients see through 100 reloads, against nginx
	@bash scripts/bench-idle     # bytes per idle TCP, HTTP and WebSocket connection
	@bash scripts/bench-compress # 16 KiB JSON gzip level 5: CPU per response against nginx gzip_comp_level 5
	@bash scripts/bench-tls      # HTTPS keep-alive and full handshakes against nginx (C, Lua) and node
	@bash scripts/bench-h2       # HTTP/2 (TLS, h2c, 1,000 connections) against nginx (C, Lua), h2load
	@bash scripts/bench-tls-idle # bytes per idle TLS connection against plain and nginx ssl
	@bash scripts/bench-proxy    # mp.fetch as a proxy against nginx proxy_pass and a Node keep-alive Agent
	@bash scripts/bench-batteries # mp.re, mp.crypto, mp.template, mp.jwt against ngx.re/ngx.*, hand-written pages, Node
	@bash scripts/bench-deaf-pipeline # server growth under clients that pipeline and never read, against nginx
	@bash scripts/bench-pg       # mp.pg against Node + postgres, Node + pg and Bun.sql
	@bash scripts/bench-limit    # mp.limit decisions per CPU-second against GCRA on ngx.shared and limit_req

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
                build/fuzz/fuzz_tls build/fuzz/fuzz_encoding build/fuzz/fuzz_multipart \
                build/fuzz/fuzz_ws_inflate build/fuzz/fuzz_h2

build/fuzz/fuzz_http1: fuzz/fuzz_http1.c fuzz/fuzz_check.h src/http/http1.c src/http/http1.h src/http/http1_lex.h
build/fuzz/fuzz_ws: LDLIBS_FUZZ := -lcrypto -lpthread -lz
build/fuzz/fuzz_ws: fuzz/fuzz_ws.c fuzz/fuzz_check.h src/http/ws.c src/http/ws.h \
  src/core/crypto.c src/core/crypto.h src/http/ws_deflate.c src/http/ws_deflate.h
build/fuzz/fuzz_ws_inflate: LDLIBS_FUZZ := -lcrypto -lpthread -lz
build/fuzz/fuzz_ws_inflate: fuzz/fuzz_ws_inflate.c fuzz/fuzz_check.h src/http/ws.c src/http/ws.h \
  src/core/crypto.c src/core/crypto.h src/http/ws_deflate.c src/http/ws_deflate.h
build/fuzz/fuzz_multipart: fuzz/fuzz_multipart.c fuzz/fuzz_check.h src/http/multipart.c src/http/multipart.h
build/fuzz/fuzz_h2: LDLIBS_FUZZ := -lnghttp2 -lcrypto -lpthread
build/fuzz/fuzz_h2: fuzz/fuzz_h2.c fuzz/fuzz_check.h src/http/h2.c src/http/h2_events.c \
  src/http/h2_mem.c src/core/timer.c src/core/timer.h \
  src/http/h2_response.c src/http/h2_upgrade.c src/http/h2_int.h src/http/http1.c \
  src/core/crypto.c src/core/crypto.h \
  src/http/exchange.h src/http/response.h src/http/select.h src/http/server.h \
  src/http/http1.h src/http/http1_lex.h
build/fuzz/fuzz_tls: LDLIBS_FUZZ := -lssl -lcrypto -lpthread
build/fuzz/fuzz_tls: fuzz/fuzz_tls.c fuzz/fuzz_check.h src/net/tls.c src/net/tls.h
build/fuzz/fuzz_encoding: LDLIBS_FUZZ := -lcrypto -lpthread
build/fuzz/fuzz_encoding: fuzz/fuzz_encoding.c fuzz/fuzz_check.h src/core/crypto.c src/core/crypto.h
build/fuzz/fuzz_http1_response: fuzz/fuzz_http1_response.c fuzz/fuzz_check.h \
  src/http/http1_response.c src/http/http1_response.h src/http/http1.c src/http/http1.h src/http/http1_lex.h
$(FUZZ_BINS):
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $(filter %.c,$^) $(LDLIBS_FUZZ)

fuzz-build: $(FUZZ_BINS)

fuzz: setup-test fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/run-fuzz

fuzz-ci: setup-test fuzz-build
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

test-diff: setup-test build/fuzz/diff_http1 build/fuzz/diff_http1_response
	@build/fuzz/diff_http1 fuzz/corpus/http1
	@build/fuzz/diff_http1_response fuzz/corpus/http1_response

clean:
	rm -rf build

-include $(OBJS:.o=.d) $(OUT)/src/main.d
