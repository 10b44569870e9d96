-- SPDX-License-Identifier: MIT
-- mp.re: regular expressions on PCRE2 with its JIT, through LuaJIT's FFI
-- (libpcre2-8, linked into the binary; constants from src/lx/lx_re.c).
--
-- Every pattern is compiled once per lane and kept in a bounded cache of
-- two generations: a hit is two table lookups; when the young generation
-- holds CACHE_GEN patterns it becomes the old one and the previous old one
-- is dropped (its patterns freed by the GC), and a hit in the old one
-- moves the pattern back to the young. So a lane keeps at most
-- 2 * CACHE_GEN patterns, and the ones in use survive (an LRU in two
-- steps, without per-hit bookkeeping).
--
-- Each match runs under a match limit and on a JIT stack of bounded size,
-- so a pattern that backtracks catastrophically returns nil, "match limit"
-- in milliseconds instead of holding the lane (--lua-timeout still guards
-- everything else).
local ffi = require("ffi")
local core = require("moonport.core").re

ffi.cdef([[
typedef struct pcre2_real_code_8 pcre2_code_8;
typedef struct pcre2_real_match_data_8 pcre2_match_data_8;
typedef struct pcre2_real_match_context_8 pcre2_match_context_8;
typedef struct pcre2_real_jit_stack_8 pcre2_jit_stack_8;
pcre2_code_8 *pcre2_compile_8(const char *pat, size_t len, uint32_t opts,
                              int *err, size_t *erroff, void *cctx);
void pcre2_code_free_8(pcre2_code_8 *code);
int pcre2_jit_compile_8(pcre2_code_8 *code, uint32_t opts);
int pcre2_pattern_info_8(const pcre2_code_8 *code, uint32_t what, void *where);
int pcre2_get_error_message_8(int err, unsigned char *buf, size_t len);
pcre2_match_data_8 *pcre2_match_data_create_from_pattern_8(const pcre2_code_8 *code, void *gctx);
void pcre2_match_data_free_8(pcre2_match_data_8 *md);
size_t *pcre2_get_ovector_pointer_8(pcre2_match_data_8 *md);
int pcre2_match_8(const pcre2_code_8 *code, const char *s, size_t len, size_t start,
                  uint32_t opts, pcre2_match_data_8 *md, pcre2_match_context_8 *mctx);
int pcre2_jit_match_8(const pcre2_code_8 *code, const char *s, size_t len, size_t start,
                      uint32_t opts, pcre2_match_data_8 *md, pcre2_match_context_8 *mctx);
pcre2_match_context_8 *pcre2_match_context_create_8(void *gctx);
void pcre2_match_context_free_8(pcre2_match_context_8 *mctx);
int pcre2_set_match_limit_8(pcre2_match_context_8 *mctx, uint32_t limit);
int pcre2_set_depth_limit_8(pcre2_match_context_8 *mctx, uint32_t limit);
pcre2_jit_stack_8 *pcre2_jit_stack_create_8(size_t start, size_t max, void *gctx);
void pcre2_jit_stack_free_8(pcre2_jit_stack_8 *st);
void pcre2_jit_stack_assign_8(pcre2_match_context_8 *mctx, void *cb, void *data);
]])

local C = ffi.C
local type, error, tostring, tonumber, pairs = type, error, tostring, tonumber, pairs
local sub, byte, find, format, concat = string.sub, string.byte, string.find, string.format, table.concat
local ok_new, new_tab = pcall(require, "table.new")
if not ok_new then new_tab = function() return {} end end

-- The limits, per match: backtracking steps (PCRE2's match limit, which
-- its JIT counts too) and the JIT's stack (kept per lane).
local MATCH_LIMIT = 10000000 -- PCRE2's own default
local DEPTH_LIMIT = 100000
local JIT_STACK_MAX = 1024 * 1024
local CACHE_GEN = 512

local M = {
  limits = { match = MATCH_LIMIT, depth = DEPTH_LIMIT, jit_stack = JIT_STACK_MAX,
             cache = 2 * CACHE_GEN },
}

local mctx = ffi.gc(C.pcre2_match_context_create_8(nil), C.pcre2_match_context_free_8)
assert(mctx ~= nil, "mp.re: out of memory")
C.pcre2_set_match_limit_8(mctx, MATCH_LIMIT)
C.pcre2_set_depth_limit_8(mctx, DEPTH_LIMIT)
local jstack = ffi.gc(C.pcre2_jit_stack_create_8(32 * 1024, JIT_STACK_MAX, nil),
  C.pcre2_jit_stack_free_8)
if jstack ~= nil then C.pcre2_jit_stack_assign_8(mctx, nil, jstack) end
-- mctx points at the stack; core (the lane's) keeps it from the GC.
core.jit_stack = jstack

local FLAG = {
  i = core.CASELESS, m = core.MULTILINE, s = core.DOTALL, x = core.EXTENDED,
  u = core.UTF, a = core.ANCHORED,
  j = 0, o = 0, -- OpenResty's "jit" and "compile once": always so here
}
local NOMATCH, UNSET_MIN = core.ERROR_NOMATCH, 2 ^ 63
local NO_UTF_CHECK, NOTEMPTY_ATSTART = core.NO_UTF_CHECK, core.NOTEMPTY_ATSTART
local ANCHORED = core.ANCHORED

local errbuf = ffi.new("unsigned char[256]")
local function pcre_error(code)
  local n = C.pcre2_get_error_message_8(code, errbuf, 256)
  if n < 0 then return "error " .. code end
  return ffi.string(errbuf, n)
end

local function match_error(rc)
  if rc == core.ERROR_MATCHLIMIT or rc == core.ERROR_JIT_STACKLIMIT or
      rc == core.ERROR_DEPTHLIMIT then
    return "match limit"
  end
  if rc <= core.ERROR_UTF8_FIRST and rc >= core.ERROR_UTF8_LAST then
    return "invalid UTF-8: " .. pcre_error(rc)
  end
  return pcre_error(rc)
end

local ierr, ioff = ffi.new("int[1]"), ffi.new("size_t[1]")
local info = ffi.new("uint32_t[1]")
local nametab = ffi.new("const unsigned char *[1]")

-- Compiles re with flags (a string of flag letters): a table with the
-- code, its match data and ovector, its capture count and names.
local function compile(re, flags, level)
  local opts = 0
  if flags ~= "" then
    local seen = {}
    for k = 1, #flags do
      local ch = sub(flags, k, k)
      local v = FLAG[ch]
      if not v then
        error(format("mp.re: unknown flag '%s' in \"%s\" (flags are i, m, s, x, u, a, j, o)",
          ch, flags), level + 1)
      end
      if not seen[ch] then seen[ch] = true opts = opts + v end
    end
  end
  local code = C.pcre2_compile_8(re, #re, opts, ierr, ioff, nil)
  if code == nil then
    error(format("mp.re: bad pattern \"%s\" at offset %d: %s", re, tonumber(ioff[0]),
      pcre_error(ierr[0])), level + 1)
  end
  code = ffi.gc(code, C.pcre2_code_free_8)
  local jit = core.jit and C.pcre2_jit_compile_8(code, core.JIT_COMPLETE) == 0
  local md = C.pcre2_match_data_create_from_pattern_8(code, nil)
  if md == nil then error("mp.re: out of memory", level + 1) end
  md = ffi.gc(md, C.pcre2_match_data_free_8)
  C.pcre2_pattern_info_8(code, core.INFO_CAPTURECOUNT, info)
  local ncap = tonumber(info[0])
  local names, nnames
  C.pcre2_pattern_info_8(code, core.INFO_NAMECOUNT, info)
  if info[0] > 0 then
    nnames = tonumber(info[0])
    C.pcre2_pattern_info_8(code, core.INFO_NAMEENTRYSIZE, info)
    local esize = tonumber(info[0])
    C.pcre2_pattern_info_8(code, core.INFO_NAMETABLE, nametab)
    local p = nametab[0]
    names = {}
    for k = 0, nnames - 1 do
      local e = p + k * esize
      names[e[0] * 256 + e[1]] = ffi.string(e + 2)
    end
  end
  local utf = find(flags, "u", 1, true) ~= nil
  return {
    code = code, md = md, ov = C.pcre2_get_ovector_pointer_8(md),
    ncap = ncap, names = names, nnames = nnames or 0,
    -- pcre2_jit_match skips the subject's UTF-8 check: only without 'u'
    fast = jit and not utf, utf = utf,
    anchored = opts >= ANCHORED,
  }
end

local young, old, nyoung = {}, {}, 0

local function pattern(re, flags, level)
  if type(re) ~= "string" then
    error(format("bad argument #2 (pattern string expected, got %s)", type(re)), level + 1)
  end
  flags = flags or ""
  local y = young[flags]
  local e = y and y[re]
  if e then return e end
  if type(flags) ~= "string" then
    error(format("bad argument #3 (flags string expected, got %s)", type(flags)), level + 1)
  end
  local o = old[flags]
  e = o and o[re]
  if not e then e = compile(re, flags, level + 1) end
  if nyoung >= CACHE_GEN then
    old, young, nyoung = young, {}, 0
  end
  y = young[flags]
  if not y then y = {} young[flags] = y end
  y[re] = e
  nyoung = nyoung + 1
  return e
end

-- Runs e on s from byte offset start (0-based): rc (> 0 on a match).
local function exec(e, s, start, opts)
  if e.fast then
    return C.pcre2_jit_match_8(e.code, s, #s, start, opts, e.md, mctx)
  end
  return C.pcre2_match_8(e.code, s, #s, start, opts, e.md, mctx)
end

local function checksubj(s, level)
  if type(s) == "string" then return s end
  if type(s) == "number" then return tostring(s) end
  error(format("bad argument #1 (string expected, got %s)", type(s)), level + 1)
end

-- init (1-based, negative from the end, as string.find) -> 0-based offset,
-- or nil when it is past the end.
local function offset(s, init)
  if init == nil then return 0 end
  if type(init) ~= "number" then
    error(format("bad argument #4 (number expected, got %s)", type(init)), 3)
  end
  local n = #s
  if init < 0 then
    init = n + init + 1
    if init < 1 then init = 1 end
  elseif init == 0 then
    init = 1
  end
  if init > n + 1 then return nil end
  return init - 1
end

-- The captures of the last match: m[0] the whole match, m[1..n] the
-- groups (false for one that did not take part), and named groups also
-- by name.
local function captures(e, s, rc)
  local ov, ncap = e.ov, e.ncap
  local m = new_tab(ncap, e.nnames)
  m[0] = sub(s, tonumber(ov[0]) + 1, tonumber(ov[1]))
  for k = 1, ncap do
    local a = tonumber(ov[2 * k])
    if k >= rc or a >= UNSET_MIN then
      m[k] = false
    else
      m[k] = sub(s, a + 1, tonumber(ov[2 * k + 1]))
    end
  end
  local names = e.names
  if names then
    for k, name in pairs(names) do m[name] = m[k] end
  end
  return m
end

-- mp.re.match(s, re [, flags [, init]]) -> captures, or nil (no match),
-- or nil, err ("match limit", "invalid UTF-8: ...").
function M.match(s, re, flags, init)
  s = checksubj(s, 2)
  local e = pattern(re, flags, 2)
  local start = 0
  if init then
    start = offset(s, init)
    if not start then return nil end
  end
  local rc = exec(e, s, start, 0)
  if rc < 0 then
    if rc == NOMATCH then return nil end
    return nil, match_error(rc)
  end
  return captures(e, s, rc)
end

-- mp.re.find(s, re [, flags [, init [, group]]]) -> from, to (1-based,
-- inclusive, as string.find; of capture `group` if given), or nil.
function M.find(s, re, flags, init, group)
  s = checksubj(s, 2)
  local e = pattern(re, flags, 2)
  local start = 0
  if init then
    start = offset(s, init)
    if not start then return nil end
  end
  local rc = exec(e, s, start, 0)
  if rc < 0 then
    if rc == NOMATCH then return nil end
    return nil, match_error(rc)
  end
  local g = group or 0
  if g ~= 0 then
    if type(g) ~= "number" or g < 0 or g > e.ncap then
      error("bad argument #5 to 'find' (no such group)", 2)
    end
    if g >= rc or tonumber(e.ov[2 * g]) >= UNSET_MIN then return nil end
  end
  local ov = e.ov
  return tonumber(ov[2 * g]) + 1, tonumber(ov[2 * g + 1])
end

-- The next match at or after pos (0-based) for iteration: handles an
-- empty match the way Perl and PCRE2's own demo do (retry there, not
-- empty and anchored; else step one character).
local function step_after_empty(e, s, pos)
  local rc = exec(e, s, pos, NOTEMPTY_ATSTART + ANCHORED)
  if rc ~= NOMATCH then return rc end
  local n = #s
  if pos >= n then return NOMATCH end
  local nxt = pos + 1
  if e.utf then
    while nxt < n do
      local b = byte(s, nxt + 1)
      if b < 0x80 or b >= 0xC0 then break end
      nxt = nxt + 1
    end
  end
  if e.anchored then return NOMATCH end -- the next match must start here
  return exec(e, s, nxt, NO_UTF_CHECK)
end

-- Iterates the matches of e over s: calls fn(rc) for each until it
-- returns false; returns nil or an error.
local function each(e, s, fn)
  local rc = exec(e, s, 0, 0)
  while true do
    if rc < 0 then
      if rc == NOMATCH then return nil end
      return match_error(rc)
    end
    if fn(rc) == false then return nil end
    local ov = e.ov
    local from, to = tonumber(ov[0]), tonumber(ov[1])
    if to == from then
      rc = step_after_empty(e, s, to)
    else
      rc = exec(e, s, to, e.utf and NO_UTF_CHECK or 0)
    end
  end
end

-- mp.re.gmatch(s, re [, flags]) -> iterator of captures tables; after a
-- runtime failure the iterator returns nil, err.
function M.gmatch(s, re, flags)
  s = checksubj(s, 2)
  local e = pattern(re, flags, 2)
  local pos, empty, done = 0, false, false
  return function()
    if done then return nil end
    local rc
    if empty then
      rc = step_after_empty(e, s, pos)
    else
      rc = exec(e, s, pos, pos > 0 and e.utf and NO_UTF_CHECK or 0)
    end
    if rc < 0 then
      done = true
      if rc == NOMATCH then return nil end
      return nil, match_error(rc)
    end
    local m = captures(e, s, rc)
    local from, to = tonumber(e.ov[0]), tonumber(e.ov[1])
    pos, empty = to, from == to
    return m
  end
end

-- A replacement template ("$1 and ${name}", "$$" for a dollar) as a list
-- of literal strings and group numbers; cached with the pattern (at most
-- 64 per pattern), since a name's number is the pattern's.
local function template(repl, e)
  local cache = e.templates
  if not cache then cache = {} e.templates, e.ntemplates = cache, 0 end
  local t = cache[repl]
  if t then return t end
  t = {}
  local i, n, lit = 1, #repl, {}
  while i <= n do
    local c = sub(repl, i, i)
    if c ~= "$" then
      local j = find(repl, "$", i, true) or n + 1
      lit[#lit + 1] = sub(repl, i, j - 1)
      i = j
    else
      local d = sub(repl, i + 1, i + 1)
      if d == "$" then
        lit[#lit + 1] = "$"
        i = i + 2
      elseif d:match("%d") then
        local num = repl:match("^%d+", i + 1)
        if #lit > 0 then t[#t + 1] = concat(lit) lit = {} end
        t[#t + 1] = tonumber(num)
        i = i + 1 + #num
      elseif d == "{" then
        local name = repl:match("^{([%w_]+)}", i + 1)
        if not name then error("mp.re: bad replacement \"" .. repl .. "\" (${name} or ${1})", 4) end
        if #lit > 0 then t[#t + 1] = concat(lit) lit = {} end
        local g = tonumber(name)
        if not g then
          for idx, nm in pairs(e.names or {}) do if nm == name then g = idx end end
          if not g then
            error("mp.re: replacement \"" .. repl .. "\" names '" .. name ..
              "', which the pattern has no group for", 4)
          end
        end
        t[#t + 1] = g
        i = i + 3 + #name
      else
        error("mp.re: bad replacement \"" .. repl .. "\" ($ must be $$, $N or ${name})", 4)
      end
    end
  end
  if #lit > 0 then t[#t + 1] = concat(lit) end
  for _, part in ipairs(t) do
    if type(part) == "number" and part > e.ncap then
      error("mp.re: replacement \"" .. repl .. "\" names group " .. part ..
        " but the pattern has " .. e.ncap, 4)
    end
  end
  if e.ntemplates >= 64 then cache = {} e.templates, e.ntemplates = cache, 0 end
  cache[repl] = t
  e.ntemplates = e.ntemplates + 1
  return t
end

local function replace(s, re, repl, flags, max)
  s = checksubj(s, 3)
  local e = pattern(re, flags, 3)
  local tr = type(repl)
  local tmpl
  if tr == "string" or tr == "number" then
    repl = tostring(repl)
    if not find(repl, "$", 1, true) then tmpl = repl else tmpl = template(repl, e) end
  elseif tr ~= "function" and tr ~= "table" then
    error("bad argument #3 (string, function or table expected, got " .. tr .. ")", 3)
  end
  local out, nout, last, count = {}, 0, 0, 0
  local err = each(e, s, function(rc)
    local ov = e.ov
    local from, to = tonumber(ov[0]), tonumber(ov[1])
    nout = nout + 1
    out[nout] = sub(s, last + 1, from)
    local r
    if type(tmpl) == "string" then
      r = tmpl
    elseif tmpl then
      local parts = {}
      for k, part in ipairs(tmpl) do
        if type(part) == "string" then
          parts[k] = part
        else
          local g = part
          local a = tonumber(ov[2 * g])
          parts[k] = (g < rc and a < UNSET_MIN) and sub(s, a + 1, tonumber(ov[2 * g + 1])) or ""
        end
      end
      r = concat(parts)
    else
      local m = captures(e, s, rc)
      if tr == "function" then r = repl(m) else r = repl[m[0]] end
      if r == nil or r == false then
        r = m[0]
      elseif type(r) ~= "string" then
        if type(r) ~= "number" then
          error("mp.re: the replacement returned a " .. type(r) .. " (string expected)", 5)
        end
        r = tostring(r)
      end
    end
    nout = nout + 1
    out[nout] = r
    last = to
    count = count + 1
    if max and count >= max then return false end
  end)
  if err then return nil, err end
  if count == 0 then return s, 0 end
  nout = nout + 1
  out[nout] = sub(s, last + 1)
  return concat(out, "", 1, nout), count
end

-- mp.re.gsub(s, re, repl [, flags]) -> the new string, the number of
-- matches replaced; or nil, err. repl: a string with $0, $1, ${name} and
-- $$; a function(m) returning the replacement (nil or false: keep the
-- match); or a table looked up by the whole match.
function M.gsub(s, re, repl, flags)
  local r, n = replace(s, re, repl, flags) -- no tail call: error levels count this frame
  return r, n
end

-- mp.re.sub(s, re, repl [, flags]): the first match only.
function M.sub(s, re, repl, flags)
  local r, n = replace(s, re, repl, flags, 1)
  return r, n
end

-- mp.re.split(s, re [, flags [, max]]) -> a list of the pieces between
-- matches (at most max pieces: the last holds the rest); or nil, err.
function M.split(s, re, flags, max)
  s = checksubj(s, 2)
  local e = pattern(re, flags, 2)
  if max ~= nil and (type(max) ~= "number" or max < 1) then
    error("bad argument #4 to 'split' (a count >= 1 expected)", 2)
  end
  local out, last = {}, 0
  local err = each(e, s, function()
    if max and #out + 1 >= max then return false end
    local ov = e.ov
    local from, to = tonumber(ov[0]), tonumber(ov[1])
    if to == 0 and from == 0 then return end -- an empty match at the start splits nothing
    if from == to and from >= #s then return false end
    out[#out + 1] = sub(s, last + 1, from)
    last = to
  end)
  if err then return nil, err end
  out[#out + 1] = sub(s, last + 1)
  return out
end

-- mp.re.escape(s): s with every character that means something in a
-- pattern escaped, to match it literally.
function M.escape(s)
  s = checksubj(s, 2)
  return (s:gsub("[%^%$%.%[%]%|%(%)%?%*%+%{%}%\\%-%#%s/]", "\\%0"))
end

return M
