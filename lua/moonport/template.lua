-- SPDX-License-Identifier: MIT
-- mp.template: HTML templates compiled to Lua functions once.
--
--   {{ expr }}         the value, HTML-escaped (nil prints nothing)
--   {{{ expr }}}       the value as is; also {{ raw(expr) }}
--   {% lua code %}     statements: {% for _, r in ipairs(rows) do %} ... {% end %}
--   {# comment #}
--   {% include "file.html" [, ctx] %}   another template, with this ctx or ctx
--   {% extends "layout.html" %}         this template fills the layout's blocks
--   {% block name %} ... {% endblock %} a block: defined by a child, default in a layout
--   {{- and -}} (also {%- -%}) remove the whitespace before / after the tag
--
-- Names in expressions are looked up in the context table, then in the
-- globals. The generated Lua keeps the template's line structure (each
-- literal newline becomes a newline of the code too), so a compile or
-- runtime error names the template file and its line, never generated
-- code. Templates loaded by render/include are cached per lane by path;
-- a reload starts new lanes, so edits are seen after a reload.
local concat, sub, find, format, gsub = table.concat, string.sub, string.find, string.format, string.gsub
local type, tostring, error, setmetatable, getmetatable, pcall = type, tostring, error, setmetatable,
  getmetatable, pcall
local setfenv, loadstring, io_open = setfenv, loadstring, io.open
local G = _G

local M = {}

-- ---- escaping ----

local ESC = { ["<"] = "&lt;", [">"] = "&gt;", ["&"] = "&amp;", ['"'] = "&quot;", ["'"] = "&#39;" }

-- The marker raw() wraps a value in, so {{ raw(x) }} skips the escape.
local raw_mt = {}
local function raw(v) return setmetatable({ v }, raw_mt) end

local function esc(v)
  local t = type(v)
  if t == "string" then
    if not find(v, "[<>&\"']") then return v end
    return (gsub(v, "[<>&\"']", ESC))
  elseif t == "number" then
    return tostring(v)
  elseif v == nil then
    return ""
  elseif t == "boolean" then
    return tostring(v)
  elseif t == "table" and getmetatable(v) == raw_mt then
    v = v[1]
    if v == nil then return "" end
    return tostring(v)
  end
  error("template: cannot print a " .. t .. " (tostring it first)", 2)
end

local function unesc(v)
  if v == nil then return "" end
  if type(v) == "table" and getmetatable(v) == raw_mt then v = v[1] end
  if v == nil then return "" end
  return tostring(v)
end

M.escape = esc
M.raw = raw

-- ---- the compiler ----

local function lines_in(s, i, j)
  local n = 0
  for _ in (sub(s, i, j)):gmatch("\n") do n = n + 1 end
  return n
end

local function parse_error(name, src, pos, msg)
  error(format("%s:%d: %s", name, lines_in(src, 1, pos) + 1, msg), 0)
end

-- Emits the code for literal text: a quoted string (%q keeps newlines as
-- backslash-newline, so the code advances by the same number of lines).
local function literal(out, text)
  if text ~= "" then out[#out + 1] = format("_n=_n+1 _b[_n]=%q ", text) end
end

-- Translates src to the body of a Lua function; returns the code, the
-- layout it extends (or nil) and whether it defines blocks.
local function translate(src, name)
  local out = {}
  local pos, n = 1, #src
  local extends
  local blocks = {}   -- open blocks, innermost last
  local strip_next = false
  while pos <= n do
    local s = find(src, "{", pos, true)
    local open
    while s do
      local c = sub(src, s + 1, s + 1)
      if c == "{" or c == "%" or c == "#" then open = c break end
      s = find(src, "{", s + 1, true)
    end
    local text = sub(src, pos, s and s - 1 or n)
    if strip_next then text = text:gsub("^%s+", function(ws)
      -- keep the newlines in the code so the lines still match
      local k = select(2, ws:gsub("\n", ""))
      if k > 0 then out[#out + 1] = string.rep("\n", k) end
      return ""
    end) strip_next = false end
    if not s then literal(out, text) break end
    local triple = open == "{" and sub(src, s + 2, s + 2) == "{"
    local body_start = s + (triple and 3 or 2)
    local trim_left = sub(src, body_start, body_start) == "-"
    if trim_left then
      body_start = body_start + 1
      local stripped = text:match("^(.-)%s*$")
      local k = select(2, sub(text, #stripped + 1):gsub("\n", ""))
      literal(out, stripped)
      if k > 0 then out[#out + 1] = string.rep("\n", k) end
    else
      literal(out, text)
    end
    local close = triple and "}}}" or (open == "{" and "}}" or (open == "%" and "%}" or "#}"))
    local e = find(src, close, body_start, true)
    if not e then parse_error(name, src, s, "unclosed " .. sub(src, s, body_start - 1)) end
    local body = sub(src, body_start, e - 1)
    if sub(body, -1) == "-" and not triple then
      body = sub(body, 1, -2)
      strip_next = true
    end
    pos = e + #close
    if open == "#" then
      local k = lines_in(body, 1, #body)
      if k > 0 then out[#out + 1] = string.rep("\n", k) end
    elseif open == "{" then
      if body:match("^%s*$") then parse_error(name, src, s, "empty {{ }}") end
      -- the expression stays on its own lines, wrapped in parentheses
      out[#out + 1] = (triple and "_n=_n+1 _b[_n]=_unesc(" or "_n=_n+1 _b[_n]=_esc(") .. body .. ") "
    else
      local kw, rest = body:match("^%s*(%a+)%s*(.-)%s*$")
      if kw == "include" then
        local file, ctxexpr = rest:match("^([\"'][^\"']+[\"'])%s*,?%s*(.*)$")
        if not file then parse_error(name, src, s, "include needs a quoted file name") end
        out[#out + 1] = format("_n=_n+1 _b[_n]=_include(%s, %s) ", file,
          ctxexpr ~= "" and ctxexpr or "_ctx")
      elseif kw == "extends" then
        local file = rest:match("^([\"'][^\"']+[\"'])$")
        if not file then parse_error(name, src, s, "extends needs a quoted file name") end
        if extends then parse_error(name, src, s, "a second extends") end
        extends = file
      elseif kw == "block" then
        local bname = rest:match("^([%a_][%w_]*)$")
        if not bname then parse_error(name, src, s, "block needs a name") end
        blocks[#blocks + 1] = bname
        -- the block's body is a function with its own buffer; a child's
        -- definition (in _blocks) wins over this one
        out[#out + 1] = format("local _blk_%s=function() local _b,_n={},0 ", bname)
      elseif kw == "endblock" then
        local bname = table.remove(blocks)
        if not bname then parse_error(name, src, s, "endblock without block") end
        out[#out + 1] = format("return _concat(_b,'',1,_n) end " ..
          "if _blocks[%q]==nil then _blocks[%q]=_blk_%s end " ..
          "if not _ext then _n=_n+1 _b[_n]=_blocks[%q]() end ", bname, bname, bname, bname)
      else
        out[#out + 1] = body .. " "
      end
    end
  end
  if #blocks > 0 then parse_error(name, src, n, "block '" .. blocks[#blocks] .. "' has no endblock") end
  return concat(out), extends
end

local load_template -- (file) -> the compiled function, cached

-- The environment of one render: the context first, then raw(), then the
-- globals; assignments stay in it (never in _G).
local function env_of(ctx)
  return setmetatable({}, { __index = function(_, k)
    local v = ctx[k]
    if v == nil then
      if k == "raw" then return raw end
      v = G[k]
    end
    return v
  end })
end

-- A missing or broken file names the line of the include or extends.
local function include(file, ctx)
  local ok, f = pcall(load_template, file)
  if not ok then error(f, 2) end
  return f(ctx)
end

local function layout(file, ctx, blocks)
  local ok, f = pcall(load_template, file)
  if not ok then error(f, 2) end
  return f(ctx, blocks)
end

-- The function a template compiles to: fn(ctx [, blocks]) -> string. Each
-- call makes a fresh closure of the body with its own environment, so a
-- template that includes itself, or renders in two coroutines at once,
-- never sees another call's context.
local function build(src, name)
  local code, extends = translate(src, name)
  -- All on the first line, so the template's line 1 is the code's line 1.
  local head = "local _esc,_unesc,_concat,_include,_layout,_env_of,_setfenv,_ext=... " ..
    "return function(_ctx,_blocks) if _ctx==nil then _ctx={} end _blocks=_blocks or {} " ..
    "return _setfenv(function() local _b,_n={},0 "
  local tail
  if extends then
    tail = format(" return _layout(%s,_ctx,_blocks) end,_env_of(_ctx))() end", extends)
  else
    tail = " return _concat(_b,'',1,_n) end,_env_of(_ctx))() end"
  end
  local chunk, err = loadstring(head .. code .. tail, "=" .. name)
  if not chunk then error(err, 0) end
  setfenv(chunk, {})
  local fn = chunk(esc, unesc, concat, include, layout, env_of, setfenv, extends ~= nil)
  return function(ctx, blocks)
    if ctx ~= nil and type(ctx) ~= "table" then
      error("template " .. name .. ": the context must be a table, not a " .. type(ctx), 2)
    end
    return fn(ctx, blocks)
  end
end

-- mp.template.compile(src [, name]) -> fn(ctx) -> string. name (default
-- "template") is what errors say; includes are looked up in M.root.
function M.compile(src, name)
  if type(src) ~= "string" then
    error("bad argument #1 to 'compile' (string expected, got " .. type(src) .. ")", 2)
  end
  name = name or "template"
  local ok, fn = pcall(build, src, name)
  if not ok then error(fn, 2) end
  return fn
end

local cache = {}  -- path -> compiled function, for this lane

local function root()
  if M.root then return M.root end
  local script = G.arg and G.arg[0]
  local dir = script and script:match("^(.*)/[^/]*$") or "."
  M.root = dir
  return dir
end

load_template = function(file)
  if type(file) ~= "string" or find(file, "..", 1, true) or sub(file, 1, 1) == "/" then
    error("template: bad file name '" .. tostring(file) ..
      "' (relative to mp.template.root, without ..)", 0)
  end
  local path = root() .. "/" .. file
  local fn = cache[path]
  if fn then return fn end
  local f, err = io_open(path, "rb")
  if not f then error("template: " .. err, 0) end
  local src = f:read("*a")
  f:close()
  fn = build(src, file)
  cache[path] = fn
  return fn
end

-- mp.template.render(file, ctx) -> string; file relative to
-- mp.template.root (default: the script's folder).
function M.render(file, ctx)
  local ok, fn = pcall(load_template, file)
  if not ok then error(fn, 2) end
  return fn(ctx)
end

-- Forgets the compiled templates (they are read again on next use).
function M.clear() cache = {} end

return M
