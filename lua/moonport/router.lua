-- SPDX-License-Identifier: MIT
-- mp.router(): routes requests to handlers by method and path, with :name
-- and *splat parameters in req.params. Pure Lua (no server needed, see
-- spec/lua/router_spec.lua); mounted as mp.http { on_request = r }.
--
-- Paths without parameters are one hash look-up; the others walk a tree of
-- path segments (literal before :param before *splat, backtracking when a
-- branch fails), so the cost depends on the path's depth, not on the
-- number of routes. A trailing slash is ignored ("/a/" is "/a"), except
-- for "/" itself. req.path is the decoded path, so "%2F" is a separator.
local setmetatable, getmetatable, type, error, tostring, pairs, ipairs =
  setmetatable, getmetatable, type, error, tostring, pairs, ipairs
local xpcall, traceback = xpcall, debug.traceback
local concat, sort, byte, sub, find = table.concat, table.sort, string.byte, string.sub, string.find

local SLASH = 47 -- "/"
local loaded = package.loaded

-- table.new (LuaJIT 2.1) sizes req.params once instead of growing it
local ok_tnew, tnew = pcall(require, "table.new")
if not ok_tnew then tnew = function() return {} end end

-- Registration errors are raised at the caller's line: the inner
-- functions raise a table, and the public methods (wrapped by `public`)
-- turn it into a message at level 2.
local function raise(msg) error({ router_error = msg }, 0) end

local function public(fn)
  return function(...)
    local ok, v = pcall(fn, ...)
    if ok then return v end
    if type(v) == "table" and v.router_error then error(v.router_error, 2) end
    error(v, 0)
  end
end

-- Whether a middleware answered: res:sent(), or inside the binary the
-- same through the FFI (lx_res_sent_ffi in src/lx/lx_http.c), which the
-- JIT compiles into the trace instead of leaving it for a C call. Only for
-- a real response (its metatable is protected with this name); a router
-- driven by hand with another res object takes res:sent().
local RES_MT = "moonport.http.response"
local ffi_sent
do
  local ok, ffi = pcall(require, "ffi")
  if ok then
    pcall(ffi.cdef, "int lx_res_sent_ffi(const void *res);")
    local found, fn = pcall(function() return ffi.C.lx_res_sent_ffi end)
    if found then ffi_sent = fn end
  end
end
local function sent(res)
  if ffi_sent and getmetatable(res) == RES_MT then return ffi_sent(res) ~= 0 end
  return res:sent()
end

local M = {}
local Router = {}
Router.__index = Router

local function new_node()
  return { lit = {}, param = nil, splat = nil, ep = nil }
end

-- Endpoints hold the handlers of one pattern: ep.methods[METHOD] = fn,
-- ep.any = fn for r:all, ep.names = the parameter names in order.
local function new_ep(names, pattern)
  return { methods = {}, any = nil, names = names, allow = nil, pattern = pattern }
end

local function strip(path)
  local n = #path
  if n > 1 and byte(path, n) == SLASH then return sub(path, 1, n - 1) end
  return path
end

local function parse(pattern)
  if type(pattern) ~= "string" or byte(pattern, 1) ~= SLASH then
    raise("mp.router: a pattern is a string that starts with / (got " ..
      tostring(pattern) .. ")")
  end
  local segs, names, dynamic = {}, {}, false
  local p = strip(pattern)
  if p == "/" then return segs, names, false end
  local i = 2
  while true do
    local j = find(p, "/", i, true)
    local seg = sub(p, i, (j or 0) - 1)
    local c = byte(seg, 1)
    if c == 58 then -- ":"
      local name = sub(seg, 2)
      if not name:match("^[%w_]+$") then
        raise("mp.router: bad parameter '" .. seg .. "' in " .. pattern)
      end
      segs[#segs + 1] = { kind = "param" }
      names[#names + 1] = name
      dynamic = true
    elseif c == 42 then -- "*"
      if j then raise("mp.router: *splat must be last in " .. pattern) end
      local name = sub(seg, 2)
      if name == "" then name = "splat" end
      if not name:match("^[%w_]+$") then
        raise("mp.router: bad splat '" .. seg .. "' in " .. pattern)
      end
      segs[#segs + 1] = { kind = "splat" }
      names[#names + 1] = name
      dynamic = true
    else
      segs[#segs + 1] = { kind = "lit", text = seg }
    end
    if not j then break end
    i = j + 1
  end
  return segs, names, dynamic
end

local function same_names(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function endpoint(self, pattern)
  local segs, names, dynamic = parse(pattern)
  local ep
  if not dynamic then
    local key = strip(pattern)
    ep = self.static[key]
    if not ep then
      ep = new_ep(names, key)
      self.static[key] = ep
    end
    return ep
  end
  local node = self.root
  for k = 1, #segs do
    local s = segs[k]
    if s.kind == "lit" then
      local nx = node.lit[s.text]
      if not nx then
        nx = new_node()
        node.lit[s.text] = nx
      end
      node = nx
    elseif s.kind == "param" then
      node.param = node.param or new_node()
      node = node.param
    else
      node.splat = node.splat or new_ep(names, strip(pattern))
      ep = node.splat
    end
  end
  if not ep then
    node.ep = node.ep or new_ep(names, strip(pattern))
    ep = node.ep
  end
  if not same_names(ep.names, names) then
    raise("mp.router: " .. pattern .. " names its parameters differently " ..
      "from a route already on the same path")
  end
  return ep
end

local function add(self, method, pattern, fn)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn)
      and getmetatable(fn).__call) then
    raise("mp.router: the handler of " .. tostring(pattern) ..
      " must be a function (got " .. type(fn) .. ")")
  end
  local ep = endpoint(self, pattern)
  if method == nil then
    if ep.any then raise("mp.router: all " .. pattern .. " is already routed") end
    ep.any = fn
  else
    if ep.methods[method] then
      raise("mp.router: " .. method .. " " .. pattern .. " is already routed")
    end
    ep.methods[method] = fn
  end
  ep.allow = nil
  return self
end

for _, m in ipairs({ "get", "post", "put", "patch", "delete", "head", "options" }) do
  local METHOD = m:upper()
  Router[m] = public(function(self, pattern, fn) return add(self, METHOD, pattern, fn) end)
end

-- r:all(pattern, fn): every method.
Router.all = public(function(self, pattern, fn) return add(self, nil, pattern, fn) end)

-- r:route(method, pattern, fn): any method by name ("PROPFIND", ...).
Router.route = public(function(self, method, pattern, fn)
  if type(method) ~= "string" or not method:match("^[%u]+$") then
    raise("mp.router: a method is an upper-case token (got " .. tostring(method) .. ")")
  end
  return add(self, method, pattern, fn)
end)

local function callable(fn)
  return type(fn) == "function" or (type(fn) == "table" and getmetatable(fn)
    and getmetatable(fn).__call) and true or false
end

local function hook(self, field, what, fn)
  if not callable(fn) then
    raise("mp.router: " .. what .. " takes a function (got " .. type(fn) .. ")")
  end
  self[field] = fn
  return self
end

-- r:not_found(fn): what answers a path no route has (default: 404).
Router.not_found = public(function(self, fn) return hook(self, "on_not_found", "not_found", fn) end)
-- r:method_not_allowed(fn(req, res, allow)): what answers a path routed for
-- other methods (default: 405 with Allow; Allow is set before fn runs).
Router.method_not_allowed = public(function(self, fn)
  return hook(self, "on_405", "method_not_allowed", fn)
end)
-- r:on_error(fn(req, res, err)): answers when a middleware or a handler
-- raised (the error is logged first); if fn doesn't answer, the server's
-- 500 does.
Router.on_error = public(function(self, fn) return hook(self, "on_err", "on_error", fn) end)

-- r:use([prefix,] fn(req, res)): middleware, run before the route in the
-- order added; one that answers (res:sent()) ends the request there. A
-- prefix ("/api") limits it to that path and the paths under it.
Router.use = public(function(self, prefix, fn)
  if fn == nil then prefix, fn = "/", prefix end
  if type(prefix) ~= "string" or byte(prefix, 1) ~= SLASH then
    raise("mp.router: r:use's prefix is a path that starts with / (got " .. tostring(prefix) .. ")")
  end
  if not callable(fn) then raise("mp.router: r:use takes a function (got " .. type(fn) .. ")") end
  local mw = self.mw or {}
  prefix = strip(prefix)
  mw[#mw + 1] = { prefix = prefix ~= "/" and prefix or nil, fn = fn }
  self.mw = mw
  self.run_mw = nil -- linked again on the next request
  return self
end)

-- r:after(fn(req, res)): runs after every request the router handled,
-- answered or failed (for logs and metrics: the answer has gone out
-- unless it streams). An error in it is logged.
Router.after = public(function(self, fn)
  if not callable(fn) then raise("mp.router: r:after takes a function (got " .. type(fn) .. ")") end
  local list = self.afters or {}
  list[#list + 1] = fn
  self.afters = list
  return self
end)

-- The walk, in DFS order (literal, then :param, then *splat, going back
-- when a branch fails): returns the endpoint and fills caps[1..n] with the
-- captured segments, or nil. pos is where the next segment starts (after
-- a "/"). Recursive, so LuaJIT runs it in the interpreter: `greedy` below
-- answers first, and this runs only when greedy's single path failed.
local function walk(node, path, pos, len, caps, n)
  if pos > len then
    if node.ep then return node.ep, n end
    if node.splat then
      caps[n + 1] = ""
      return node.splat, n + 1
    end
    return nil
  end
  local j = find(path, "/", pos, true)
  local last = j and j - 1 or len
  local seg = sub(path, pos, last)
  local nextpos = last + 2
  local nx = node.lit[seg]
  if nx then
    local ep, m = walk(nx, path, nextpos, len, caps, n)
    if ep then return ep, m end
  end
  if node.param and last >= pos then
    caps[n + 1] = seg
    local ep, m = walk(node.param, path, nextpos, len, caps, n + 1)
    if ep then return ep, m end
  end
  if node.splat then
    caps[n + 1] = sub(path, pos)
    return node.splat, n + 1
  end
  return nil
end

-- The first path of that DFS, without going back: when it finds an
-- endpoint, it is the one the DFS finds first; nil means "ask walk". A
-- tail call per segment rather than a loop: LuaJIT aborts a trace that
-- starts in the request's functions and meets a loop ("inner loop in root
-- trace"), which left the whole request path interpreted.
local function greedy(node, path, pos, len, caps, n)
  if pos > len then
    local ep = node.ep
    if ep then return ep, n end
    ep = node.splat
    if ep then
      caps[n + 1] = ""
      return ep, n + 1
    end
    return nil
  end
  local j = find(path, "/", pos, true)
  local last = j and j - 1 or len
  local seg = sub(path, pos, last)
  local nx = node.lit[seg]
  if nx then return greedy(nx, path, last + 2, len, caps, n) end
  nx = node.param
  if nx and last >= pos then
    caps[n + 1] = seg
    return greedy(nx, path, last + 2, len, caps, n + 1)
  end
  nx = node.splat
  if nx then
    caps[n + 1] = sub(path, pos)
    return nx, n + 1
  end
  return nil
end

-- The Allow value of a path: its methods (GET brings HEAD; OPTIONS is
-- always answered), cached on the endpoint when one endpoint has the path.
local function allow_of(a, b)
  if a and not b and a.allow then return a.allow end
  if b and not a and b.allow then return b.allow end
  local set = { OPTIONS = true }
  for _, ep in pairs({ a or false, b or false }) do
    if ep then
      for m in pairs(ep.methods) do set[m] = true end
      if ep.methods.GET then set.HEAD = true end
    end
  end
  local list = {}
  for m in pairs(set) do list[#list + 1] = m end
  sort(list)
  local v = concat(list, ", ")
  if not (a and b) then (a or b).allow = v end
  return v
end

local function pick(ep, method)
  return ep.methods[method] or (method == "HEAD" and ep.methods.GET) or ep.any
end

function Router:match(method, path)
  local p = strip(path)
  local sep = self.static[p]
  if sep then
    local fn = pick(sep, method)
    if fn then return fn, {}, sep.pattern end
  end
  -- a path with no static route, or whose static route lacks this method
  -- (GET /users/new static, DELETE /users/:id dynamic)
  local ep, n
  if byte(p, 1) == SLASH then
    local caps, len = self.caps, #p
    ep, n = greedy(self.root, p, 2, len, caps, 0)
    if not ep then ep, n = walk(self.root, p, 2, len, caps, 0) end
  end
  if ep then
    local fn = pick(ep, method)
    if fn then
      -- no loop for the usual one to three parameters (see greedy)
      local names, caps = ep.names, self.caps
      local params = tnew(0, n)
      if n > 0 then
        params[names[1]] = caps[1]
        if n > 1 then
          params[names[2]] = caps[2]
          if n > 2 then
            params[names[3]] = caps[3]
            if n > 3 then for i = 4, n do params[names[i]] = caps[i] end end
          end
        end
      end
      return fn, params, ep.pattern
    end
  end
  if not sep and not ep then return nil, 404 end
  return nil, 405, allow_of(sep, ep)
end

-- Routes one request: the route's handler, or the not-found or 405 answer.
local function route(self, req, res)
  local fn, params, allow = self:match(req.method, req.path)
  if fn then
    req.params = params
    -- on a match the third result is the pattern: req.route, the label
    -- of moonport_http_route_duration_seconds, timed from here by
    -- lua/moonport/http.lua when the server's module is loaded
    local mp = loaded.moonport
    if mp then req.route, req._t0 = allow, mp.now() end
    return fn(req, res)
  end
  if params == 404 then
    local nf = self.on_not_found
    if nf then return nf(req, res) end
    return res:status(404):header("Content-Type", "text/plain"):send("Not Found\n")
  end
  res:header("Allow", allow)
  if req.method == "OPTIONS" then return res:status(204):send() end
  local na = self.on_405
  if na then return na(req, res, allow) end
  return res:status(405):header("Content-Type", "text/plain"):send("Method Not Allowed\n")
end

-- Whether path is prefix or under it, without making a string (find
-- anchored by its start position: a plain compare at 1 only).
local function prefixed(path, prefix, n)
  return find(path, prefix, 1, true) == 1 and (#path == n or byte(path, n + 1) == SLASH)
end

-- One middleware linked to the rest of the chain (nxt): it runs, and
-- unless it answered the request goes on to nxt.
local function link(m, nxt)
  local fn, prefix = m.fn, m.prefix -- prefix nil: every path
  if not prefix then
    return function(self, req, res)
      fn(req, res)
      if sent(res) then return end
      return nxt(self, req, res)
    end
  end
  local n = #prefix
  return function(self, req, res)
    if prefixed(req.path, prefix, n) then
      fn(req, res)
      if sent(res) then return end
    end
    return nxt(self, req, res)
  end
end

-- Middleware in order, then the route, unless one answers. The list is
-- linked into a chain of closures once (each calls its own middleware
-- and the next link), so the JIT compiles a request's way through them
-- as one straight trace: a loop over the list would call a different
-- function at each turn and leave its trace at every one.
local function chain(self, req, res)
  local run = self.run_mw
  if not run then
    run = route
    local mw = self.mw
    if mw then
      for i = #mw, 1, -1 do run = link(mw[i], run) end
    end
    self.run_mw = run
  end
  return run(self, req, res)
end

local log -- mp.log, found on first use (the router also runs without a server)
local function log_error(req, msg)
  log = log or require("moonport").log
  log("error", "mp.router: " .. tostring(req.method) .. " " .. tostring(req.target) ..
    (req.id and (" [" .. req.id .. "]") or "") .. ": " .. tostring(msg))
end

-- The full path (on_error, after hooks, around the middleware and the
-- route): only a router that has some takes it; one with middleware only
-- runs `chain`, and a plain one `route`, so each costs only what it uses.
local function full(self, req, res)
  local ok, err = xpcall(chain, traceback, self, req, res)
  if not ok and self.on_err and not res:sent() then
    -- answered by on_error: logged here; otherwise the server's 500 logs it
    local ok2, err2 = xpcall(self.on_err, traceback, req, res, err)
    if ok2 and res:sent() then
      log_error(req, err)
      ok, err = true, nil
    elseif not ok2 then
      log_error(req, err)
      err = err2
    end
  end
  local afters = self.afters
  if afters then
    for i = 1, #afters do
      local ok3, e = xpcall(afters[i], traceback, req, res)
      if not ok3 then log_error(req, e) end
    end
  end
  if not ok then error(err, 0) end
end

-- r(req, res): route one request (this is what on_request = r calls).
function Router:__call(req, res)
  if self.on_err or self.afters then return full(self, req, res) end
  if self.mw then return chain(self, req, res) end
  return route(self, req, res)
end

-- r:handler(): a plain function that routes (for APIs that want one).
function Router:handler()
  return function(req, res) return self(req, res) end
end

function M.new()
  -- caps: scratch for the walk (one router runs on one lane, one walk at
  -- a time: the walk never yields)
  return setmetatable({ static = {}, root = new_node(), caps = {},
    on_not_found = nil }, Router)
end

return M
